"""A burst of run leases reaches only the listeners of their family (issue 49, the burst
at one instant; docs/PERFORMANCE.md "The burst"): every lease's create and delete
still reaches the listeners of every key (the claim window's) and the lost-run
judges, in the bucket's order; a listener of job keys hears none of them, and the
candidates keep no slots of a job without candidates."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest
from prometheus_client import CollectorRegistry

from sidecar.config.jobset import JobSet
from sidecar.config.load import parse_config
from sidecar.core.clock import Clock
from sidecar.fleet.candidates import Candidates
from sidecar.fleet.listeners import KeyListeners
from sidecar.fleet.member import Fleet
from sidecar.obs.metrics import Metrics
from sidecar.store.state import DELETED, Removal
from tests.support import MakeJobs, NatsServer, job, until

LEASES = 300  # more than nats-py's queue of 256 updates


def test_a_listener_hears_its_families_and_every_listener_the_full_read() -> None:
    listeners = KeyListeners()

    def every(key: str) -> None: ...
    def jobs(key: str) -> None: ...
    def runs(key: str) -> None: ...

    listeners.append(every)
    listeners.append(jobs, "job.")
    listeners.append(runs, "run.", "lock.")
    assert listeners.for_key("run.j.1") == [every, runs]
    assert listeners.for_key("lock.j") == [every, runs]
    assert listeners.for_key("job.j") == [every, jobs]
    assert listeners.for_key("due.j.1.2") == [every]
    assert listeners.for_key("") == [every, jobs, runs]  # a full re-read: all of them
    listeners.remove(jobs)
    assert listeners.for_key("job.j") == [every]
    assert jobs not in listeners and every in listeners and len(listeners) == 2
    with pytest.raises(ValueError, match="job"):
        listeners.append(jobs, "job")  # a family is a head with its dot
    with pytest.raises(ValueError, match="not a key listener"):
        listeners.remove(jobs)


async def test_a_burst_of_run_leases_reaches_who_listens_to_them_in_order(
    nats_server: NatsServer,
) -> None:
    job = {"schedule": "0 0 1 1 *"}
    cfg = parse_config(
        {
            "instance_id": "me",
            "nats": {"servers": nats_server.url},
            "jobs": [
                {"name": "plain", **job},
                {"name": "picky", **job, "claim": {"candidates": 1, "fallback": "1s"}},
            ],
        },
        {},
    )
    fleet = Fleet(cfg, Metrics(CollectorRegistry()), Clock(), jobs=JobSet(cfg.jobs))
    every: list[str] = []
    of_jobs: list[str] = []
    removed: list[Removal] = []
    fleet.key_listeners.append(every.append)
    fleet.key_listeners.append(of_jobs.append, "job.")
    fleet.removal_listeners.append(removed.append)

    async def never(*_: object) -> None: ...

    async def sleep_until(wall: float) -> bool:
        return False

    spawned: list[object] = []
    candidates = Candidates("me", fleet.metrics, Clock(), fleet, spawned.append, sleep_until, never)
    nc = await nats.connect(nats_server.url)
    try:
        fleet.start(nc.jetstream())
        await until(lambda: fleet.view.synced and fleet.leases_ok, 20, "the bucket read")
        bucket = fleet.bucket
        assert bucket is not None
        every.clear()
        of_jobs.clear()
        # A burst: each run's lease made and deleted, many at once (the watch's
        # updates arrive in batches behind each other).
        keys = [f"run.{name}.{1000 * i}" for i in range(LEASES) for name in ("plain", "picky")]
        lease = json.dumps({"fence": "1", "token": "t"}).encode()
        await asyncio.gather(*(bucket.kv.put(key, lease) for key in keys))
        await asyncio.gather(*(bucket.kv.delete(key) for key in keys))
        await bucket.kv.put("job.tenant", json.dumps({"schedule": "@daily"}).encode())
        await until(lambda: "job.tenant" in every, 20, "the burst delivered")
        # Who listens to every key heard every create and every delete, in the
        # bucket's order: each key's create before its delete.
        runs = [k for k in every if k.startswith("run.")]
        assert sorted(runs) == sorted(keys + keys)
        for key in keys:
            first = runs.index(key)
            assert key in runs[first + 1 :], key
        assert sorted(r.key for r in removed if r.key.startswith("run.")) == sorted(keys)
        assert {r.how for r in removed if r.key.startswith("run.")} == {DELETED}
        # The job keys' listener heard its key alone.
        assert of_jobs == ["job.tenant"]
        # The candidates keep the slots of the job that has them, of no other.
        assert all(candidates.was_run("picky", 1000 * i) for i in range(LEASES))
        assert not any(candidates.was_run("plain", 1000 * i) for i in range(LEASES))
    finally:
        await fleet.stop()
        await nc.close()


async def test_a_run_lease_reaches_only_the_parts_that_use_run_leases(
    make_jobs: MakeJobs, nats_server: NatsServer
) -> None:
    # Every part a config can make that listens to keys: backfills and one-off runs
    # (their stand-ins), `replace` and `buffer_one`, `run_on: every`, the claim window,
    # the candidates. Each is told only of the keys it acts on (sidecar/fleet/listeners.py).
    cfg = parse_config(
        {
            "instance_id": "me",
            "nats": {"servers": nats_server.url},
            "jobs": [
                job("plain", schedule="0 0 1 1 *"),
                job("swap", schedule="0 0 1 1 *", overlap="replace", max_late="10s"),
                job("kept", schedule="0 0 1 1 *", overlap="buffer_one"),
                job("each", schedule="0 0 1 1 *", run_on="every"),
            ],
        },
        {},
    )
    async with make_jobs(cfg) as jobs:
        listeners = jobs.fleet.key_listeners

        def told(key: str) -> set[str]:
            return {each.__qualname__ for each in listeners.for_key(key)}

        # A run lease, created and deleted by every run of a burst: two parts.
        assert told("run.plain.1000") == {"ClaimWindow.delivered", "Candidates.key_seen"}
        assert "Overlap.changed" in told("lock.swap")
        assert "Overlap.changed" in told("stop.swap")
        assert "Overlap.changed" in told("buffer.kept")
        assert "OnFirstKey.changed" in told("backfill.plain")
        assert "OnFirstKey.changed" in told("at.plain")
        assert "EveryMissed.changed" in told("instance.other")
        for family in ("job.", "due.", "paused.", "health."):
            assert not told(family + "plain") & {
                "Overlap.changed",
                "OnFirstKey.changed",
                "EveryMissed.changed",
            }
        # A full re-read still reaches them all.
        assert {"Overlap.changed", "OnFirstKey.changed", "EveryMissed.changed"} <= told("")
