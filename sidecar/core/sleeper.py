"""Precise sleeping until a wall-clock instant, woken at once on stop.

asyncio's timers fire up to a millisecond late (the epoll timeout is rounded
up to whole milliseconds), plus the time an idle CPU takes to wake: about
1.5 ms at p50 here. A slot's timer is set PRECISE_WAKE early and the rest is
slept precisely, blocking the loop for at most that long once per due instant.
"""

from __future__ import annotations

import asyncio
import time

from sidecar.core.clock import Clock

PRECISE_WAKE = 0.002


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Sleeper:
    """``await sleeper.until(wall)``; ``wake()`` ends every sleep (on stop)."""

    def __init__(self, clock: Clock, stopping: asyncio.Event) -> None:
        self.clock = clock
        self.stopping = stopping
        self._sleepers: set[asyncio.Future[None]] = set()

    def wake(self) -> None:
        """Wake every sleeper (on stop)."""
        for waiter in self._sleepers:
            _wake(waiter)

    async def until(self, wall: float, retired: asyncio.Event | None = None) -> bool:
        """Sleep until wall-clock time `wall`; True when stopping interrupted it, or
        `retired` (one job's own stop: a job removed from the state bucket) is set."""
        loop = asyncio.get_running_loop()
        while True:
            delay = wall - self.clock.wall()
            if delay <= 0:
                return self.stopping.is_set() or (retired is not None and retired.is_set())
            if self.stopping.is_set() or (retired is not None and retired.is_set()):
                return True
            if delay <= PRECISE_WAKE:
                # Never early: the first job due at this instant sleeps the rest
                # (to about 0.1 ms); the others find it past when they run.
                time.sleep(delay)  # noqa: ASYNC251
                continue
            # A bare future woken by a timer or by stop(): wait_for on the event
            # started a task per sleep, and with every job due at the same
            # instant that cost each one about twice the CPU and made it later.
            # Short hops keep long sleeps honest when the wall clock is corrected.
            waiter: asyncio.Future[None] = loop.create_future()
            timer = loop.call_later(min(delay - PRECISE_WAKE, 30.0), _wake, waiter)
            self._sleepers.add(waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._sleepers.discard(waiter)
            if self.stopping.is_set() or (retired is not None and retired.is_set()):
                return True
