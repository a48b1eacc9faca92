"""The one timer (sidecar/core/timer.py): instants fired in order, never early, an
earlier instant wakes it, a cancelled one never fires, a stepped wall clock is
noticed within a hop, and stop ends it at once."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import cast

import pytest

from sidecar.core import timer as timer_module
from sidecar.core.clock import Clock
from sidecar.core.timer import Timer
from tests.support import until


class SteppedClock:
    """The real clock plus an offset a test steps (a corrected wall clock)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def wall(self) -> float:
        return time.time() + self.offset


async def test_instants_fire_in_order_never_early_and_cancelled_never() -> None:
    stopping = asyncio.Event()
    t = Timer(Clock(), stopping, fire=lambda call: call())
    runner = asyncio.create_task(t.run())
    fired: list[tuple[str, float]] = []
    now = time.time()
    entries = {
        name: t.at(
            now + after, lambda name=name, at=now + after: fired.append((name, time.time() - at))
        )
        for name, after in (("c", 0.30), ("a", 0.10), ("b", 0.20), ("x", 0.15))
    }
    entries["x"].cancel()
    # An instant earlier than the one slept for (0.10 s) wakes the timer.
    t.at(now + 0.05, lambda: fired.append(("first", time.time() - (now + 0.05))))
    await until(lambda: len(fired) >= 4, 5, "four instants fired")
    # c (0.30 s) fired after x's instant (0.15 s) had passed: x was cancelled.
    assert [name for name, _ in fired] == ["first", "a", "b", "c"]
    assert all(late >= 0 for _, late in fired), fired  # never early
    assert all(late < 1.0 for _, late in fired), fired  # not a timing test: loaded CI
    stopping.set()
    t.wake()
    await asyncio.wait_for(runner, 1)


async def test_a_stepped_wall_clock_is_noticed_within_a_hop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(timer_module, "HOP", 0.2)
    clock = SteppedClock()
    stopping = asyncio.Event()
    t = Timer(cast(Clock, clock), stopping, fire=lambda call: call())
    runner = asyncio.create_task(t.run())
    fired = asyncio.Event()
    t.at(time.time() + 3600, fired.set)  # an hour away
    await asyncio.sleep(0.05)
    clock.offset = 3600.0  # the wall clock is corrected forward by an hour
    started = time.monotonic()
    await asyncio.wait_for(fired.wait(), 2)
    assert time.monotonic() - started < 0.5
    stopping.set()
    t.wake()
    await asyncio.wait_for(runner, 1)


async def test_many_entries_one_task_and_compaction() -> None:
    stopping = asyncio.Event()
    t = Timer(Clock(), stopping, fire=lambda call: call())
    far = time.time() + 3600
    entries = [t.at(far + i, lambda: None) for i in range(10_000)]
    for e in entries[:9_000]:
        e.cancel()
    t.compact()
    assert len(t) == 1_000
    tasks_before = len(asyncio.all_tasks())
    runner = asyncio.create_task(t.run())
    await asyncio.sleep(0.01)
    assert len(asyncio.all_tasks()) == tasks_before + 1  # one task for every instant
    stopping.set()
    t.wake()
    await asyncio.wait_for(runner, 1)


async def test_a_burst_is_fired_a_chunk_per_loop_pass() -> None:
    """3,000 items due at one instant: fired in chunks of CHUNK, with the loop's
    other work (here a task counting passes) run between two chunks; all fired,
    each once."""
    stopping = asyncio.Event()
    fired: list[int] = []
    passes: list[int] = []
    t = Timer(Clock(), stopping, fire=fired.append)
    at = time.time() + 0.05
    for i in range(3000):
        t.at(at, i)

    async def count_passes() -> None:
        while True:
            passes.append(len(fired))
            if len(fired) >= 3000:
                return
            await asyncio.sleep(0)

    runner = asyncio.create_task(t.run())
    await asyncio.wait_for(count_passes(), 5)  # from before the instant
    assert sorted(fired) == list(range(3000))
    # Between two passes of the loop, at most one chunk (256) was fired.
    steps = [b - a for a, b in itertools.pairwise(passes)]
    assert len(passes) > 1 and max(steps) <= 256 == timer_module.CHUNK
    stopping.set()
    t.wake()
    await asyncio.wait_for(runner, 1)


