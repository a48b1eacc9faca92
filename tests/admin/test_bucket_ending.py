"""A job of the state bucket whose walk's end is awaited beside the take-up round.

``BucketJobs`` ends the walk of a job changed or removed while that walk
handles a slot in a task of its own (``_ending``), and judges the job again
once the slot is handled (sidecar/admin/bucket_jobs.py). While that task is
pending: the sidecar stops, the bucket is re-read in full, the key is written
again several times, or the job goes beyond ``bucket_jobs.max_jobs``. Each
time: one walk of the job at most, the running set, the presence's hash and
the next-run gauge as the bucket says at the end.

In process, on the daemon's parts (``make_jobs``): the slot in hand is a real
walk's slot whose claim is slow.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sidecar.admin.bucket_jobs import BucketJobs
from sidecar.admin.jobcheck import judge
from sidecar.config.load import JobConfig
from sidecar.run.job_loop import Jobs
from sidecar.store.digests import BUCKET_SET, config_hash, job_hash
from sidecar.store.state import Removal
from tests.admin.test_bucket_takeup_loop import capped
from tests.support import MakeJobs, until

HELD = 1.5  # how long the slot in hand's claim takes


def every(name: str, seconds: int, jitter: str = "0s") -> bytes:
    schedule = f"*/{seconds} * * * * *"
    return json.dumps({"name": name, "schedule": schedule, "jitter": jitter}).encode()


class Slow:
    """`jobs.attempt` whose first claim of job `name` takes HELD seconds; every walk
    started and every slot attempted, per job."""

    def __init__(self, jobs: Jobs, name: str) -> None:
        self.name = name
        self.in_hand = asyncio.Event()
        self.attempted: list[tuple[str, int]] = []
        self.started: list[JobConfig] = []
        self.handling: dict[str, int] = {}
        self.most: dict[str, int] = {}
        attempt, start = jobs.attempt, jobs.start

        async def slow_claim(job: JobConfig, slot: int, *rest: Any, **kw: Any) -> None:
            n = job.name
            self.handling[n] = self.handling.get(n, 0) + 1
            self.most[n] = max(self.most.get(n, 0), self.handling[n])
            self.attempted.append((n, slot))
            try:
                if n == self.name and not self.in_hand.is_set():
                    self.in_hand.set()
                    await asyncio.sleep(HELD)
                    return
                await attempt(job, slot, *rest, **kw)
            finally:
                self.handling[n] -= 1

        def recording_start(job: JobConfig, resume: int | None = None) -> None:
            self.started.append(job)
            start(job, resume)

        jobs.attempt = slow_claim  # type: ignore[method-assign]
        jobs.start = recording_start  # type: ignore[method-assign]


@asynccontextmanager
async def ending(
    make_jobs: MakeJobs, cap: int, keys: dict[str, bytes], slow: str
) -> AsyncIterator[tuple[Jobs, BucketJobs, Slow]]:
    """A runner with `keys` taken up, job `slow`'s first slot in hand (its claim slow)."""
    config = capped(cap)
    async with make_jobs(config) as jobs:
        view = jobs.ctx.fleet.view
        for revision, (key, data) in enumerate(keys.items(), 1):
            view.apply(key, data, revision, False)
        view.synced = True
        jobs.ctx.guard.looked = True  # past the start: no slot waits for the first look
        probe = Slow(jobs, slow)
        runner = BucketJobs(config=config, metrics=jobs.metrics, fleet=jobs.ctx.fleet)
        runner.start(jobs)
        runner.changed("")
        await until(lambda: slow in runner.running, 10, what=f"{slow} taken up")
        await asyncio.wait_for(probe.in_hand.wait(), 10)
        try:
            yield jobs, runner, probe
        finally:
            await runner.stop()


def write(jobs: Jobs, runner: BucketJobs, key: str, data: bytes | None) -> None:
    """`job update` / `job remove` of `key`, as the watch delivers it."""
    view = jobs.ctx.fleet.view
    revision = view.last_revision + 1
    if data is None:
        gone = view.keys[key]
        view.apply(key, None, revision, True, "DEL")
        runner.removed(Removal(key, gone, "DEL", None))
    else:
        view.apply(key, data, revision, False)
        runner.changed(key)


def pending(runner: BucketJobs) -> bool:
    """Whether a walk's end is awaited (``BucketJobs._ending``)."""
    return any(not task.done() for task in runner._ending.values())


def presence_of(jobs: Jobs, wanted: dict[str, bytes]) -> dict[str, Any] | None:
    """The presence's entry for the set of `wanted` jobs, made from their values."""
    config = jobs.ctx.config
    hashes = {n: job_hash(judge(config, f"job.{n}", json.loads(v)).job) for n, v in wanted.items()}
    return {"count": len(hashes), "hash": config_hash(hashes)} if hashes else None


