"""A job of the state bucket changed, then removed, while its walk handles a slot.

``BucketJobs`` ends a job's walk between two slots: the job's end awaits the
slot in hand (``Jobs.retire``). A key removed during that wait must not be put
back on a walk with the settings judged before it: the new walk handled a
slot whose time had come, after `job remove` answered (the nemesis's
``runtime_violations``, tests/nemesis/checker.py ``check_runtime``). Nor may
that wait hold the other jobs' changes.

In process, on the daemon's parts (``make_jobs``): the slot in hand is a gate
before ``Jobs.retire`` or a slow claim; the slots judged after a removal are
claimed through a real stream and state bucket.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest

from sidecar.admin.bucket_jobs import BucketJobs
from sidecar.admin.jobcheck import judge
from sidecar.config.load import Config, JobConfig, parse_config
from sidecar.run.job_loop import Jobs
from sidecar.store.state import Removal
from tests.admin.test_bucket_takeup_loop import capped, value
from tests.run.test_job_life import running
from tests.support import MakeJobs, NatsServer, RecordingApp, until


class Walks:
    """`jobs` with each walk's start noted (its job and ``resume``); `gated`: a walk's
    end waits for ``handled`` (its slot in hand) and sets ``in_hand`` first."""

    def __init__(self, jobs: Jobs, gated: bool = False) -> None:
        self.started: list[tuple[JobConfig, int | None]] = []
        self.in_hand, self.handled = asyncio.Event(), asyncio.Event()
        start, retire = jobs.start, jobs.retire

        def recording_start(job: JobConfig, resume: int | None = None) -> None:
            self.started.append((job, resume))
            start(job, resume)

        async def slot_in_hand(name: str) -> int | None:
            self.in_hand.set()
            await self.handled.wait()
            return await retire(name)

        jobs.start = recording_start  # type: ignore[method-assign]
        if gated:
            jobs.retire = slot_in_hand  # type: ignore[method-assign]

    @property
    def resumes(self) -> list[int | None]:
        return [resume for _, resume in self.started]


def slow_first_claim(jobs: Jobs, name: str, held: float) -> asyncio.Event:
    """Job `name`'s first slot in hand takes `held` s (its claim slow, NATS slow); the
    event is set when it began."""
    attempt = jobs.attempt
    in_hand = asyncio.Event()

    async def slow_claim(job: JobConfig, slot: int, *rest: Any, **kw: Any) -> None:
        if job.name == name and not in_hand.is_set():
            in_hand.set()
            await asyncio.sleep(held)
            return
        await attempt(job, slot, *rest, **kw)

    jobs.attempt = slow_claim  # type: ignore[method-assign]
    return in_hand


async def taken_up(jobs: Jobs, config: Config, keys: dict[str, bytes]) -> BucketJobs:
    """A BucketJobs of `jobs` started on a view of the job keys `keys` (name: value, at
    revisions 1, 2...), once it runs them all."""
    view = jobs.ctx.fleet.view
    for revision, (name, data) in enumerate(keys.items(), start=1):
        view.apply(f"job.{name}", data, revision, False)
    view.synced = True
    jobs.ctx.guard.looked = True  # past the start: no slot waits for the first look
    runner = BucketJobs(config=config, metrics=jobs.metrics, fleet=jobs.ctx.fleet)
    runner.start(jobs)
    runner.changed("")
    await until(lambda: set(keys) <= set(runner.running), 10, what=f"{list(keys)} taken up")
    return runner


def remove(runner: BucketJobs, name: str, revision: int) -> None:
    """`job remove name`, as the watch delivers it to the view and the runner."""
    view = runner.fleet.view
    gone = view.keys[f"job.{name}"]
    view.apply(f"job.{name}", None, revision, True, "DEL")
    runner.removed(Removal(f"job.{name}", gone, "DEL", None))


def put(runner: BucketJobs, name: str, data: bytes, revision: int) -> None:
    """`job add` or `job update` of `name`, as the watch delivers it."""
    runner.fleet.view.apply(f"job.{name}", data, revision, False)
    runner.changed(f"job.{name}")


def every(name: str, seconds: int) -> bytes:
    return json.dumps({"name": name, "schedule": f"*/{seconds} * * * * *"}).encode()


async def test_a_job_removed_while_its_change_waits_for_the_slot_in_hand_is_not_walked_again(
    make_jobs: MakeJobs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sidecar.admin.bucket_jobs")
    config = capped(10)
    async with make_jobs(config) as jobs:
        walks = Walks(jobs, gated=True)
        runner = await taken_up(jobs, config, {"rt": value("rt", 1)})
        put(runner, "rt", value("rt", 2), 2)  # `job update`: other settings
        await asyncio.wait_for(walks.in_hand.wait(), 10)
        remove(runner, "rt", 3)
        walks.handled.set()
        await until(lambda: "left the state bucket" in caplog.text, 10, what="rt let go")
        await until(lambda: not runner._wake.is_set(), 10, what="the rounds done")
        await runner.stop()
    assert "rt" not in runner.running
    identities = [job.schedule.identity for job, _ in walks.started]
    assert identities == identities[:1], (
        "the removed job was put on a walk again with the settings of its update"
    )
    assert "rt" not in jobs.timetable.walks


@pytest.mark.parametrize("first", ["remove", "update"])
async def test_a_job_removed_and_added_again_while_its_walk_waits_does_not_go_on_from_the_old_slot(
    make_jobs: MakeJobs, first: str
) -> None:
    """`job remove` (or an update, then a remove) and then `job add` while the round waits
    for the old walk's slot in hand: the job added again is a new job, walked from its
    add, not from the slot the removed walk waited for (``Jobs.start``'s `resume`: a
    slot between the removal and the add would run, fired at once)."""
    config = capped(10)
    async with make_jobs(config) as jobs:
        walks = Walks(jobs, gated=True)
        runner = await taken_up(jobs, config, {"rt": value("rt", 1)})
        revision = 2
        if first == "update":
            put(runner, "rt", value("rt", 2), revision)
            await asyncio.wait_for(walks.in_hand.wait(), 10)
            revision += 1
        remove(runner, "rt", revision)
        await asyncio.wait_for(walks.in_hand.wait(), 10)
        put(runner, "rt", value("rt", 3), revision + 1)  # `job add` again
        walks.handled.set()
        await until(lambda: len(walks.started) == 2, 10, what="rt taken up again")
        await until(lambda: not runner._wake.is_set(), 10, what="the rounds done")
        await runner.stop()
    assert "rt" in runner.running
    assert walks.resumes == [None, None], "the job added again went on from the removed walk's slot"


async def test_a_job_removed_is_let_go_while_another_jobs_change_waits_for_its_slot_in_hand(
    make_jobs: MakeJobs,
) -> None:
    """The take-up round goes over the names one by one: a change of job `a` waits for
    `a`'s slot in hand (its claim, up to max_late when NATS is slow). `job remove b`
    meanwhile is not held by it: `b` is let go at once."""
    config = capped(10)
    held = 4.0  # how long a's claim takes
    async with make_jobs(config) as jobs:
        in_hand = slow_first_claim(jobs, "a", held)
        runner = await taken_up(jobs, config, {"a": every("a", 1), "b": value("b", 1)})
        await asyncio.wait_for(in_hand.wait(), 10)
        put(runner, "a", every("a", 2), 3)  # `job update a`
        await until(lambda: jobs.timetable.walks["a"].retired, 10, what="a's change waiting")
        remove(runner, "b", 4)
        removed = time.monotonic()
        await until(lambda: "b" not in runner.running, held + 5, what="b let go")
        took = time.monotonic() - removed
        # a's change is taken up once its slot in hand is handled.
        await until(
            lambda: "a" in runner.running and runner.running["a"].revision == 3,
            held + 5,
            what="a's change taken up",
        )
        assert jobs.timetable.walks["a"].job.schedule.identity == "*/2 * * * * *"
        await runner.stop()
    print(f"job remove b let go after {took:.3f}s (a's slot in hand held {held:g}s)")
    assert took < held / 2, f"b was let go {took:.3f}s after its removal: held by a's slot in hand"


async def test_a_job_removed_and_added_again_while_its_claim_is_slow_goes_on_from_its_add(
    make_jobs: MakeJobs,
) -> None:
    """The same as above with a real slot in hand (its claim slow): its walk's end is
    awaited beside the round; removed and added again meanwhile, the job is walked
    from its add, and the removal alone is let go once the slot is handled."""
    config = capped(10)
    held = 3.0
    async with make_jobs(config) as jobs:
        in_hand = slow_first_claim(jobs, "a", held)
        walks = Walks(jobs)
        runner = await taken_up(jobs, config, {"a": every("a", 1)})
        await asyncio.wait_for(in_hand.wait(), 10)
        remove(runner, "a", 2)
        await until(lambda: jobs.timetable.walks["a"].retired, 10, what="a's end waiting")
        put(runner, "a", every("a", 2), 3)  # `job add a` again
        await until(lambda: len(walks.started) == 2, held + 5, what="a taken up again")
        assert runner.running["a"].revision == 3
        await runner.stop()
    assert walks.resumes == [None, None], "the job added again went on from the removed walk's slot"


# ---------------------------------------------------------------- the claim's own check


async def next_second(jobs: Any) -> int:
    """The next whole second (epoch ms), once it has come: a slot of the stream's time."""
    slot = (int(time.time()) + 1) * 1000
    await jobs.sleep_until(slot / 1000)
    return slot


