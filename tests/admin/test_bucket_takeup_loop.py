"""Issue 49: a take-up round never holds the event loop over every job in one piece.

With 100,000 jobs of the state bucket a round began with the cap (every key
read, the job keys sorted by revision) and the names sorted, and ended with
the presence's hash of the running set (every job's hash, the JSON sorted and
hashed): each in one piece, 50 to 150 ms on an idle machine, several times
that on a loaded one, and a scrape of /metrics waited for it
(docs/PERFORMANCE.md, "One scrape at 100,000 jobs"). Now each is done in
slices that yield (sidecar/core/slices.py).

In-process, on the daemon's parts (``make_jobs``; the view is filled as the
watch fills it, through ``View.apply``, without the 60,000 deliveries of
nats-py, whose own blocks are not the take-up's): a probe task on the same
loop notes the CPU time this thread spent between two of its turns, the
longest block of the loop. CPU time, not wall time: another process on the
machine does not lengthen it. The collector is off while measured (a full
collection of 60,000 jobs' objects is a block of its own).
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time

import pytest

from sidecar.admin.bucket_jobs import BucketJobs
from sidecar.admin.jobcheck import beyond_cap, beyond_cap_in_slices
from sidecar.config.load import Config, parse_config
from sidecar.core.slices import RUN, Budget
from sidecar.store.digests import BUCKET_SET
from sidecar.store.state import Entry, Removal, View
from tests.support import MakeJobs, until

JOBS = 60_000
# Keys written after the cap's: not run (the cap's scan and sort both have work).
OVER = 50
# In one piece, the end of a round of JOBS jobs held the loop about 50 ms here,
# its start about 30 ms; a slice is SLICE (5 ms) of judging and its jobs started.
LONGEST = 0.025


class Probe:
    """The longest CPU time this thread spent between two turns of the probe."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._stop = False
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Probe:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)  # its first turn: counted from here
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop = True
        assert self._task is not None
        await self._task

    async def _run(self) -> None:
        last = time.thread_time()
        while not self._stop:
            await asyncio.sleep(0)
            now = time.thread_time()
            self.longest = max(self.longest, now - last)
            last = now


def value(name: str, minute: int) -> bytes:
    return json.dumps({"name": name, "schedule": f"{minute} 0 1 1 *"}).encode()


def capped(cap: int) -> Config:
    """A config whose bucket takes at most `cap` jobs; no NATS, nothing due."""
    return parse_config(
        {
            "nats": {"servers": ["nats://127.0.0.1:1"]},  # not used: no NATS here
            "target": {"url": "http://127.0.0.1:9"},  # never called: nothing is due
            "bucket_jobs": {"max_jobs": cap},
            "jobs": [{"name": "keep", "schedule": "0 0 1 1 *"}],
        },
        {},
    )


async def round_begun(runner: BucketJobs) -> None:
    """Until `runner`'s next round has begun, turn by turn (no poll's sleep): its wake
    is cleared after GATHER and the round goes straight into the cap's scan, which
    yields."""
    await runner._wake.wait()
    for _ in range(100_000):
        if not runner._wake.is_set():
            return
        await asyncio.sleep(0)
    raise AssertionError("the round did not begin")


