"""The heap frozen again once the job set grew (sidecar/cli/settle.py), and the
collector's young generation."""

from __future__ import annotations

import asyncio
import dataclasses
import gc

from sidecar.cli import settle
from sidecar.cli.settle import GROWTH, YOUNG, Settler, collector_on
from sidecar.config.jobset import JobSet
from sidecar.config.load import parse_config
from sidecar.core.tasks import TaskSet
from tests.support import job, until


async def test_the_heap_is_frozen_again_once_the_set_grew_and_went_quiet() -> None:
    base = parse_config({"jobs": [job("base")]}, {}).jobs[0]
    jobs = JobSet(())
    tasks = TaskSet("a test task", say=False)
    idle = [False]
    settler = Settler(jobs, tasks, busy=lambda _: not idle[0], quiet=1.0)
    frozen = gc.get_freeze_count()
    made = iter(range(10**6))

    def put(count: int) -> None:
        jobs.put([dataclasses.replace(base, name=f"t-{next(made)}") for _ in range(count)])

    try:
        put(GROWTH)  # before the daemon is ready (it freezes then): not counted
        assert settler.grown == 0 and not tasks
        settler.arm()
        put(GROWTH - 1)
        assert settler.grown == GROWTH - 1 and not tasks  # below GROWTH: nothing to do
        put(1)
        assert len(tasks) == 1 and settler.settled == 0
        # A take-up comes in rounds: the settling waits until the set is quiet.
        for _ in range(4):
            await asyncio.sleep(0.05)
            put(10)
            assert settler.settled == 0
        # ... and until the sidecar is idle (no slot handled, run or due soon).
        await asyncio.sleep(2.5)
        assert settler.settled == 0 and len(tasks) == 1
        idle[0] = True
        await until(lambda: settler.settled == 1 and not tasks, 10, "the heap settled")
        assert settler.grown == 0
        # Every job put, the last rounds' too, is out of the collector's passes.
        assert gc.get_freeze_count() >= frozen + GROWTH + 40
        put(GROWTH - 1)
        assert not tasks and settler.settled == 1
        # A job changed counts as grown (its new settings are new objects).
        jobs.put([dataclasses.replace(jobs["t-0"], schedule=base.schedule)])
        await until(lambda: settler.settled == 2 and not tasks, 10, "settled again")
        settler.disarm()  # stopping
        put(GROWTH)
        assert not tasks and settler.settled == 2
    finally:
        await tasks.cancel()
        gc.unfreeze()


def test_the_collector_is_turned_on_with_a_young_generation_of_young() -> None:
    before = gc.get_threshold()
    enabled = gc.isenabled()
    try:
        gc.disable()
        collector_on()
        assert gc.isenabled() and gc.get_threshold() == (YOUNG, *before[1:])
        assert settle.YOUNG > 700  # CPython's default, which a burst's heap outgrew
    finally:
        gc.set_threshold(*before)
        if not enabled:
            gc.disable()
