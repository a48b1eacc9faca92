"""One backoff for every retry loop: waits that double from a start up to a cap.

    backoff = Backoff(start=0.02, cap=1.0, jitter=0.5)
    while True:
        try:
            return await ask()
        except TRANSIENT:
            await backoff.sleep(at_most=deadline - clock.monotonic())

Each wait is ``current`` times a random factor in ``[1 - jitter, 1 + jitter]``
(none by default), cut to ``at_most`` when given (a loop with a deadline never
sleeps past it); ``current`` then doubles, up to ``cap``. ``reset`` starts the
sequence again (after a success, in a loop that keeps running). A wait that
must stay the same (``start == cap``) is a backoff too, so that every loop
says its start and cap where it is written.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable


class Backoff:
    """Doubling waits between `start` and `cap` seconds, with optional jitter."""

    __slots__ = ("_uniform", "cap", "current", "factor", "jitter", "start")

    def __init__(
        self,
        start: float,
        cap: float,
        *,
        jitter: float = 0.0,
        factor: float = 2.0,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        if not start > 0:
            raise ValueError(f"backoff start must be > 0, not {start!r}")
        if not cap >= start:
            raise ValueError(f"backoff cap ({cap!r}) must be >= its start ({start!r})")
        if not 0 <= jitter < 1:
            raise ValueError(f"backoff jitter must be in [0, 1), not {jitter!r}")
        if not factor >= 1:
            raise ValueError(f"backoff factor must be >= 1, not {factor!r}")
        self.start = start
        self.cap = cap
        self.jitter = jitter
        self.factor = factor
        self._uniform = uniform
        self.current = start  # the next wait, before jitter

    def __repr__(self) -> str:
        return (
            f"Backoff(start={self.start}, cap={self.cap}, jitter={self.jitter}, "
            f"current={self.current})"
        )

    def next(self, at_most: float | None = None) -> float:
        """The wait to make now (seconds, never below 0); the one after grows."""
        wait = self.current
        if self.jitter:
            wait *= self._uniform(1 - self.jitter, 1 + self.jitter)
        if at_most is not None:
            wait = min(wait, max(0.0, at_most))
        self.current = min(self.current * self.factor, self.cap)
        return wait

    async def sleep(self, at_most: float | None = None) -> None:
        """Sleep the next wait (see ``next``)."""
        await asyncio.sleep(self.next(at_most))

    def reset(self) -> None:
        """Start again from `start` (the thing retried answered)."""
        self.current = self.start
