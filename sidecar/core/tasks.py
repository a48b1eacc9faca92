"""Background tasks: each in the ``TaskSet`` of its owner, ended at shutdown, boundedly.

On Python 3.11 a cancel can be lost: ``asyncio.wait_for`` returns the result
of an inner future that completed in the same loop iteration as the cancel
(CPython gh-86296; nats-py's requests wait that way). A loop whose cancel was
lost runs on for ever, and a shutdown that awaits it hangs: a sidecar that
logged "stopping" and never exited was found this way. ``cancel_all`` repeats
the cancel until each task has ended, and gives up after a deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# How often a task that is still running is cancelled again.
RECANCEL_EVERY = 0.05


async def cancel_all(tasks: Iterable[asyncio.Task[Any]], timeout: float = 5.0) -> set[Any]:
    """Cancel `tasks` and wait until they have ended, at most `timeout` seconds.

    Returns the tasks still running then (logged). The exceptions of all that
    ended, before or now, are retrieved, so none is reported as never retrieved.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    tasks = list(tasks)
    pending: set[asyncio.Task[Any]] = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_EVERY, remaining))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: a bug was logged where it happened
    for task in pending:
        log.warning("task %s still running %gs after it was cancelled", task.get_name(), timeout)
    return pending


class TaskSet(set[asyncio.Task[Any]]):
    """The background tasks of one owner, for its stop: each is removed when it ends.

    Every task the sidecar starts is started by ``spawn`` in the set of the object
    that owns it, and ended by that owner at stop (``cancel``, or awaited first
    by the daemon's drain). With `say`, one that ended with an exception is
    logged; without, it is not (its owner reads it, or says why it stopped). Either
    way it is retrieved: never "Task exception was never retrieved".
    """

    def __init__(self, what: str, say: bool = True) -> None:
        super().__init__()
        self.what = what
        self.say = say

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start `coro` in a task of this set."""
        task = asyncio.create_task(coro)
        self.add(task)
        task.add_done_callback(self._done)
        return task

    async def cancel(self, timeout: float = 5.0) -> set[Any]:
        """``cancel_all`` of the tasks in the set now; the set is empty after."""
        tasks = list(self)
        self.clear()
        return await cancel_all(tasks, timeout)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved, said or not: never "never retrieved"
        if exc is not None and self.say:
            log.error("%s failed", self.what, exc_info=exc)
