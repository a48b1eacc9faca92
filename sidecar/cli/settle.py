"""The collector kept off the job set: the heap frozen again once the set has grown.

Once ready, the daemon collects and freezes what start-up made
(``Daemon._settle_memory``): the collector's full passes never walk it again.
The state bucket's jobs come later, taken up by the watch (10,000 of them a
few seconds after ready, sidecar/admin/bucket_jobs.py), and everything they
made stayed in the collector's oldest generation, for every later full pass
to walk (at 100,000 jobs about a second of the loop each).

``Settler``, armed by the daemon once ready, counts the jobs put into the set
since. When ``GROWTH`` or more came, the set has been quiet for ``QUIET``
seconds (a take-up comes in rounds) and the sidecar is idle (no slot handled
or run, none due within ``QUIET``: ``busy``), it collects once (one full
pass, which the collector would have made anyway as the heap grew) and
freezes the heap again. Not idle, it looks again every ``QUIET`` seconds.
Freezing keeps objects from the collector's passes, not from their
reference counts: a job removed later is still freed. What is frozen and
later left in a reference cycle (a removed job's, or whatever else was alive
then: little on an idle sidecar) stays until the process ends, as what
start-up froze does.

``collector_on`` also sets the youngest generation's threshold to ``YOUNG``
allocations, not 700. A burst's claims and runs live a few seconds and
allocate about 900,000 objects on a sidecar of 10,000 jobs: at 700 the
collector's pass over the older generations (every 121 young passes, each
walking everything the burst holds) came 9 to 11 times in a burst, 30 to
245 ms each, 0.4 to 1.9 s of a sidecar's CPU (docs/PERFORMANCE.md, "The
burst"); at ``YOUNG`` none comes in a burst of that size, and a young pass
walks at most ``YOUNG`` objects (about 2 ms). Objects in reference cycles
wait that much longer to be freed (CPython 3.13 raised the default to 2,000
for the same reason).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

from sidecar.config.jobset import Change, JobSet
from sidecar.core.tasks import TaskSet

log = logging.getLogger(__name__)

# Allocations (less deallocations) between two passes over the youngest generation.
YOUNG = 20_000
# Jobs put into the set since the last freeze before the heap is settled again.
GROWTH = 1000
# Seconds without a change of the set before settling: a take-up's rounds are over.
QUIET = 1.0


def collector_on() -> None:
    """The collector on, its youngest generation collected every ``YOUNG`` allocations."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, oldest)
    gc.enable()


class Settler:
    """Collects and freezes the heap after the job set grew by ``GROWTH`` jobs, once
    armed (``arm``), when the job set is quiet and the sidecar not ``busy``."""

    def __init__(
        self,
        jobs: JobSet,
        tasks: TaskSet,
        busy: Callable[[float], bool] = lambda _: False,
        quiet: float = QUIET,
    ) -> None:
        self.jobs = jobs
        self.tasks = tasks
        # Whether a slot is handled or run now, or one is due within the seconds given.
        self.busy = busy
        self.quiet = quiet
        self.armed = False
        self.grown = 0
        self.settled = 0  # times the heap was settled (tests read it)
        self._task: asyncio.Task[None] | None = None
        jobs.subscribe(self.changed)

    def arm(self) -> None:
        """From now on (the daemon is ready and froze the heap): count the jobs put."""
        self.armed = True
        self.grown = 0

    def disarm(self) -> None:
        """On stop: nothing more is settled."""
        self.armed = False

    def changed(self, change: Change) -> None:
        if not self.armed:
            return
        self.grown += len(change.put)
        if self.grown >= GROWTH and self._task is None:
            self._task = self.tasks.spawn(self._settle())

    async def _settle(self) -> None:
        try:
            version = -1
            while version != self.jobs.version or self.busy(self.quiet):
                version = self.jobs.version
                await asyncio.sleep(self.quiet)
            if not self.armed:
                return
            started = time.perf_counter()
            self.grown = 0
            gc.collect()
            gc.freeze()
            self.settled += 1
            log.debug(
                "heap settled after the job set grew: %d jobs, %.0f ms, %d objects frozen",
                len(self.jobs),
                (time.perf_counter() - started) * 1000,
                gc.get_freeze_count(),
            )
        finally:
            self._task = None