class Armed(timer_module.Entry):
    """An object that is its own entry (as sidecar/run/timetable.py's walks)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        super().__init__(None)
        self.name = name


async def test_an_object_that_is_its_own_entry_fires_once_per_push_and_cancels() -> None:
    stopping = asyncio.Event()
    fired: list[str] = []
    t = Timer(Clock(), stopping, fire=lambda item: fired.append(item.name))
    runner = asyncio.create_task(t.run())
    a, b = Armed("a"), Armed("b")
    now = time.time()
    for item, after in ((a, 0.05), (b, 0.10)):
        item.item = item
        t.push(now + after, item)
    b.cancel()
    await until(lambda: fired == ["a"] and not a.active, 5, "a fired, its entry spent")
    a.item = a  # armed again: fires again
    t.push(time.time() + 0.05, a)
    await until(lambda: fired == ["a", "a"], 5, "a fired a second time")
    # c, armed after b's instant had passed, fires: b, cancelled, never did.
    c = Armed("c")
    c.item = c
    t.push(time.time(), c)
    await until(lambda: fired[-1:] == ["c"], 5, "c fired")
    assert fired == ["a", "a", "c"]
    stopping.set()
    t.wake()
    await asyncio.wait_for(runner, 1)


def test_the_entries_due_by_an_instant_are_found_without_the_rest_of_the_heap() -> None:
    """``due_by`` (the next-run gauge's scrape, issue 49): every active entry at or
    before the instant, a cancelled one not (the cost: tests/obs/test_next_run.py)."""
    t = Timer(Clock(), asyncio.Event(), fire=lambda _: None)
    entries = [t.at(1000.0 + i, i) for i in reversed(range(2000))]
    entries[-3].cancel()  # the instant 1002.0
    assert sorted(cast(int, e.item) for e in t.due_by(1004.5)) == [0, 1, 3, 4]
    assert t.due_by(999.0) == []
    assert len(t.due_by(10_000.0)) == 1999


async def test_the_items_of_one_instant_fire_in_an_order_of_each_timers_own() -> None:
    """Items put in the same order at one instant fire in the order of the timer's salt:
    two timers (two sidecars) with salts of their own, in two orders, neither the
    order put in; a timer with the same salt, in the same order (the same jobs'
    runs no longer come last at every burst: docs/PERFORMANCE.md)."""

    async def order(salt: int) -> list[int]:
        stopping = asyncio.Event()
        fired: list[int] = []
        t = Timer(Clock(), stopping, fire=fired.append, salt=salt)
        at = time.time() + 0.02
        for i in range(500):
            t.at(at, i)
        runner = asyncio.create_task(t.run())
        await until(lambda: len(fired) == 500, 5, "every item fired")
        stopping.set()
        t.wake()
        await asyncio.wait_for(runner, 1)
        return fired

    first, second, again = await order(1), await order(2**63 + 5), await order(1)
    assert sorted(first) == sorted(second) == list(range(500))
    assert first == again
    assert first != second and list(range(500)) not in (first, second)
    # Not merely shifted: the first 100 of one share about a fifth with the other's.
    assert len(set(first[:100]) & set(second[:100])) < 50
    assert (
        Timer(Clock(), asyncio.Event(), fire=print).salt
        != Timer(Clock(), asyncio.Event(), fire=print).salt
    )


def test_the_next_instant_is_the_earliest_active_one() -> None:
    t = Timer(Clock(), asyncio.Event(), fire=lambda _: None)
    assert t.next_instant() is None
    first = t.at(1000.0, "a")
    t.at(2000.0, "b")
    assert t.next_instant() == 1000.0
    first.cancel()
    assert t.next_instant() == 2000.0 and len(t) == 1  # the cancelled one dropped
