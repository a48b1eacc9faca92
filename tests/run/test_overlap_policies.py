"""``overlap: replace`` and ``buffer_one`` (sidecar/run/overlap.py), with three real
sidecar processes, a real nats-server and a real app that records every request
and ends a run when it gets its cancel request (tests/support.py)."""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from sidecar.core.clock import parse_rfc3339
from tests.support import (
    NatsServer,
    RecordingApp,
    Request,
    Sidecar,
    job,
    results,
    run_cli,
    sidecars,
    slow_run,
    wait_for,
    write_config,
)


def base(url: str, app: RecordingApp, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nats": {"servers": [url], "lease_ttl": "2s"},
        "target": {"url": app.url, "timeout": "60s"},
        "jobs": jobs,
        "shutdown_grace": "2s",  # the run in flight at the end is cut off
    }


def total(procs: list[Sidecar], name: str, labels: dict[str, str]) -> float:
    return sum(p.metric(name, labels) or 0 for p in procs if p.proc and p.proc.poll() is None)


def runs(app: RecordingApp, path: str) -> list[Request]:
    """The trigger requests of `path` (not the cancel requests), in order of arrival."""
    return [r for r in app.requests_for(path) if "X-Anarchon-Cancel" not in r.headers]


def cancels(app: RecordingApp, path: str) -> list[Request]:
    return [r for r in app.requests_for(path) if "X-Anarchon-Cancel" in r.headers]


def slot_of(req: Request) -> int:
    return int(req.headers["X-Anarchon-Slot"])


def never_two_at_once(reqs: list[Request]) -> None:
    """Each run arrived after the one before it had its answer."""
    done = [r for r in reqs if r.finished]
    for before, after in itertools.pairwise(done):
        assert after.at >= before.finished - 0.005, (before, after)


def rep_job() -> dict[str, Any]:
    """A job every 3 s with `overlap: replace`, its cancel request given 1 s."""
    return job(
        "rep",
        schedule="*/3 * * * * *",
        max_late="2500ms",
        overlap="replace",
        cancel={"grace": "1s"},
    )


def test_replace_stops_the_running_run_through_its_app_and_runs_the_new_slot(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = "/jobs/rep"
    http_app.delay[path] = 60.0  # never ends by itself: only a cancel ends it
    rep = rep_job()
    config = base(nats_server.url, http_app, [rep])
    cfg = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))
    checked = run_cli("check", "-c", cfg)
    assert checked.returncode == 0, checked.stderr
    assert "overlap replace: a new slot stops the running run (DELETE" in checked.stdout
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: len(cancels(http_app, path)) >= 3, 40, what="three cancel requests")
        wait_for(lambda: len(runs(http_app, path)) >= 4, 20, what="a fourth run")
        status = run_cli("status", "-c", cfg).stdout
        replaced = total(procs, "anarchon_runs_replaced_total", {"job": "rep"})
        # Before the sidecars stop: the drain cuts the last run off (no cancel request),
        # and the app goes on with it while a sidecar still up may start the next one.
        in_flight = http_app.max_in_flight[path]
        started = runs(http_app, path)
        asked = cancels(http_app, path)
    assert "rep: overlap replace" in status
    by_token = {r.headers["X-Anarchon-Run-Id"]: r for r in started}
    # Never two runs at once, at the app.
    assert in_flight == 1
    never_two_at_once(started)
    # Each slot ran once; each cancel named a run that had started, which then ended
    # (answered 409 by the app), before the next run arrived.
    per_slot = Counter(slot_of(r) for r in runs(http_app, path))
    assert max(per_slot.values()) == 1, per_slot
    gaps: list[float] = []
    for cancel in asked:
        assert cancel.method == "DELETE"
        run = by_token[cancel.headers["X-Anarchon-Cancel"]]
        assert cancel.headers["X-Anarchon-Run-Id"] == run.headers["X-Anarchon-Run-Id"]
        assert run.at < cancel.at and run.finished >= cancel.at
        later = [r for r in started if r.at > run.at]
        if later:
            assert later[0].at >= run.finished - 0.005
            assert later[0].at - cancel.at < 1.5  # the new slot ran at once
            gaps.append(later[0].at - cancel.at)
    print(f"replace: cancel request -> new run {min(gaps):.3f}..{max(gaps):.3f}s")
    # The replaced runs are recorded failed, error replaced, and not retried.
    stored = [m.data for m in results(nats_server.url, "rep")]
    failed = [
        r
        for r in stored
        if r["status"] == "failed" and not r["error"].startswith("interrupted")  # the last one
    ]
    assert len(failed) >= 3
    assert all(r["error"].startswith("replaced: stopped for slot") for r in failed), [
        r["error"] for r in failed
    ]
    assert all(r["http_status"] == 409 for r in failed)
    assert all(r.get("attempt", 1) == 1 for r in stored)
    assert all(int(r.headers["X-Anarchon-Attempt"]) == 1 for r in started)
    assert replaced >= 3


