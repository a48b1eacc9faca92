"""The state bucket's ``job.<name>`` keys followed from the start; their runner made on the first.

Jobs added at run time (sidecar/admin/bucket_jobs.py) are an operator's act:
most fleets never write a ``job.<name>`` key. ``JobKeys`` stands in for
``BucketJobs`` from the daemon's start, as sidecar/run/onkey.py does for
backfills and one-off runs: it hears every key the watch delivers and every
removal, and on the first ``job.`` key (or a re-sync whose view holds one)
imports the runner's module, makes it and hands it that key and every key
after. Until then there is no job of the bucket to run, list or retire: a
key of another kind, or a re-sync with none, is one the runner would have
ignored. What the page and the API ask of the bucket's jobs (where a job
comes from, the listing, the listeners told of a change) it answers the
same way before and after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.admin.bucket_jobs import BucketJobs
    from sidecar.config.model import Config
    from sidecar.fleet.member import Fleet
    from sidecar.obs.metrics import Metrics
    from sidecar.run.job_loop import Jobs
    from sidecar.store.state import Removal

PREFIX = "job."  # sidecar/admin/jobcheck.py PREFIX
FILE, BUCKET = "file", "bucket"


class JobKeys:
    """The bucket's jobs of one daemon: `runner` made on the first ``job.`` key (module doc)."""

    def __init__(self, config: Config, metrics: Metrics, fleet: Fleet) -> None:
        self.config = config
        self.metrics = metrics
        self.fleet = fleet
        self.file_names = frozenset(config.job_names)
        # Called with the running job set after each change (the page's objects).
        self.listeners: list[Callable[[], None]] = []
        self.runner: BucketJobs | None = None
        self._jobs: Jobs | None = None
        self._stopped = False
        fleet.key_listeners.append(self.changed, PREFIX)
        fleet.removal_listeners.append(self.removed)

    def start(self, jobs: Jobs) -> None:
        self._jobs = jobs
        if self.runner is not None:
            self.runner.start(jobs)

    async def stop(self) -> None:
        """No more changes taken up; the loops end with the daemon's."""
        self._stopped = True
        if self.runner is not None:
            await self.runner.stop()

    def changed(self, key: str) -> None:
        runner = self.runner
        if runner is None:
            if self._stopped:
                return
            if key == "":  # a re-sync: made if the view holds a job key
                if not any(k.startswith(PREFIX) for k in self.fleet.view.keys):
                    return
            elif not key.startswith(PREFIX):
                return
            runner = self._make()
        runner.changed(key)

    def removed(self, removal: Removal) -> None:
        # Before the first job key there is no job of the bucket to retire.
        if self.runner is not None:
            self.runner.removed(removal)

    def _make(self) -> BucketJobs:
        from sidecar.admin.bucket_jobs import BucketJobs

        runner = self.runner = BucketJobs(
            config=self.config, metrics=self.metrics, fleet=self.fleet, listeners=self.listeners
        )
        if self._jobs is not None:
            runner.start(self._jobs)
        return runner

    def origin(self, name: str) -> tuple[str, str | None]:
        """(``file``, None) or (``bucket``, its external id): where job `name` comes from."""
        if self.runner is not None:
            return self.runner.origin(name)
        return (FILE, None) if name in self.file_names else (BUCKET, None)

    def listing(self) -> list[dict[str, Any]]:
        """Every job key of the bucket with its state, as ``status --json`` lists them."""
        if self.runner is not None:
            return self.runner.listing()
        from sidecar.admin.jobcheck import listing

        return listing(self.config, self.fleet.view, self.file_names)
