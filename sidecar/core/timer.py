"""One timer for every job: a heap of wall-clock instants and one task that sleeps
until the earliest.

A job waiting for its slot costs a heap entry, not a task: with 100,000 jobs
a task each was 2.8 KiB of memory and a wake-up every 30 s (a third of a core
for jobs that were not due); here one task wakes, at the earliest instant, or
every HOP seconds so that a corrected wall clock is noticed as the sleeper
notices it (sidecar/core/sleeper.py). An instant is fired as the sleeper ends
a sleep: the timer is set PRECISE_WAKE early and the rest is slept precisely,
never early. ``fire`` runs on the timer's task: it must only start work
(``TaskSet.spawn``), never await.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections.abc import Callable
from typing import Any

from sidecar.core.clock import Clock
from sidecar.core.sleeper import PRECISE_WAKE

# The longest one sleep lasts before the wall clock is read again.
HOP = 30.0
# The 64-bit ints: the order of the entries of one instant is their insertion
# number mixed with the timer's salt (``_order``).
_M64 = (1 << 64) - 1
# Items fired in one pass of the event loop. A burst (thousands of jobs due at
# one instant) is started a chunk at a time, the loop reading the sockets in
# between: the acks of the first claims are read, and their runs started,
# before the last jobs of the instant have even begun (docs/PERFORMANCE.md).
CHUNK = 256


class Entry:
    """One instant in the heap, for `item`; ``cancel()`` drops it (it stays in the
    heap, skipped). No closure per instant: the timer's one ``fire`` gets the item."""

    __slots__ = ("item",)

    def __init__(self, item: object) -> None:
        self.item: object | None = item

    def cancel(self) -> None:
        self.item = None

    @property
    def active(self) -> bool:
        return self.item is not None


def _order(number: int) -> int:
    """A 64-bit number's place among an instant's entries: splitmix64's finalizer, a
    bijection of the 64-bit numbers (distinct numbers, distinct places: the heap
    never compares two entries)."""
    number = ((number ^ (number >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    number = ((number ^ (number >> 27)) * 0x94D049BB133111EB) & _M64
    return number ^ (number >> 31)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Timer:
    """``timer.at(wall, item)``: ``fire(item)`` then; ``run()`` is the one task;
    ``wake()`` on stop.

    The items of one instant fire in an order of this timer's own (its random
    ``salt``), not the order they were put in. The sidecars of a fleet arm the
    state bucket's jobs in the same order (by name), and in that order the
    same tenants' runs came last at every burst: in a burst of 10,000 jobs the
    rank correlation of a job's number and its trigger's time was 0.91, and
    0.00 in orders of each sidecar's own (one run each: docs/PERFORMANCE.md,
    "The burst").
    """

    def __init__(
        self,
        clock: Clock,
        stopping: asyncio.Event,
        fire: Callable[[Any], None],
        salt: int | None = None,
    ) -> None:
        self.clock = clock
        self.stopping = stopping
        self.fire = fire
        self._heap: list[tuple[float, int, Entry]] = []
        self._seq = itertools.count()
        self.salt = random.getrandbits(64) if salt is None else salt
        self._waiter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def at(self, wall: float, item: object) -> Entry:
        """``fire(item)`` at wall-clock time `wall` (at once, on the timer's task, when
        it has passed). An instant earlier than the one slept for wakes the timer."""
        entry = Entry(item)
        self.push(wall, entry)
        return entry

    def push(self, wall: float, entry: Entry) -> None:
        """As ``at``, for an entry the caller made (an object that is its own entry:
        sidecar/run/timetable.py's walks, one object a job instead of two). An entry
        is in the heap once at most while active."""
        head = self._heap[0][0] if self._heap else None
        order = _order((next(self._seq) ^ self.salt) & _M64)
        heapq.heappush(self._heap, (wall, order, entry))
        if head is None or wall < head:
            self.wake()

    def due_by(self, wall: float) -> list[Entry]:
        """The active entries whose instant is at or before `wall`, in no order.

        The heap's children are never earlier than their parent: a walk from the
        root that goes down only below an entry this early visits the entries
        found and their children, not the heap (a scrape's next-run times,
        sidecar/run/timetable.py ``soon``: issue 49)."""
        heap = self._heap
        size = len(heap)
        found: list[Entry] = []
        below = [0] if size and heap[0][0] <= wall else []
        while below:
            at = below.pop()
            entry = heap[at][2]
            if entry.active:
                found.append(entry)
            for child in (2 * at + 1, 2 * at + 2):
                if child < size and heap[child][0] <= wall:
                    below.append(child)
        return found

    def next_instant(self) -> float | None:
        """The earliest active instant (wall-clock seconds), None when there is none."""
        self._drop_cancelled_head()
        return self._heap[0][0] if self._heap else None

    def _drop_cancelled_head(self) -> int:
        """Pop the cancelled entries at the top of the heap; how many were popped."""
        dropped = 0
        while self._heap and not self._heap[0][2].active:
            heapq.heappop(self._heap)
            dropped += 1
        return dropped

    def wake(self) -> None:
        """End the current sleep: the heap is read again (a new earliest, or stop)."""
        if self._waiter is not None:
            _wake(self._waiter)

    def compact(self) -> None:
        """Drop cancelled entries when they are most of the heap (jobs removed)."""
        live = [item for item in self._heap if item[2].active]
        if len(live) < len(self._heap) // 2:
            heapq.heapify(live)
            self._heap = live

    async def run(self) -> None:
        """Fire every instant as it comes, until stopping."""
        loop = asyncio.get_running_loop()
        cancelled = 0
        while not self.stopping.is_set():
            cancelled += self._drop_cancelled_head()
            if cancelled > 1024:
                self.compact()
                cancelled = 0
            delay = self._heap[0][0] - self.clock.wall() if self._heap else HOP
            if delay <= 0:
                self._fire_due()
                await asyncio.sleep(0)  # what was started runs before the next instant
                continue
            if delay <= PRECISE_WAKE:
                time.sleep(delay)  # noqa: ASYNC251 - never early, as the sleeper
                continue
            self._waiter = loop.create_future()
            handle = loop.call_later(min(delay - PRECISE_WAKE, HOP), _wake, self._waiter)
            try:
                await self._waiter
            finally:
                handle.cancel()
                self._waiter = None

    def _fire_due(self) -> None:
        """Fire what is due, at most CHUNK items: the rest after the loop's next pass."""
        now = self.clock.wall()
        fired = 0
        while self._heap and self._heap[0][0] <= now and fired < CHUNK:
            entry = heapq.heappop(self._heap)[2]
            item, entry.item = entry.item, None
            if item is not None:
                self.fire(item)
                fired += 1