def history(cfg: str, name: str) -> dict[str, dict[str, Any]]:
    """`history NAME --json` as a user reads it, by run token."""
    res = run_cli("history", name, "-c", cfg, "--json", "--limit", "1000")
    assert res.returncode == 0, res.stderr
    return {run["token"]: run for run in map(json.loads, res.stdout.splitlines())}


def assert_times(run: dict[str, Any], sent: Request, cut: float, slack: float) -> None:
    """`run` (history) started when the app got `sent` and ran until `cut` (give or
    take `slack` later): not from the moment it was asked to stop."""
    started = parse_rfc3339(run["started_at"])
    finished = parse_rfc3339(run["finished_at"])
    assert sent.at - 0.5 <= started <= sent.at + 0.01, (run, sent.at)
    assert cut - 0.25 <= finished <= cut + slack, (run, cut)
    assert abs(run["duration_ms"] - (finished - started) * 1000) <= 2, run
    assert run["duration_ms"] >= (cut - sent.at - 0.25) * 1000, (run, sent.at, cut)


def test_a_run_cut_off_by_replace_or_by_sigterm_keeps_its_true_start_and_duration(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """An app that goes on after the cancel request: the run is cut off when
    cancel.grace ends; recorded from when its request went out to that cut, as is
    the run the sidecar's own SIGTERM drain cuts off (docs/CONFIG.md, overlap)."""
    path = "/jobs/rep"
    http_app.delay[path] = 60.0
    http_app.ignore_cancel = True  # only the sidecar's closing of the connection ends a run
    grace, shutdown_grace = 1.0, 2.0
    config = base(nats_server.url, http_app, [rep_job()])
    cfg = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))
    with sidecars(tmp_path, [("only", config, {})]) as (proc,):

        def replaced() -> list[dict[str, Any]]:
            return [r for r in history(cfg, "rep").values() if r["status"] == "failed"]

        wait_for(lambda: len(replaced()) >= 2, 40, what="two runs replaced")
        asked = cancels(http_app, path)
        # SIGTERM once the next run has reached the app: the drain cuts it off.
        last: Request = wait_for(
            lambda: next((r for r in runs(http_app, path) if r.at > asked[-1].at + 0.5), None),
            10,
            what="a run after the last cancel",
        )
        assert proc.proc is not None
        signalled_at = time.time()
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(30) == 0, proc.log()
    by_token = {r.headers["X-Anarchon-Run-Id"]: r for r in runs(http_app, path)}
    ran = history(cfg, "rep")
    cut_by_replace = [r for r in ran.values() if (r["error"] or "").startswith("replaced")]
    assert len(cut_by_replace) >= 2, ran
    for run in cut_by_replace:
        assert "no answer within cancel.grace 1s" in run["error"], run
        sent = by_token[run["token"]]
        [cancel] = [c for c in asked if c.headers["X-Anarchon-Cancel"] == run["token"]]
        # Cut off when cancel.grace ended, counted from just before the cancel went out.
        assert_times(run, sent, cancel.at + grace, 0.5)
    drained = ran[last.headers["X-Anarchon-Run-Id"]]
    assert drained["status"] == "failed" and "interrupted" in drained["error"], drained
    assert_times(drained, last, signalled_at + shutdown_grace, 2.0)


