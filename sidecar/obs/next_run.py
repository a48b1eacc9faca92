"""The next-run gauge: no series for a job waiting beyond its hour, and a scrape
that costs the series it writes, not the jobs.

``anarchon_job_next_run_timestamp_seconds`` is written for a job once its next
slot is within ``NEXT_RUN_HORIZON`` of the wall clock, or from its first claim,
and from then on for good (docs/METRICS.md, "Series per job"). Issue 49, twice:

- Memory. A series kept for every job that waits, shown or not, was about
  170 B a job at 100,000 jobs that no scrape wrote. A job whose next slot is
  beyond the horizon has no series here: its slot is its walk's
  (sidecar/run/timetable.py), which the gauge follows (``NextRuns``).
- Time. A scrape that looked at every job to find the few whose slot came
  near was 100,000 looks on the event loop (up to 0.8 s) for a body of a few
  hundred. ``NextRuns.soon`` answers from the timer's heap, visiting the
  entries due by the horizon only (sidecar/core/timer.py ``due_by``), and the
  series here are those of the jobs shown (or about to be): a scrape costs
  what it writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry

from sidecar.obs.metric_series import Labelled, ShownGauge

# A job's next-run time is exposed once its next slot is this close (or once it
# claimed a slot here): a yearly job waiting for its day costs no series.
NEXT_RUN_HORIZON = 3600.0


class NextRun(ShownGauge):
    """A job's next-run series: shown once set to a slot within the horizon
    (``soon``, the gauge's clock), or from the job's first claim; then for good
    (a job whose last slot came and went shows its 0)."""

    __slots__ = ("soon",)

    def __init__(self, soon: Callable[[float], bool]) -> None:
        super().__init__()
        self.soon = soon

    def set(self, value: float) -> None:
        self.value = float(value)
        self.shown = self.shown or self.soon(self.value)


class NextRuns(Protocol):
    """Where the jobs' next slots are known (sidecar/run/timetable.py): the gauge
    asks it instead of keeping a series for every job that waits."""

    def next_run(self, job: str) -> float | None:
        """Unix time of `job`'s next slot; 0: it runs no more; None: not known here."""

    def soon(self, limit: float) -> Iterable[tuple[str, float]]:
        """The jobs whose next slot (Unix time, > 0) is at or before `limit`, at a
        cost of about the jobs found, not of every job."""


class NextRunGauge(Labelled[ShownGauge]):
    """``job_next_run_timestamp_seconds``: a series only for the jobs that have one
    to show, or had (module doc). A scrape makes the series of the jobs whose slot
    came within the horizon (``soon``), a job's first claim its own with the slot
    it waits for (``claimed``)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        wall: Callable[[], float],
    ) -> None:
        self._wall = wall
        self._sources: list[NextRuns] = []
        super().__init__(registry, "gauge", name, documentation, labelnames, self._new)

    def _new(self) -> NextRun:
        return NextRun(self._soon)

    def _soon(self, value: float) -> bool:
        return 0 < value <= self._wall() + NEXT_RUN_HORIZON

    def follow(self, source: NextRuns) -> None:
        """Read the next slots of the jobs without a series from `source` too."""
        self._sources.append(source)

    def note(self, job: str, value: float) -> None:
        """`job`'s next run is now `value` (0: none): kept only when its series exists
        or the slot is within the horizon (the source knows it otherwise)."""
        if self.written(job) or self._soon(value):
            self.labels(job=job).set(value)

    def claimed(self, job: str) -> None:
        """`job`'s first claim here: its next run is shown from now on."""
        if not self.written(job):
            value = next(
                (v for v in (s.next_run(job) for s in self._sources) if v is not None), 0.0
            )
            self.labels(job=job).value = value
        self.labels(job=job).shown = True

    def items(self) -> list[tuple[tuple[str, ...], ShownGauge]]:
        """The shown series, after making those of the jobs whose slot came near.

        Every series here is a job's that is shown, or was set near by hand (a
        test's ``labels().set``): the loop below costs what the scrape writes."""
        limit = self._wall() + NEXT_RUN_HORIZON
        for source in self._sources:
            for job, value in source.soon(limit):
                if not self.written(job):
                    self.labels(job=job).set(value)
        out = []
        for key, series in self._series.items():
            if not series.shown and 0 < series.value <= limit:
                series.shown = True  # the job has something to say from now on
            if series.shown:
                out.append((key, series))
        return out
