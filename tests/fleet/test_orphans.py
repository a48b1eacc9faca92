"""Jobs changed on a live fleet: removed, renamed, rescheduled on part of it.

The pure part (who judges an expired lease) on views built by hand; the
promises with real sidecars, a real nats-server and an app that records every
request: a job removed from the whole fleet while its run holds a lease, its
overlap lock is held, a retry is due and it is paused has its killed run
recorded lost once, keeps its pause, due attempt and health (the fleet never
removes them: tests/fleet/test_intent_kept.py) until `forget` removes them,
which it refuses while a live instance runs the job; `status` shows the
drift; a schedule changed on half the fleet runs no slot twice.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nats
from nats.js.errors import KeyNotFoundError

from sidecar.fleet.orphans import Orphans, job_of, run_by
from sidecar.store.digests import runs_job
from sidecar.store.state import Entry, Removal, View
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    bucket_keys,
    job,
    read_stream,
    run_cli,
    sidecars,
    wait_for,
    write_config,
)

# ------------------------------------------------------------------ pure


def view_of(keys: dict[str, dict[str, Any]]) -> View:
    view = View(keys={k: Entry(v, i + 1) for i, (k, v) in enumerate(keys.items())})
    view.synced = True
    return view


def test_key_kinds_and_who_runs_what() -> None:
    keys = ("paused.a", "due.a.1.2", "run.a.1", "lock.a", "health.a", "skip.a", "since.a")
    assert [job_of(k) for k in keys] == ["a"] * len(keys)
    assert [job_of(k) for k in ("backfill.a", "actions.a", "instance.a", "event.a.r.e")] == [
        "a",
        "a",
        None,
        None,
    ]
    instances = {"x": {"jobs": {"a": "h", "b": "h"}}, "y": {"jobs": {"b": "h"}}, "z": {}}
    assert run_by(instances) == {"a": ["x"], "b": ["x", "y"]}


def test_an_expired_lease_of_a_foreign_job_is_judged_only_when_nobody_else_runs_it() -> None:
    view = view_of(
        {
            "instance.me": {"jobs": {"keep": "h"}},
            "instance.holder": {"jobs": {"gone": "h"}},
        }
    )
    o = Orphans(view)
    lease = Removal("run.gone.1000", Entry({"instance": "holder"}, 7), "PURGE", 1.0)
    assert o.judges(lease)  # only its holder, which stopped renewing, runs it
    view.apply("instance.other", b'{"jobs": {"gone": "h"}}', 8, False)
    assert not o.judges(lease)  # "other" runs it and judges it
    # The presences are read from the view once per change of them, not once per
    # lease: a sidecar restarted mid-burst judges thousands of them.
    instances, reads = view.instances, 0

    def counted() -> dict[str, dict[str, Any]]:
        nonlocal reads
        reads += 1
        return instances()

    view.instances = counted  # type: ignore[method-assign]
    leases = [
        Removal(f"run.t{i}.1000", Entry({"instance": "holder"}, 7), "PURGE", 1.0)
        for i in range(100)
    ]
    assert [o.judges(r) for r in leases] == [True] * 100
    assert reads == 0
    view.apply("instance.other", b'{"jobs": {"gone": "h", "t5": "h"}}', 9, False)
    assert [o.judges(r) for r in leases[4:7]] == [True, False, True]
    assert reads == 1
    view.instances = instances  # type: ignore[method-assign]
    # A job of the state bucket is run by every instance that runs a set of them.
    view.apply("job.t6", b'{"schedule": "* * * * *"}', 10, False)
    assert o.judges(leases[6])
    view.apply(
        "instance.other",
        b'{"jobs": {"gone": "h"}, "bucket_jobs": {"count": 1, "set_hash": "s"}}',
        11,
        False,
    )
    assert not o.judges(leases[6]) and o.judges(leases[7])
    view.synced = False
    assert not o.judges(Removal("lock.x", Entry({}, 9), "PURGE", 1.0))


# ------------------------------------------------------------------ with sidecars

TTL = "2s"


async def live_keys(url: str, bucket: str = "CRON_STATE") -> list[str]:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        return await bucket_keys(kv)
    finally:
        await nc.close()


async def present(url: str, keys: list[str], bucket: str = "CRON_STATE") -> list[bool]:
    """Whether each key holds a value now (read one by one, not by a listing)."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        out = []
        for key in keys:
            try:
                await kv.get(key)
                out.append(True)
            except KeyNotFoundError:  # also KeyDeletedError: a delete marker
                out.append(False)
        return out
    finally:
        await nc.close()


def keys_now(url: str) -> list[str]:
    return asyncio.run(live_keys(url))