def test_buffer_one_runs_one_kept_slot_right_after_the_long_run_and_skips_the_others(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = "/jobs/buf"
    http_app.delay[path] = 3.5
    config = base(nats_server.url, http_app, [job("buf", overlap="buffer_one")])
    cfg = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(
            lambda: sum(1 for r in runs(http_app, path) if r.finished) >= 4,
            40,
            what="four finished runs",
        )
        wait_for(
            lambda: "slot " in run_cli("status", "-c", cfg).stdout.split("overlap buffer_one")[-1],
            20,
            what="status shows the kept slot",
        )
        buffered = total(procs, "anarchon_runs_buffered_total", {"job": "buf"})
        skipped = total(procs, "anarchon_runs_skipped_total", {"job": "buf", "reason": "overlap"})
        in_flight = http_app.max_in_flight[path]  # before the drain cuts the last run off
        started = runs(http_app, path)
    assert in_flight == 1
    never_two_at_once(started)
    assert max(Counter(slot_of(r) for r in started).values()) == 1
    kept = [r for r in started if r.headers.get("X-Anarchon-Buffered") == "true"]
    assert len(kept) >= 3
    waits: list[float] = []
    for run in kept:
        before = [r for r in started if r.at < run.at]
        waits.append(run.at - before[-1].finished)
        # Right after the run it fell during, and late by its nature.
        assert run.at - before[-1].finished < 1.0, (before[-1], run)
        assert run.at - slot_of(run) / 1000 > 1.0
        assert run.headers["X-Anarchon-Trigger"] == "scheduled"
    print(f"buffer_one: run ended -> kept run {min(waits):.3f}..{max(waits):.3f}s")
    stored = [m.data for m in results(nats_server.url, "buf")]
    skips = [r for r in stored if r["status"] == "skipped"]
    assert skips and all(r["error"].startswith("overlap") for r in skips)
    ran = {slot_of(r) for r in started}
    assert not ran & {r["slot"] for r in skips}
    # Each run, kept ones included, has exactly one result under its own token.
    tokens = Counter(r["token"] for r in stored if r["status"] == "succeeded")
    assert max(tokens.values()) == 1
    assert buffered >= 3 and skipped >= 2


def test_buffer_one_after_the_runners_sidecar_is_killed_runs_the_kept_slot_once(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = "/jobs/bk"
    config = base(nats_server.url, http_app, [job("bk", overlap="buffer_one")])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        first, runner = slow_run(http_app, procs, path, 30.0)
        wait_for(
            lambda: total(procs, "anarchon_runs_buffered_total", {"job": "bk"}) >= 1,
            10,
            what="a slot kept during the slow run",
        )
        runner.kill()
        killed_at = time.time()
        http_app.delay[path] = 0.2
        survivors = [p for p in procs if p is not runner]
        kept: Request = wait_for(
            lambda: next(
                (r for r in runs(http_app, path) if r.headers.get("X-Anarchon-Buffered")), None
            ),
            15,
            what="the kept slot run by a survivor",
        )
        wait_for(
            lambda: len([r for r in runs(http_app, path) if r.at > kept.at + 2]) >= 1,
            15,
            what="runs after the kept one",
        )
    started = runs(http_app, path)
    # No slot ran twice; the kept one ran once, on a survivor, after the lock expired.
    assert max(Counter(slot_of(r) for r in started).values()) == 1
    assert kept.headers["X-Anarchon-Instance"] in {p.name for p in survivors}
    assert kept.at > killed_at
    assert slot_of(kept) < kept.at * 1000 - 1000
    stored = [m.data for m in results(nats_server.url, "bk")]
    lost = [r for r in stored if r["status"] == "lost"]
    assert [r["token"] for r in lost] == [first.headers["X-Anarchon-Run-Id"]]
    assert Counter(r["token"] for r in stored)[kept.headers["X-Anarchon-Run-Id"]] == 1
    # While the dead runner's lock lived, no request went out.
    after = [r for r in started if r.at > killed_at]
    assert min(r.at for r in after) >= first.at
    assert all(r.headers["X-Anarchon-Instance"] != runner.name for r in after)


def test_replace_when_the_runners_sidecar_is_killed_waits_for_its_lock_to_expire(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = "/jobs/rk"
    rk = job(
        "rk",
        schedule="*/4 * * * * *",
        max_late="3500ms",
        overlap="replace",
        cancel={"grace": "1s"},
    )
    config = base(nats_server.url, http_app, [rk])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        first, runner = slow_run(http_app, procs, path, 60.0)
        runner.kill()  # nobody is left to send its app the cancel request
        killed_at = time.time()
        http_app.delay[path] = 0.3
        wait_for(
            lambda: len([r for r in runs(http_app, path) if r.at > killed_at]) >= 2,
            30,
            what="two runs after the kill",
        )
        asked = cancels(http_app, path)
    started = runs(http_app, path)
    assert max(Counter(slot_of(r) for r in started).values()) == 1
    after = [r for r in started if r.at > killed_at]
    assert all(r.headers["X-Anarchon-Instance"] != runner.name for r in after)
    # The dead runner held lock.rk until it expired (lease_ttl 2s after its last
    # renewal): no run went out before.
    assert after[0].at - killed_at > 1.0
    assert first.headers["X-Anarchon-Run-Id"] not in {r.headers["X-Anarchon-Cancel"] for r in asked}
    stored = [m.data for m in results(nats_server.url, "rk")]
    lost = [r for r in stored if r["status"] == "lost"]
    assert [r["token"] for r in lost] == [first.headers["X-Anarchon-Run-Id"]]


def test_replace_on_a_job_added_at_run_time_to_sidecars_whose_file_has_none(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """The overlap part is made when the first job that needs it arrives from the
    state bucket (no job of the file has one): the lock, the cancel request and one
    run at a time hold for that job as for a file's."""
    path = "/jobs/rep"
    http_app.delay[path] = 60.0  # only a cancel ends a run
    config = base(nats_server.url, http_app, [job("keep", schedule="0 0 1 1 *")])
    cfg = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))
    rep = rep_job()
    rep_file = tmp_path / "rep.yaml"
    rep_file.write_text(yaml.safe_dump(rep))
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]):
        added = run_cli("job", "add", str(rep_file), "-c", cfg)
        assert added.returncode == 0, added.stderr
        wait_for(lambda: len(cancels(http_app, path)) >= 2, 40, what="two cancel requests")
        wait_for(lambda: len(runs(http_app, path)) >= 3, 20, what="a third run")
        in_flight = http_app.max_in_flight[path]
        started = runs(http_app, path)
        asked = cancels(http_app, path)
    assert in_flight == 1
    never_two_at_once(started)
    assert max(Counter(slot_of(r) for r in started).values()) == 1
    tokens = {r.headers["X-Anarchon-Run-Id"] for r in started}
    assert all(c.headers["X-Anarchon-Cancel"] in tokens for c in asked)