async def settled(runner: BucketJobs) -> None:
    """Until no walk's end is awaited and no round is due."""
    await until(lambda: not pending(runner) and not runner._wake.is_set(), 10, what="settled")


def next_run(jobs: Jobs, name: str) -> float | None:
    return jobs.metrics.registry.get_sample_value(
        "anarchon_job_next_run_timestamp_seconds", {"job": name}
    )


def one_walk_each(jobs: Jobs, probe: Slow) -> None:
    assert all(n <= 1 for n in probe.most.values()), (
        f"two walks handled a slot at once: {probe.most}"
    )
    counts: dict[str, int] = {}
    for name, slot in probe.attempted:
        counts[f"{name}@{slot}"] = counts.get(f"{name}@{slot}", 0) + 1
    assert max(counts.values(), default=1) == 1, f"a slot attempted twice: {counts}"


async def test_a_stop_while_a_walks_end_is_awaited_ends_its_task_at_once(
    make_jobs: MakeJobs,
) -> None:
    async with ending(make_jobs, 10, {"job.a": every("a", 1)}, "a") as (jobs, runner, probe):
        write(jobs, runner, "job.a", every("a", 2))
        await until(lambda: pending(runner), 5, what="a's end awaited")
        jobs.stopping.set()
        jobs.wake()
        began = time.monotonic()
        await runner.stop()
        took = time.monotonic() - began
        assert took < HELD / 2, f"stop took {took:.2f}s"  # before the fix: the claim's
        assert not runner.tasks
        # The drain still waits for the slot in hand (the daemon's `claiming`).
        loops = list(jobs.loops)
        assert loops, "the slot in hand's task was ended with the runner"
        done, left = await asyncio.wait(loops, timeout=HELD + 3)
        assert not left and all(not t.cancelled() and t.exception() is None for t in done)
        assert "a" not in jobs.timetable.walks
        assert [j.schedule.identity for j in probe.started] == ["*/1 * * * * *"]


async def test_a_key_written_again_and_reread_while_its_walks_end_is_awaited(
    make_jobs: MakeJobs,
) -> None:
    keys = {"job.a": every("a", 1), "job.b": every("b", 3)}
    async with ending(make_jobs, 10, keys, "a") as (jobs, runner, probe):
        for seconds in (2, 4, 5):
            write(jobs, runner, "job.a", every("a", seconds))
            await until(lambda: pending(runner), 5, what="a's end awaited")
            runner.changed("")  # a full re-read meanwhile
            await asyncio.sleep(0.05)
        last = every("a", 5, "100ms")
        write(jobs, runner, "job.a", last)
        await settled(runner)
        assert runner.running["a"].revision == jobs.ctx.fleet.view.keys["job.a"].revision
        identities = [j.schedule.identity for j in probe.started if j.name == "a"]
        assert identities == ["*/1 * * * * *", "*/5 * * * * *"], identities
        assert jobs.timetable.walks["a"].job.jitter == 0.1
        await until(
            lambda: (
                jobs.ctx.fleet.presence.get(BUCKET_SET)
                == presence_of(jobs, {"a": last, "b": keys["job.b"]})
            ),
            5,
            what="the presence's hash of the set as written last",
        )
        # The gauge follows the last write (every 5 s), not an earlier schedule; read
        # at a 5 s boundary it may show the slot just due (jitter 100 ms).
        shown = next_run(jobs, "a") or 0
        assert shown % 5 == 0 and shown > time.time() - 1, shown
        one_walk_each(jobs, probe)


async def test_a_job_beyond_the_cap_while_its_walks_end_is_awaited_is_let_go(
    make_jobs: MakeJobs,
) -> None:
    # a within the cap of 1, b beyond it (the latest written).
    keys = {"job.a": every("a", 1), "job.b": every("b", 2)}
    async with ending(make_jobs, 1, keys, "a") as (jobs, runner, probe):
        assert "b" not in runner.running
        write(jobs, runner, "job.a", every("a", 3))  # now a is the latest: beyond
        await until(lambda: "b" in runner.running, 5, what="b within the cap")
        await settled(runner)
        assert "a" not in runner.running and "a" not in jobs.timetable.walks
        assert "a" not in jobs.ctx.jobs
        assert next_run(jobs, "a") == 0
        assert jobs.ctx.fleet.presence.get(BUCKET_SET) == presence_of(jobs, {"b": keys["job.b"]})
        # Back within the cap (b removed): taken up with its latest settings.
        write(jobs, runner, "job.b", None)
        await until(lambda: "a" in runner.running, 5, what="a back within the cap")
        await settled(runner)
        assert jobs.timetable.walks["a"].job.schedule.identity == "*/3 * * * * *"
        assert jobs.ctx.fleet.presence.get(BUCKET_SET) == presence_of(jobs, {"a": every("a", 3)})
        one_walk_each(jobs, probe)
