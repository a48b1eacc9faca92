"""Work over every job in slices (sidecar/core/slices.py): the same answers as in
one piece, the loop yielded in between."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core import slices
from sidecar.core.slices import Budget, chunks, sort
from tests.support import examples

# Items that make more than one run, ties among them, among which the examples' fall.
_rng = random.Random(49)
MANY = [(_rng.randrange(50), f"{_rng.randrange(10**6):x}") for _ in range(2 * slices.RUN + 7)]


@settings(max_examples=examples(200))
@given(st.lists(st.tuples(st.integers(0, 60), st.text(max_size=3)), max_size=20), st.booleans())
def test_sort_is_sorted_ties_included(some: list[tuple[int, str]], many: bool) -> None:
    items = [*MANY[: len(MANY) // 2], *some, *MANY[len(MANY) // 2 :]] if many else some

    async def both() -> None:
        budget = Budget(0.0)  # spent at once: a yield after every step
        assert await sort(items, budget) == sorted(items)
        # By the first field alone: ties keep their order, as sorted's do.
        assert await sort(items, budget, key=lambda p: p[0]) == sorted(items, key=lambda p: p[0])

    asyncio.run(both())


async def test_a_long_sort_yields_the_loop_between_its_steps() -> None:
    names = [f"tenant-{i:06d}" for i in range(10 * slices.RUN)]
    random.Random(7).shuffle(names)
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    try:
        start = turns
        got = await sort(set(names), Budget(0.0))
    finally:
        task.cancel()
    assert got == sorted(names)
    # One turn at least per run sorted and per chunk merged.
    assert turns - start >= 10 + len(names) // slices.CHUNK


def test_chunks_cover_the_items_in_order() -> None:
    items = list(range(2500))
    parts = list(chunks(items, 1000))
    assert [len(p) for p in parts] == [1000, 1000, 500]
    assert [i for p in parts for i in p] == items
    assert list(chunks([], 1000)) == []
