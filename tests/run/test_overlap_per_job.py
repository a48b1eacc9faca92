"""The overlap part's work and memory per job stay per job: a replacer waiting for a
job's lock to go is woken by a change of that lock only (sidecar/run/stoprequests.py:
one event for all of them woke every replacer of every job at each lock change, and
a burst of `replace` jobs is thousands of both), and only a `buffer_one` job's lock
holders are remembered (sidecar/run/keptslots.py: a kept slot is never one of them).

Real nats-server: the lock changes are real keys of the state bucket, delivered by
the sidecar's own watch.
"""

from __future__ import annotations

import asyncio
import json

from sidecar.config.load import parse_config
from tests.run.test_job_life import running
from tests.support import MakeJobs, NatsServer, job, until


async def test_a_lock_change_wakes_the_replacers_of_its_own_job_only(
    make_jobs: MakeJobs, nats_server: NatsServer
) -> None:
    names = [f"r{i}" for i in range(20)]
    config = parse_config(
        {
            "instance_id": "a",
            "nats": {"servers": [nats_server.url]},
            "target": {"url": "http://127.0.0.1:9"},
            "jobs": [
                job(name, schedule="0 0 1 1 *", overlap="replace", max_late="10s") for name in names
            ],
        },
        {},
    )
    async with make_jobs(config) as jobs, running(jobs):
        assert jobs.overlap is not None and jobs.fleet.bucket is not None
        stops, kv = jobs.overlap.stops, jobs.fleet.bucket.kv
        waiting = {name: asyncio.create_task(stops._lock_may_have_gone(name, 30)) for name in names}
        await asyncio.sleep(0.1)
        assert not any(task.done() for task in waiting.values())
        await kv.put("lock.r3", json.dumps({"token": "t", "slot": 1}).encode())
        await asyncio.wait_for(waiting.pop("r3"), 10)  # woken by its lock
        await asyncio.sleep(0.3)
        assert not any(task.done() for task in waiting.values())  # the others were not
        await kv.delete("lock.r3")
        await asyncio.sleep(0.3)
        assert not any(task.done() for task in waiting.values())
        stops.resynced()  # a re-read of the bucket: every replacer looks again
        await asyncio.wait_for(asyncio.gather(*waiting.values()), 10)
        assert not stops._lock_waiters  # nothing kept for jobs nobody waits on


async def test_only_the_lock_holders_of_buffer_one_jobs_are_remembered(
    make_jobs: MakeJobs, nats_server: NatsServer
) -> None:
    jobs_ = [
        job(name, schedule="0 0 1 1 *", overlap=overlap)
        for name, overlap in (("s", "skip"), ("b", "buffer_one"))
    ]
    config = parse_config(
        {
            "instance_id": "a",
            "nats": {"servers": [nats_server.url]},
            "target": {"url": "http://127.0.0.1:9"},
            "jobs": jobs_,
        },
        {},
    )
    async with make_jobs(config) as jobs, running(jobs):
        overlap, bucket = jobs.overlap, jobs.fleet.bucket
        assert overlap is not None and bucket is not None
        for name in ("s", "b"):
            value = json.dumps({"token": f"t-{name}", "slot": 1}).encode()
            await bucket.kv.put(f"lock.{name}", value)
        await until(lambda: "t-b" in overlap.kept._holders.get("b", ()), 10, "b's holder")
        # A skip job's lock holders would be up to 16 tokens kept for every such job.
        assert set(overlap.kept._holders) == {"b"}
        # A job of the state bucket that becomes buffer_one while a run of it holds its
        # lock: that run is never a kept slot's, though claimed under another policy.
        value = json.dumps({"token": "t-n", "slot": 1}).encode()
        await bucket.kv.put("lock.n", value)
        await until(lambda: "lock.n" in jobs.fleet.view.keys, 10, "n's lock in the view")
        as_skip, as_buffer = (
            parse_config(
                {"target": {"url": "http://127.0.0.1:9"}, "jobs": [job("n", overlap=overlap)]},
                {},
            ).jobs[0]
            for overlap in ("skip", "buffer_one")
        )
        jobs.ctx.jobs.put([as_skip])
        assert "n" not in overlap.kept._holders
        jobs.ctx.jobs.put([as_buffer])
        assert list(overlap.kept._holders["n"]) == ["t-n"]
        jobs.ctx.jobs.put([as_skip])  # another policy again: not kept
        assert "n" not in overlap.kept._holders
        jobs.ctx.jobs.put([as_buffer])
        jobs.ctx.jobs.remove(["n"])  # removed: not kept
        assert set(overlap.kept._holders) == {"b"}