def on_real_nats(nats_server: NatsServer, http_app: RecordingApp) -> Config:
    return parse_config(
        {
            "nats": {"servers": [nats_server.url]},
            "target": {"url": http_app.url},
            "jobs": [{"name": "keep", "schedule": "0 0 1 1 *"}],
        },
        {},
    )


async def bucket_job_rt(jobs: Jobs, config: Config) -> tuple[JobConfig, int]:
    """Job `rt` written to the real state bucket, in the view, and put into the job set
    as BucketJobs takes it up; its key's revision."""
    fleet = jobs.ctx.fleet
    assert fleet.bucket is not None
    revision = await fleet.bucket.kv.put("job.rt", value("rt", 1))
    await until(lambda: "job.rt" in fleet.view.keys, 10, what="job.rt in the view")
    rt = judge(config, "job.rt", json.loads(value("rt", 1))).job
    jobs.ctx.jobs.put([rt])
    return rt, revision


def won(jobs: Jobs) -> float:
    return float(jobs.metrics.claims_won_total.labels(job="rt").value)


async def test_a_slot_judged_after_job_remove_is_not_claimed_while_the_walk_still_runs(
    make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """The take-up round may end the walk late (it waits for a slot in hand, of this
    job or another): a slot judged after the job's key left the view is not claimed,
    whoever has not ended the walk yet. Against a real stream and state bucket."""
    config = on_real_nats(nats_server, http_app)
    async with make_jobs(config) as jobs, running(jobs):
        fleet = jobs.ctx.fleet
        rt, _ = await bucket_job_rt(jobs, config)
        await jobs.attempt(rt, await next_second(jobs), time.time())
        assert won(jobs) == 1  # the key there: claimed
        assert fleet.bucket is not None
        await fleet.bucket.kv.delete("job.rt")
        await until(lambda: "job.rt" not in fleet.view.keys, 10, what="job.rt gone")
        await jobs.attempt(rt, await next_second(jobs), time.time())
        assert won(jobs) == 1, "a slot of a removed job was claimed"


async def test_a_slot_of_a_job_whose_key_is_rewritten_or_reread_is_still_claimed(
    make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Fleet.left_bucket refuses no slot of a job whose key is there: written again
    (`job update`), let go by the view (``View.hold``) or re-read in full (a re-sync
    swaps the view's keys at once). Against a real stream and state bucket."""
    config = on_real_nats(nats_server, http_app)
    async with make_jobs(config) as jobs, running(jobs):
        fleet = jobs.ctx.fleet
        assert fleet.bucket is not None and fleet.watch is not None
        rt, revision = await bucket_job_rt(jobs, config)
        fleet.view.hold("job.rt", revision)
        await jobs.attempt(rt, await next_second(jobs), time.time())
        assert won(jobs) == 1  # held: claimed
        revision = await fleet.bucket.kv.update("job.rt", value("rt", 2), revision)
        await until(lambda: fleet.view.keys["job.rt"].revision == revision, 10, what="rewrite")
        await jobs.attempt(rt, await next_second(jobs), time.time())
        assert won(jobs) == 2  # written again: claimed
        keys = fleet.view.keys
        fleet.watch.resync()
        await until(lambda: fleet.view.keys is not keys, 10, what="a full re-read")
        await jobs.attempt(rt, await next_second(jobs), time.time())
        assert won(jobs) == 3  # re-read: claimed
