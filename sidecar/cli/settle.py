"""The collector kept off the job set: the heap frozen again once the set has grown.

Once ready, the daemon collects and freezes what start-up made
(``Daemon._settle_memory``): the collector's full passes never walk it again.
The state bucket's jobs come later, taken up by the watch (10,000 of them a
few seconds after ready, sidecar/admin/bucket_jobs.py), and everything they
made stayed in the collector's oldest generation. A burst then allocates
enough (tasks, futures, claims) for the collector to make a full pass every
few hundred milliseconds, each over the whole job set: measured in a
10,000-job burst (docs/PERFORMANCE.md, "The burst"), 9 to 11 full passes of
30 to 200 ms, 1.4 to 1.8 s of a sidecar's 4 to 5 s of CPU, the loop held all
the while; at 100,000 jobs each pass would hold it for about a second.

``Settler`` counts the jobs put into the set since the last freeze. When
``GROWTH`` or more came and the set has been quiet for ``QUIET`` seconds (a
take-up comes in rounds), it collects once (one full pass, which the collector
would have made anyway as the heap grew) and freezes the heap again. A job
removed later is still freed (freezing keeps objects from the collector's
passes, not from their reference counts); what a removed job leaves in a
reference cycle stays until the process ends, as what start-up froze does.

``collector_on`` also sets the youngest generation's threshold to ``YOUNG``
allocations, not 700. A burst's claims and runs live a few seconds and
allocate about 900,000 objects on a sidecar of 10,000 jobs: at 700 the
collector's pass over the older generations (every hundred young passes or
so, each walking everything the burst holds) came 11 times in the burst and
took 0.4 to 1.9 s of CPU; at ``YOUNG`` none comes in a burst of that size, and a
young pass walks at most ``YOUNG`` objects (about 2 ms). Objects in reference
cycles wait that much longer to be freed (CPython 3.13 raised the default to
2,000 for the same reason).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

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
    """Collects and freezes the heap after the job set grew by ``GROWTH`` jobs."""

    def __init__(self, jobs: JobSet, tasks: TaskSet, quiet: float = QUIET) -> None:
        self.jobs = jobs
        self.tasks = tasks
        self.quiet = quiet
        self.grown = 0
        self.settled = 0  # times the heap was settled (tests read it)
        self._task: asyncio.Task[None] | None = None
        jobs.subscribe(self.changed)

    def changed(self, change: Change) -> None:
        self.grown += len(change.put)
        if self.grown >= GROWTH and self._task is None:
            self._task = self.tasks.spawn(self._settle())

    async def _settle(self) -> None:
        try:
            version = -1
            while version != self.jobs.version:
                version = self.jobs.version
                await asyncio.sleep(self.quiet)
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
