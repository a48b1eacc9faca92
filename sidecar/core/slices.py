"""Work over every job in slices that yield the event loop (issue 49).

A sidecar with 100,000 jobs shares one event loop between its slots, the
watch, ``/metrics`` and the work that looks at every job at once (a take-up
round of the state bucket's jobs: which keys are beyond the cap, the names in
order, the presence's hash of the set: sidecar/admin/bucket_jobs.py). Done in
one piece, such work held the loop for 50 to 200 ms on an idle machine, and
for several times that on a loaded one, and a scrape waited for it
(docs/PERFORMANCE.md, "One scrape at 100,000 jobs"). ``Budget`` says when a
slice is spent; ``sort`` sorts in runs of ``RUN`` items merged a ``CHUNK`` at
a time, each step a fraction of a millisecond, with the budget's yields in
between. The result is ``sorted``'s, ties included (both are stable).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

# The loop is yielded once a slice has run this long (s): a slot of the file's
# jobs, the watch and a scrape get their turn at least this often.
SLICE = 0.005
# Items sorted in one step (about 1 ms for 4,096 short names).
RUN = 4096
# Items merged in one step, and the most items any other step of a slice takes.
CHUNK = 1024

T = TypeVar("T")


class Budget:
    """The time the work has held the loop since it last yielded; ``pause`` yields
    once that passed `slice` seconds. One budget for every step of one piece of work,
    so that the slices are counted across the steps."""

    def __init__(self, slice: float = SLICE) -> None:
        self._loop = asyncio.get_running_loop()
        self._slice = slice
        self._began = self._loop.time()

    @property
    def spent(self) -> bool:
        return self._loop.time() - self._began > self._slice

    async def pause(self) -> None:
        """Yield the loop if this slice is spent."""
        if self.spent:
            await self.yield_now()

    async def yield_now(self) -> None:
        """Yield the loop; a new slice begins."""
        await asyncio.sleep(0)
        self._began = self._loop.time()


async def sort(
    items: Iterable[T], budget: Budget, key: Callable[[T], Any] | None = None
) -> list[T]:
    """``sorted(items, key=key)``, a few thousand items a step, the loop yielded
    between steps once `budget` is spent. `items` is copied first, in one step
    (a set or a dict's keys: the caller may change it while this yields)."""
    items = list(items)
    if len(items) <= RUN:
        return sorted(items, key=key)  # type: ignore[type-var,arg-type]
    runs: list[list[T]] = []
    for at in range(0, len(items), RUN):
        runs.append(sorted(items[at : at + RUN], key=key))  # type: ignore[type-var,arg-type]
        await budget.pause()
    items.clear()  # not kept twice while merged
    merged = heapq.merge(*runs, key=key)  # type: ignore[arg-type]
    out: list[T] = []
    while chunk := list(itertools.islice(merged, CHUNK)):
        out.extend(chunk)
        await budget.pause()
    return out


def chunks(items: list[T], size: int = CHUNK) -> Iterable[list[T]]:
    """`items` `size` at a time (the caller pauses its budget between them)."""
    return (items[at : at + size] for at in range(0, len(items), size))
