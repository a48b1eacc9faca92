"""The one set of a running sidecar's jobs: the config file's, then the state bucket's.

``Config`` is frozen and lists the file's jobs only. A daemon makes one
``JobSet`` from them (sidecar/cli/daemon.py); every part that looks a job up
by name reads this set (it is a ``Mapping`` of name to ``JobConfig``), and a
part that keeps something derived from the jobs (the fleet's leased jobs, the
stream guard's coverage, the overlap part) subscribes to its changes. Jobs of
the state bucket (sidecar/admin/bucket_jobs.py) come and go by one call each:
``put`` a batch, ``remove`` a name. No part keeps its own copy (issue 49).

Order: the file's jobs as written, then the bucket's by name: the order
``status``, the page and the API list them in (docs/ADMIN.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from sidecar.config.model import JobConfig
from sidecar.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Change:
    """What one call changed: the jobs put (new or changed), the names removed."""

    put: tuple[JobConfig, ...] = ()
    removed: tuple[str, ...] = ()


Listener = Callable[[Change], None]


class JobSet(Mapping[str, JobConfig]):
    """A sidecar's jobs by name: the file's (fixed), then the state bucket's."""

    def __init__(self, file_jobs: Iterable[JobConfig]) -> None:
        self._file = tuple(file_jobs)
        self._by_name: dict[str, JobConfig] = {job.name: job for job in self._file}
        # The file's names: a name of the set not among them is the bucket's. Not a set
        # of the bucket's names: at 100,000 jobs that was another 80 to 120 B a job.
        self._file_names = frozenset(self._by_name)
        self._listeners: list[Listener] = []
        self._all: tuple[JobConfig, ...] | None = self._file
        # The largest jitter + max_late any job has had (s): how long after a slot its
        # claims may come. Never lowered by a removal (a removed job's last claims
        # may still come).
        self.latest_claim = max((job.jitter + job.max_late for job in self._file), default=0.0)
        # Grows by one with each change: a reader's cache keyed by it is still good.
        self.version = 0

    # ---------------------------------------------------------------- reading

    def __getitem__(self, name: str) -> JobConfig:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[str]:
        return (job.name for job in self.all)

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def all(self) -> tuple[JobConfig, ...]:
        """Every job in order: the file's as written, then the bucket's by name."""
        if self._all is None:
            bucket = sorted(n for n in self._by_name if n not in self._file_names)
            self._all = (*self._file, *(self._by_name[n] for n in bucket))
        return self._all

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(job.name for job in self.all)

    @property
    def file_jobs(self) -> tuple[JobConfig, ...]:
        return self._file

    def from_file(self, name: str) -> bool:
        """Whether `name` is one of the config file's jobs (not the state bucket's)."""
        return name in self._file_names

    def job(self, name: str) -> JobConfig:
        """The job called `name`; ConfigError("jobs", ...) when there is none (as
        ``Config.job``)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError("jobs", f"no job named {name!r}") from None

    # ---------------------------------------------------------------- changing

    def subscribe(self, listener: Listener) -> None:
        """Call `listener` with each change, after the set holds it."""
        self._listeners.append(listener)

    def put(self, jobs: Iterable[JobConfig]) -> None:
        """Add or replace state-bucket jobs, one change for the batch. A name of the
        file's is refused: the file's jobs win (sidecar/admin/bucket_jobs.py)."""
        batch = tuple(jobs)
        if not batch:
            return
        for job in batch:
            if self.from_file(job.name):
                raise ValueError(f"job {job.name!r} is the config file's")
        for job in batch:
            self._by_name[job.name] = job
            self.latest_claim = max(self.latest_claim, job.jitter + job.max_late)
        self._all = None
        self._changed(Change(put=batch))

    def remove(self, names: Iterable[str]) -> None:
        """Remove state-bucket jobs by name (a file job's name, or an unknown one, is
        left alone), one change for all of them."""
        gone = tuple(
            n for n in dict.fromkeys(names) if n in self._by_name and n not in self._file_names
        )
        if not gone:
            return
        for name in gone:
            del self._by_name[name]
        self._all = None
        self._changed(Change(removed=gone))

    def _changed(self, change: Change) -> None:
        self.version += 1
        # A listener subscribed by another one while this change is told (a part made
        # for its first job of a kind) reads the set as it is now: not told it again.
        for listener in tuple(self._listeners):
            listener(change)