def test_jobs_removed_from_the_fleet_while_running_retrying_locked_and_paused(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.delay["/jobs/long"] = 60.0  # holds lock.long
    http_app.delay["/jobs/held"] = 60.0  # holds run.held.<slot>
    http_app.status["/jobs/flaky"] = 500  # makes attempt 2 due in a minute
    removed = {"long", "held", "flaky", "quiet"}
    common = {
        "nats": {"servers": [nats_server.url], "lease_ttl": TTL},
        "target": {"url": http_app.url, "timeout": "90s"},
    }
    before = {
        **common,
        "jobs": [
            job("keep"),
            job("long", overlap="skip"),
            job("held", schedule="*/10 * * * * *"),
            job(
                "flaky",
                schedule="*/10 * * * * *",
                retry={"max": 1, "backoff": "60s"},
                pause_after=5,  # so its failures are counted in health.flaky
            ),
            job("quiet"),
        ],
    }
    after = {**common, "jobs": [job("keep")]}
    cli_before = str(write_config(tmp_path / "before.yaml", {"instance_id": "cli", **before}))
    cli_after = str(write_config(tmp_path / "after.yaml", {"instance_id": "cli", **after}))
    assert run_cli("pause", "quiet", "-c", cli_before, "--reason", "test").returncode == 0

    def has(prefix: str) -> bool:
        return any(k.startswith(prefix) for k in keys_now(nats_server.url))

    def status(path: str) -> dict[str, Any]:
        res = run_cli("status", "-c", path, "--json")
        assert res.returncode == 0, res.stderr
        return dict(json.loads(res.stdout))

    with sidecars(tmp_path, [("old-1", before, {})]) as (old,):
        for prefix in ("lock.long", "run.held.", "due.flaky.", "paused.quiet"):
            wait_for(lambda p=prefix: has(p), 30, interval=0.2, what=f"a {prefix} key")
        new = Sidecar(tmp_path, "new-1", after, {}).start().wait_ready()
        try:
            # Drift, seen from the new config: the removed jobs run only on old-1.
            wait_for(lambda: len(status(cli_after)["instances"]) == 2, 20, what="both in status")
            view = status(cli_after)
            others = {j["name"]: j for j in view["other_jobs"]}
            assert set(others) == removed
            assert all(j["run_by"] == ["old-1"] for j in others.values())
            assert others["quiet"]["paused"] and others["long"]["running"]
            assert view["jobs"][0]["run_by"] == ["new-1", "old-1"]
            table = run_cli("status", "-c", cli_after).stdout
            assert "DRIFT: long is not in this config; run by old-1" in table, table
            seen_from_old = run_cli("status", "-c", cli_before).stdout
            assert "DRIFT: held is not run by new-1" in seen_from_old, seen_from_old
            # Nobody forgets a job a live instance runs, nor one of its own config.
            refused = run_cli("forget", "quiet", "-c", cli_after)
            assert refused.returncode == 1, refused
            assert "quiet is run by old-1 (live instances)" in refused.stderr
            refused = run_cli("forget", "keep", "-c", cli_after)
            assert refused.returncode == 2 and "a job of the config file" in refused.stderr
            # The runner of the removed jobs is killed while it holds their leases.
            running = {
                r.headers["X-Anarchon-Run-Id"]: r
                for path in ("/jobs/long", "/jobs/held")
                for r in http_app.requests_for(path)
                if not r.finished
            }
            assert {r.path for r in running.values()} == {"/jobs/long", "/jobs/held"}
            assert old.proc is not None
            old.proc.send_signal(signal.SIGKILL)
            killed_at = time.time()
            old.proc.wait(10)
            # Leases go within lease_ttl (and the marker's own delay).
            wait_for(
                lambda: not has("lock.") and not has("run."), 5, interval=0.1, what="leases gone"
            )
            assert time.time() - killed_at <= 2.0 + 3.0

            def lost() -> list[dict[str, Any]]:
                return [
                    m.data
                    for m in read_stream(nats_server.url)
                    if m.subject.endswith(".results") and m.data.get("status") == "lost"
                ]

            wait_for(
                lambda: {r["token"] for r in lost()} >= set(running),
                10,
                interval=0.2,
                what="the killed runs recorded lost",
            )
            # Pause, due attempt and health: kept, nobody running the jobs or not
            # (the fleet never removes them), until `forget` once old-1's
            # presence is gone. nats-py's key listing is a watch that may end
            # early while the bucket is written (a partial list): the keys are
            # taken from a listing that has all three, then read one by one.
            held: list[str] = []

            def listed() -> bool:
                held[:] = [k for k in keys_now(nats_server.url) if job_of(k) in removed]
                return {k.split(".")[0] + "." + k.split(".")[1] for k in held} >= {
                    "paused.quiet",
                    "due.flaky",
                    "health.flaky",
                }

            wait_for(listed, 10, interval=0.2, what="the pause, due attempt and health listed")
            wait_for(
                lambda: [i["id"] for i in status(cli_after)["instances"]] == ["new-1"],
                15 + 5,
                interval=0.5,
                what="old-1's presence gone",
            )
            assert all(asyncio.run(present(nats_server.url, held))), held
            forgot = {name: run_cli("forget", name, "-c", cli_after) for name in sorted(removed)}
            assert forgot["quiet"].returncode == 0, forgot["quiet"].stderr
            assert forgot["quiet"].stdout == "quiet: forgotten: removed paused.quiet\n"
            assert forgot["flaky"].returncode == 0, forgot["flaky"].stderr
            assert "health.flaky" in forgot["flaky"].stdout
            assert "due.flaky." in forgot["flaky"].stdout
            for name in ("long", "held"):  # nothing of theirs was left but leases
                assert forgot[name].returncode in (0, 1), forgot[name].stderr
            assert not any(asyncio.run(present(nats_server.url, held))), held
            time.sleep(2.0)
            left = keys_now(nats_server.url)
            after_view = status(cli_after)
        finally:
            new.terminate(30)
    # Exactly one lost record per killed run, judged by the sidecar without the jobs.
    records = lost()
    assert sorted(r["token"] for r in records) == sorted(running), records
    assert all("recorded by new-1" in r["error"] for r in records)
    assert Counter(r["job"] for r in records) == Counter(
        r.path.rsplit("/", 1)[1] for r in running.values()
    )
    # Nothing of the removed jobs is left; nothing of theirs ran after the kill.
    assert [k for k in left if job_of(k) in removed] == [], left
    late = [r for r in http_app.requests if r.at > killed_at and r.path != "/jobs/keep"]
    assert late == [], [(r.path, r.headers.get("X-Anarchon-Attempt")) for r in late]
    assert after_view["other_jobs"] == []
    assert [i["id"] for i in after_view["instances"]] == ["new-1"]
    assert "state bucket: removed" not in new.log(), new.log()


def test_a_schedule_changed_on_half_the_fleet_runs_no_slot_twice(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    def config(schedule: str) -> dict[str, Any]:
        return {
            "nats": {"servers": [nats_server.url], "lease_ttl": TTL},
            "target": {"url": http_app.url},
            "jobs": [job("tick", schedule=schedule)],
        }

    every, even = config("* * * * * *"), config("*/2 * * * * *")
    cli = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **every}))
    fleet = [("a1", every, {}), ("a2", every, {}), ("b1", even, {}), ("b2", even, {})]
    with sidecars(tmp_path, fleet):
        wait_for(lambda: len(http_app.requests_for("/jobs/tick")) >= 10, 30, what="10 runs")
        res = run_cli("status", "-c", cli, "--json")
    view = json.loads(res.stdout)
    assert view["config_mismatch"] and view["mismatched_jobs"] == ["tick"]
    slots = Counter(int(r.headers["X-Anarchon-Slot"]) for r in http_app.requests_for("/jobs/tick"))
    assert max(slots.values()) == 1, slots
    # Odd seconds are slots of the old schedule only: run by its instances only.
    for r in http_app.requests_for("/jobs/tick"):
        if int(r.headers["X-Anarchon-Slot"]) // 1000 % 2:
            assert r.headers["X-Anarchon-Instance"] in ("a1", "a2")
    assert any(s // 1000 % 2 == 0 for s in slots) and any(s // 1000 % 2 for s in slots)


def test_the_jobs_of_the_state_bucket_are_run_by_instances_with_a_set_of_them() -> None:
    """A presence lists the file's jobs one by one and the bucket's as one entry: the
    bucket's jobs (its ``job.`` keys) are run by every instance with such an entry."""
    with_set = {"jobs": {"a": "h"}, "bucket_jobs": {"count": 1, "hash": "x"}}
    without = {"jobs": {"a": "h"}}
    instances = {"i1": with_set, "i2": without}
    assert [runs_job(with_set, "dyn", True), runs_job(without, "dyn", True)] == [True, False]
    assert not runs_job(with_set, "dyn", False)  # no job.dyn key: not a bucket job
    assert run_by(instances, {"dyn"}) == {"a": ["i1", "i2"], "dyn": ["i1"]}
    assert run_by(instances) == {"a": ["i1", "i2"]}
