"""The wait of the slots due while a sidecar starts (``Jobs.attempt``).

The schedule starts right after connecting; the stream's first look
(sidecar/store/guard.py ``looked``: a lasting verdict, not a timeout) and the
state bucket's first read (``View.synced``) run beside it. A slot due before
both waits for them, at most half of what is left of its claim's window,
instead of being refused ("stream not checked yet": a ``run_on: every``
instance's slot lost on its own app, a fleet restarted at once losing it
everywhere). docs/GUARANTEES.md, "What it does not do" (catch-up only within
`max_late`), says what a slot may wait for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sidecar.core.clock import Clock
from sidecar.core.tasks import TaskSet

# Looked for this often, by one task for all the slots waiting, and for this
# long at most after the first such wait (then never again).
STARTED_POLL = 0.05
STARTUP_LIMIT = 30.0


class StartupWait:
    """One look for every slot waiting, over for good STARTUP_LIMIT after the
    first wait began (a bucket that cannot be opened holds no slot after that)
    or on stop."""

    def __init__(
        self,
        *,
        started: Callable[[], bool],
        clock: Clock,
        stopping: asyncio.Event,
        tasks: TaskSet,
    ) -> None:
        self.started = started
        self.clock = clock
        self.stopping = stopping
        self.tasks = tasks
        self._task: asyncio.Task[None] | None = None

    async def wait(self, seconds: float) -> None:
        """Until ``started()``, at most `seconds`."""
        if self._task is None:
            self._task = self.tasks.spawn(self._until_started())
        if not self._task.done():
            await asyncio.wait((self._task,), timeout=max(0.0, seconds))

    async def _until_started(self) -> None:
        until = self.clock.monotonic() + STARTUP_LIMIT
        while True:
            if self.started() or self.stopping.is_set() or self.clock.monotonic() >= until:
                return
            await asyncio.sleep(STARTED_POLL)