async def test_a_take_up_of_many_jobs_holds_the_loop_a_slice_at_a_time(
    make_jobs: MakeJobs,
) -> None:
    config = capped(JOBS)
    async with make_jobs(config) as jobs:
        fleet = jobs.ctx.fleet
        view = fleet.view
        for i in range(JOBS + OVER):
            name = f"tenant-{i:06d}"
            view.apply(f"job.{name}", value(name, i % 60), i + 1, False)
        view.synced = True
        jobs.ctx.guard.looked = True  # past the start: no slot waits for the first look
        runner = BucketJobs(config=config, metrics=jobs.metrics, fleet=fleet)
        runner.start(jobs)
        gc.collect()
        gc.disable()
        try:
            async with Probe() as take_up:
                runner.changed("")
                await until(
                    lambda: fleet.presence.get(BUCKET_SET, {}).get("count") == JOBS,
                    120,
                    what=f"{JOBS} jobs taken up",
                )
            told = fleet.presence[BUCKET_SET]["hash"]
            # One key written again: the latest now, beyond the cap; the oldest of
            # those beyond comes in. A round of two keys, and the set hashed again.
            async with Probe() as one_change:
                view.apply("job.tenant-000000", value("tenant-000000", 7), JOBS + OVER + 1, False)
                runner.changed("job.tenant-000000")
                await until(
                    lambda: fleet.presence[BUCKET_SET]["hash"] != told,
                    30,
                    what="the set told again",
                )
        finally:
            gc.enable()
        await runner.stop()
    assert "tenant-000000" not in runner.running and f"tenant-{JOBS:06d}" in runner.running
    print(f"longest block: take-up {take_up.longest:.4f} s, one change {one_change.longest:.4f} s")
    assert take_up.longest < LONGEST, f"the take-up held the loop {take_up.longest:.3f} s"
    assert one_change.longest < LONGEST, f"one change held the loop {one_change.longest:.3f} s"


async def test_the_cap_in_slices_is_the_cap() -> None:
    rng = random.Random(49)
    for keys, cap in [(0, 0), (10, 20), (10, 5), (3 * RUN, 2 * RUN), (3 * RUN, 10), (RUN, RUN)]:
        view = View()
        revisions = rng.sample(range(1, 10 * keys + 10), keys + 5)
        for i in range(keys):
            view.keys[f"job.j{i}"] = Entry(None, revisions[i], b"{}")
        for i in range(5):  # keys of other families count for nothing
            view.keys[f"instance.s{i}"] = Entry({}, revisions[keys + i])
        got = await beyond_cap_in_slices(view, cap, Budget(0.0))
        assert got == beyond_cap(view, cap)
        assert len(got) == max(0, keys - cap)


