"""Chains on the wire: three real sidecar processes on a real nats-server and a
real HTTP app. A job ``after`` another runs exactly once per run of it that ended
as it says, with trigger ``after`` and that run's id in ``X-Anarchon-After-Run``;
a retried run fires it once; and it still runs when the sidecar that recorded
the run it follows is killed the moment after (sidecar/run/chains.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.admin.test_page import request, row_of
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    StoredMsg,
    base,
    cli_config,
    job,
    results,
    run_cli,
    sidecars,
    wait_for,
)

EVERY_2S = "*/2 * * * * *"
LINKS = "anarchon_chain_links_total"


def after(name: str, other: str, on: str) -> dict[str, Any]:
    return {"name": name, "after": {"job": other, "on": on}, "jitter": "200ms", "max_late": "3s"}


def runs_of(url: str, name: str) -> list[StoredMsg]:
    return [m for m in results(url, name) if m.data.get("status") != "skipped"]


def followers(app: RecordingApp, name: str) -> Counter[str]:
    """How many requests of job `name` came per run it followed."""
    got = app.requests_for(f"/jobs/{name}")
    for r in got:
        assert r.headers["X-Anarchon-Trigger"] == "after", r.headers
    return Counter(r.headers["X-Anarchon-After-Run"] for r in got)


def settled(
    url: str,
    name: str,
    app: RecordingApp,
    follower: str,
    count: int,
    retried: bool = False,
    cont: Sequence[Sidecar] = (),
) -> bool:
    """`count` runs of `name` recorded and each followed by `follower` (`retried`:
    its succeeded runs only, the last words of a slot whose first attempt failed;
    `cont`: sidecars to wake when they stopped themselves at a failpoint)."""
    for p in cont:
        if stopped(p) and p.proc is not None:
            os.kill(p.proc.pid, signal.SIGCONT)
    done = [m for m in runs_of(url, name) if m.data["status"] == "succeeded" or not retried]
    return len(done) >= count and all(
        m.data["token"] in followers(app, follower) for m in done[:count]
    )


def test_a_job_after_a_succeeding_job_runs_once_per_run_with_its_run_id(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    jobs = [
        job("a", schedule=EVERY_2S),
        after("b", "a", "success"),
        after("c", "a", "failure"),
        after("d", "b", "always"),  # a chain of two
    ]
    config = base(nats_server, http_app, jobs)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: settled(nats_server.url, "a", http_app, "b", 4), 40, what="4 runs of a")
        wait_for(lambda: settled(nats_server.url, "b", http_app, "d", 4), 20, what="4 runs of b")
        # status, status --json and the page show the chain.
        cfg = cli_config(tmp_path, config)
        text = run_cli("status", "-c", cfg)
        assert text.returncode == 0, text.stderr
        assert "b: after a on success" in text.stdout and "d: after b on always" in text.stdout
        assert "ENDED" not in text.stdout
        shown = json.loads(run_cli("status", "-c", cfg, "--json").stdout)
        by_name = {j["name"]: j for j in shown["jobs"]}
        assert by_name["c"]["after"] == {"job": "a", "on": "failure"}
        assert by_name["c"]["chain"] == "after a on failure" and by_name["a"]["after"] is None
        assert by_name["b"]["ended"] is None and by_name["b"]["schedules"] == []
        assert "after a on success" in row_of(request(procs[0], "/")[2].decode(), "b")
    a_runs = {m.data["token"]: m.data for m in runs_of(nats_server.url, "a")}
    b = followers(http_app, "b")
    assert b and all(n == 1 for n in b.values()), b  # exactly once per run of a
    assert set(b) <= set(a_runs)
    assert not http_app.requests_for("/jobs/c")  # a never failed
    d = followers(http_app, "d")
    b_runs = {m.data["token"] for m in runs_of(nats_server.url, "b")}
    assert all(n == 1 for n in d.values()) and set(d) <= b_runs, d
    for r in http_app.requests_for("/jobs/b"):  # b's run takes a's slot as its own
        assert r.headers["X-Anarchon-Slot"] == str(
            a_runs[r.headers["X-Anarchon-After-Run"]]["slot"]
        )
    for m in runs_of(nats_server.url, "b"):
        assert m.data["trigger"] == "after" and m.data["status"] == "succeeded"


def test_a_job_after_a_failing_job_on_failure(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.status["/jobs/a"] = 500
    jobs = [job("a", schedule=EVERY_2S), after("f", "a", "failure"), after("s", "a", "success")]
    config = base(nats_server, http_app, jobs)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: settled(nats_server.url, "a", http_app, "f", 3), 40, what="3 runs of a")

        def links(name: str, outcome: str) -> float:
            labels = {"job": name, "outcome": outcome}
            return sum(p.metric(LINKS, labels) or 0 for p in procs)

        # Each link counted once for the fleet: f fired once per run it made, s's
        # links not fired once per failed run of a (by the sidecar that ran it).
        wait_for(
            lambda: links("f", "fired") == sum(followers(http_app, "f").values()) >= 3,
            20,
            what="f's fired links, summed over the fleet, one per run of f",
        )
        wait_for(
            lambda: 3 <= links("s", "not_fired") <= len(runs_of(nats_server.url, "a")),
            20,
            what="s's links not fired",
        )
        assert links("s", "fired") == 0 and links("f", "not_fired") == 0
    f = followers(http_app, "f")
    assert f and all(n == 1 for n in f.values()), f
    failed = {m.data["token"] for m in runs_of(nats_server.url, "a")}
    assert set(f) <= failed
    assert not http_app.requests_for("/jobs/s")


def test_a_retried_job_fires_its_followers_once_per_slot(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """retry.max 1: attempt 1 of the first slot fails, attempt 2 succeeds. ``on:
    success`` follows attempt 2 once; ``on: always`` follows the slot's last word
    once (not the failed attempt 1, which a retry follows); ``on: failure`` never."""
    http_app.status["/jobs/a"] = 500
    jobs = [
        job("a", schedule="*/4 * * * * *", retry={"max": 1, "backoff": "1s"}),
        after("ok", "a", "success"),
        after("all", "a", "always"),
        after("bad", "a", "failure"),
    ]
    config = base(nats_server, http_app, jobs)

    def attempts() -> list[StoredMsg]:
        return runs_of(nats_server.url, "a")

    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]):
        first = wait_for(lambda: next(iter(attempts()), None), 30, what="a's first attempt")
        http_app.status["/jobs/a"] = 200  # its retry succeeds
        slot = first.data["slot"]

        def retried() -> StoredMsg | None:
            return next((m for m in attempts() if m.data.get("attempt") == 2), None)

        second = wait_for(retried, 20, what="a's second attempt")
        wait_for(lambda: second.data["token"] in followers(http_app, "all"), 20, what="all")
        wait_for(lambda: second.data["token"] in followers(http_app, "ok"), 20, what="ok")
        wait_for(lambda: settled(nats_server.url, "a", http_app, "ok", 4, True), 40, what="3 more")
    assert first.data["status"] == "failed" and second.data["slot"] == slot
    for name in ("ok", "all"):
        got = followers(http_app, name)
        assert all(n == 1 for n in got.values()), (name, got)
        assert first.data["token"] not in got  # attempt 1 was not the slot's last word
        slots = Counter(
            r.headers["X-Anarchon-Slot"] for r in http_app.requests_for(f"/jobs/{name}")
        )
        assert all(n == 1 for n in slots.values()), (name, slots)
    assert not http_app.requests_for("/jobs/bad")


def stopped(proc: Sidecar) -> bool:
    assert proc.proc is not None
    try:
        with open(f"/proc/{proc.proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except FileNotFoundError:
        return False


def test_the_follower_runs_when_the_sidecar_that_recorded_the_run_is_killed(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Every sidecar stops itself right after it stored its first result (the
    ``record.published`` failpoint); one stopped there after a run of a is killed
    -9: the run of b after the run it recorded still happens, once, on another
    sidecar."""
    jobs = [job("a", schedule=EVERY_2S), after("b", "a", "success")]
    config = base(nats_server, http_app, jobs)
    env = {"ANARCHON_FAILPOINTS": "record.published=1*sigstop"}
    # Started without waiting to be ready: one may stop before the others are.
    procs = [Sidecar(tmp_path, f"s{i}", config, env).start() for i in range(3)]
    try:

        def stopped_after_a() -> tuple[Sidecar, StoredMsg] | None:
            """A sidecar stopped right after it stored a run of a, and that result. Not
            merely the first stopped: b follows within milliseconds, and its runner
            stops too (a loaded machine polled both stopped, and took b's)."""
            for m in runs_of(nats_server.url, "a"):
                for p in procs:
                    if p.name == m.data["instance"] and stopped(p):
                        return p, m
            return None

        victim, recorded = wait_for(stopped_after_a, 30, what="a stop after a run of a")
        victim.kill()  # SIGKILL while stopped, right after its result was stored
        token = recorded.data["token"]
        wait_for(lambda: token in followers(http_app, "b"), 20, what="b after the killed run")
        # The next runs go on (the others stop once too: let them go on).
        resume = [p for p in procs if p is not victim]
        wait_for(lambda: settled(nats_server.url, "a", http_app, "b", 3, cont=resume), 40)
    finally:
        for p in procs:
            if p.proc is not None and p.proc.poll() is None:
                os.kill(p.proc.pid, signal.SIGCONT)
                with contextlib.suppress(Exception):
                    p.terminate(30)
            p.kill()
    b = followers(http_app, "b")
    assert b[token] == 1, b
    assert all(n == 1 for n in b.values()), b
    runner = next(
        r for r in http_app.requests_for("/jobs/b") if r.headers["X-Anarchon-After-Run"] == token
    )
    assert runner.headers["X-Anarchon-Instance"] != victim.name


def test_the_follower_goes_on_after_the_nats_server_restarts(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """A restart of the nats-server loses the ordered consumers that follow a's results
    (ephemeral, in memory). nats-py makes them again from the last result seen; the
    request it makes must be one the server takes (a start time and a start sequence
    together are refused), else b never runs after a again on any sidecar."""
    jobs = [job("a", schedule=EVERY_2S), after("b", "a", "success")]
    config = base(nats_server, http_app, jobs)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        wait_for(lambda: settled(nats_server.url, "a", http_app, "b", 2), 40, what="2 runs of a")
        nats_server.stop()
        nats_server.start()
        restarted = time.time()

        def followed_after_restart() -> bool:
            b = followers(http_app, "b")
            return any(
                m.time > restarted + 1 and m.data["token"] in b
                for m in runs_of(nats_server.url, "a")
            )

        wait_for(followed_after_restart, 60, interval=0.5, what="b after a run of a since")
        for p in procs:
            assert "optional start time is also set" not in p.log(), p.log()
    b = followers(http_app, "b")
    assert all(n == 1 for n in b.values()), b
