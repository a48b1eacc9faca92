"""The window of claims in flight (sidecar/store/pipe.py ``Window``) under waiters
that time out, are cancelled, come ``behind`` or not, and releases between them.

A place must never be lost (a waiter that gave up keeping it: the window
shrinks for good) nor made up (more holders than its size); a waiter behind
that gives up says so (False), it never waits past its own wait.
"""

from __future__ import annotations

import asyncio
import random

from sidecar.store.pipe import GRAIN, Expiry, Window


async def test_timeouts_cancels_and_releases_interleaved_leak_no_place() -> None:
    rng = random.Random(59)
    size = 3
    window, expiry = Window(size), Expiry()
    holding = 0
    most = 0
    outcomes = {"held": 0, "gave_up": 0, "cancelled": 0}

    async def one(behind: bool, wait: float, hold: float) -> None:
        nonlocal holding, most
        if not await window.acquire(wait, expiry, behind=behind):
            outcomes["gave_up"] += 1
            return
        holding += 1
        most = max(most, holding)
        try:
            await asyncio.sleep(hold)
        finally:
            holding -= 1
            window.release()
        outcomes["held"] += 1

    tasks: list[asyncio.Task[None]] = []
    for _ in range(400):
        behind = rng.random() < 0.5
        # Waits of 0, of about a timer's grain, and longer; holds around them, so
        # that releases fall on, just before and just after the waits' expiry.
        wait = rng.choice([0.0, GRAIN / 2, GRAIN, GRAIN * 2, 0.3])
        hold = rng.choice([0.0, GRAIN / 2, GRAIN, GRAIN * 1.5, 0.1])
        task = asyncio.ensure_future(one(behind, wait, hold))
        tasks.append(task)
        if rng.random() < 0.1:
            await asyncio.sleep(0)
            if not task.done():
                task.cancel()  # a claim given up mid-wait (a stop): cancelled
        if rng.random() < 0.3:
            await asyncio.sleep(rng.choice([0.0, GRAIN / 3, GRAIN]))
    done = await asyncio.gather(*tasks, return_exceptions=True)
    outcomes["cancelled"] = sum(isinstance(d, asyncio.CancelledError) for d in done)
    assert [d for d in done if d is not None and not isinstance(d, asyncio.CancelledError)] == []
    assert most <= size, f"{most} holders of a window of {size}"
    assert holding == 0
    # Every place is back: the window is whole again, and nobody is still handed one.
    assert window.held == 0, f"{window.held} place(s) leaked: {outcomes}"
    for _ in range(size):
        assert await window.acquire(0.0, expiry, behind=True)
    assert outcomes["held"] > 50 and outcomes["gave_up"] > 50, outcomes


async def test_a_waiter_behind_gives_up_in_its_time_while_fresh_claims_keep_the_window_full() -> (
    None
):
    """Starvation is bounded by the waiter's own wait: it gives up (False, the
    claimer then says so: sidecar/run/unanswered.py), and its place is not kept."""
    window, expiry = Window(1), Expiry()
    assert await window.acquire(1.0, expiry)
    question = asyncio.ensure_future(window.acquire(0.3, expiry, behind=True))
    loop = asyncio.get_running_loop()
    started = loop.time()
    handed = 0
    while not question.done():  # fresh claims, one always waiting, for ever
        fresh = asyncio.ensure_future(window.acquire(5.0, expiry))
        await asyncio.sleep(0.01)
        window.release()  # handed to the fresh one, never to the question
        assert await fresh
        handed += 1
    assert question.result() is False
    assert 0.3 <= loop.time() - started < 1.0
    assert handed > 5
    window.release()
    assert window.held == 0


async def test_a_waiter_handed_a_place_as_it_is_cancelled_passes_it_on() -> None:
    for behind in (False, True):
        window, expiry = Window(1), Expiry()
        assert await window.acquire(1.0, expiry)
        waiter = asyncio.ensure_future(window.acquire(5.0, expiry, behind=behind))
        other = asyncio.ensure_future(window.acquire(5.0, expiry, behind=True))
        await asyncio.sleep(0)
        assert window.waiting == 2
        window.release()  # handed to `waiter` (its future done) ...
        waiter.cancel()  # ... which is cancelled before it runs again
        assert await asyncio.gather(waiter, return_exceptions=True) != [True]
        assert await other  # the place went on, not lost
        window.release()
        assert window.held == 0