async def test_a_key_written_while_the_cap_is_read_is_placed_before_it_is_taken_up(
    make_jobs: MakeJobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap's scan yields (``beyond_cap_in_slices``): a job key written meanwhile is
    not in the scan, and the latest written is beyond the cap. It must not be taken up
    by the round that did not place it (run, registered and told in the presence for a
    round, then retired: the other sidecars refuse it). A slice of 0 makes every pause
    yield, as a loaded machine does with thousands of keys."""
    monkeypatch.setattr("sidecar.admin.bucket_jobs.SLICE", 0.0)
    cap = 3
    config = capped(cap)
    async with make_jobs(config) as jobs:
        fleet = jobs.ctx.fleet
        view = fleet.view
        for i in range(cap):
            view.apply(f"job.j{i}", value(f"j{i}", i), i + 1, False)
        view.keys["instance.other"] = Entry({}, cap + 1)  # more keys than the cap: a scan
        view.synced = True
        jobs.ctx.guard.looked = True  # past the start: no slot waits for the first look
        runner = BucketJobs(config=config, metrics=jobs.metrics, fleet=fleet)
        seen: list[set[str]] = []
        runner.listeners.append(lambda: seen.append(set(runner.running)))
        runner.start(jobs)
        runner.changed("")
        await until(lambda: len(runner.running) == cap, 10, what="the cap's jobs taken up")

        async def write_in_the_scan() -> None:
            await round_begun(runner)
            view.apply("job.late", value("late", 9), 11, False)  # the latest: beyond
            runner.changed("job.late")

        writer = asyncio.create_task(write_in_the_scan())
        view.apply("job.j0", value("j0", 0), 10, False)  # the same job written again
        runner.changed("job.j0")
        await writer
        await until(lambda: "late" in runner._over, 10, what="job.late refused")
        await runner.stop()
    assert not any("late" in names for names in seen), seen


async def test_a_key_removed_while_the_cap_is_read_does_not_push_another_beyond(
    make_jobs: MakeJobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A removal while the cap's scan yields: the scan counted the removed key, so
    the cap's count is one too many and the latest key of the round (valid, within
    the cap once the removal is counted) must not be refused as beyond it (a
    hostile input counted and said for a valid job). A slice of 0: every pause
    yields."""
    monkeypatch.setattr("sidecar.admin.bucket_jobs.SLICE", 0.0)
    cap = 3
    config = capped(cap)
    async with make_jobs(config) as jobs:
        fleet = jobs.ctx.fleet
        view = fleet.view
        for i in range(cap):
            view.apply(f"job.j{i}", value(f"j{i}", i), i + 1, False)
        view.synced = True
        jobs.ctx.guard.looked = True  # past the start: no slot waits for the first look
        runner = BucketJobs(config=config, metrics=jobs.metrics, fleet=fleet)
        runner.start(jobs)
        runner.changed("")
        await until(lambda: len(runner.running) == cap, 10, what="the cap's jobs taken up")
        hostile = jobs.metrics.hostile_input_total.labels(what="job")._value.get()

        async def remove_in_the_scan() -> None:
            await round_begun(runner)
            gone = view.keys["job.j0"]
            view.apply("job.j0", None, cap + 2, True, "DEL")  # as the watch delivers it
            runner.removed(Removal("job.j0", gone, "DEL", None))

        remover = asyncio.create_task(remove_in_the_scan())
        view.apply("job.late", value("late", 9), cap + 1, False)  # within the cap after j0
        runner.changed("job.late")
        await remover
        await until(lambda: set(runner.running) == {"j1", "j2", "late"}, 10, what="late taken up")
        await runner.stop()
        assert jobs.metrics.hostile_input_total.labels(what="job")._value.get() == hostile
        assert not runner._over


async def test_a_reread_while_the_cap_is_read_places_the_round_s_keys_by_the_new_view(
    make_jobs: MakeJobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full re-read while the cap's scan yields replaces the view's mapping: a key the
    watch missed (older than the round's key) is not in the scan, which counts one
    too few, and the round's latest key, beyond the cap by the re-read view, must not
    be taken up. A slice of 0: every pause yields."""
    monkeypatch.setattr("sidecar.admin.bucket_jobs.SLICE", 0.0)
    cap = 3
    config = capped(cap)
    async with make_jobs(config) as jobs:
        fleet = jobs.ctx.fleet
        view = fleet.view
        for i in range(cap - 1):
            view.apply(f"job.j{i}", value(f"j{i}", i), i + 1, False)
        view.keys["instance.other"] = Entry({}, 3)  # more keys than the cap: a scan
        view.synced = True
        jobs.ctx.guard.looked = True  # past the start: no slot waits for the first look
        runner = BucketJobs(config=config, metrics=jobs.metrics, fleet=fleet)
        seen: list[set[str]] = []
        runner.listeners.append(lambda: seen.append(set(runner.running)))
        runner.start(jobs)
        runner.changed("")
        await until(lambda: len(runner.running) == cap - 1, 10, what="the jobs taken up")

        async def reread_in_the_scan() -> None:
            await round_begun(runner)
            # As sidecar/store/watch.py re-reads: a fresh mapping, then the changed keys
            # and "" told. job.missed (revision 5) was written before job.late.
            fresh = View()
            for key, entry in view.keys.items():
                fresh.keys[key] = entry
            fresh.apply("job.missed", value("missed", 5), 5, False)
            view.keys = fresh.keys
            runner.changed("job.missed")
            runner.changed("")

        rereader = asyncio.create_task(reread_in_the_scan())
        view.apply("job.late", value("late", 9), 10, False)
        runner.changed("job.late")
        await rereader
        await until(lambda: "late" in runner._over, 10, what="job.late refused")
        await until(lambda: "missed" in runner.running, 10, what="job.missed taken up")
        await runner.stop()
    assert not any("late" in names for names in seen), seen
