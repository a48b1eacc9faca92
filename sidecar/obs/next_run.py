"""The next-run gauge, whose scrape costs the series it writes, not the jobs.

``anarchon_job_next_run_timestamp_seconds`` has a series for every job (each
job's walk sets its next slot), but a job's series is written only once its
next slot is within ``NEXT_RUN_HORIZON`` of the wall clock, or from its
first claim, and from then on for good (docs/METRICS.md, "Series per job").
A scrape used to find the ones that came within the horizon by looking at
every series: 100,000 jobs were 100,000 looks, on the event loop, before
the first byte of a body of a few hundred of them (issue 49: a scrape took
up to 0.8 s). Here a series not shown yet waits in a heap by its next-run
time (one small tuple a job, sharing the series' float and label key), the
scrape takes from the heap only the ones the clock reached, and the shown
series are kept apart, in the order they were shown.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heapify, heappop, heappush

from prometheus_client import CollectorRegistry

from sidecar.obs.metric_series import Labelled, ShownGauge

# A job's next-run time is exposed once its next slot is this close (or once it
# claimed a slot here): a yearly job waiting for its day costs no series.
NEXT_RUN_HORIZON = 3600.0
# The heap is rebuilt from the series when stale entries (a value set again
# before it came within the horizon) outnumber the live ones by this much.
SLACK = 1024


class NextRun(ShownGauge):
    """A job's next-run gauge: shown once set to a time within the horizon, once a
    scrape finds the clock brought it there, or at the job's first claim (``show``)."""

    __slots__ = ("key", "metric")

    def __init__(self, metric: NextRunGauge) -> None:
        super().__init__()
        self.metric = metric
        self.key: tuple[str, ...] = ()  # its label values, given once made (``_named``)

    def set(self, value: float) -> None:
        self.value = float(value)
        if not self.shown:
            self.metric.placed(self)

    def show(self) -> None:
        """Written by every scrape from now on (a job with something to say)."""
        if not self.shown:
            self.shown = True
            self.metric.shown[self.key] = self


class NextRunGauge(Labelled[ShownGauge]):
    """The next-run metric: a ``Labelled`` of ``NextRun`` series (module doc)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        wall: Callable[[], float],
    ) -> None:
        self.wall = wall
        # Not shown yet: (next-run time, label values), the earliest first; an entry
        # whose series has another value since is stale and dropped when reached.
        self.waiting: list[tuple[float, tuple[str, ...]]] = []
        self.shown: dict[tuple[str, ...], ShownGauge] = {}
        super().__init__(
            registry, "gauge", name, documentation, labelnames, self._new, on_new=self._named
        )

    def _new(self) -> NextRun:
        return NextRun(self)

    def _named(self, key: tuple[str, ...]) -> None:
        self._next_run(key).key = key

    def _next_run(self, key: tuple[str, ...]) -> NextRun:
        series = self._series[key]
        assert isinstance(series, NextRun)  # every series is made by ``_new``
        return series

    def labels(self, **labels: object) -> NextRun:
        series = super().labels(**labels)
        assert isinstance(series, NextRun)
        return series

    def placed(self, series: NextRun) -> None:
        """`series` (not shown) was set: shown if its time is near, else it waits."""
        value = series.value
        if not value > 0:  # no next run (0, or NaN): nothing to wait for
            return
        if value <= self.wall() + NEXT_RUN_HORIZON:
            series.show()
            return
        heappush(self.waiting, (value, series.key))
        if len(self.waiting) > 2 * (len(self._series) - len(self.shown)) + SLACK:
            self.waiting = [
                (s.value, key)
                for key, s in self._series.items()
                if not s.shown and s.value > 0  # a time, not "no next run"
            ]
            heapify(self.waiting)

    def items(self) -> list[tuple[tuple[str, ...], ShownGauge]]:
        """The shown series, after showing those whose time the clock brought near."""
        limit = self.wall() + NEXT_RUN_HORIZON
        waiting = self.waiting
        while waiting and waiting[0][0] <= limit:
            value, key = heappop(waiting)
            series = self._series.get(key)
            if series is not None and not series.shown and series.value == value:
                self._next_run(key).show()
        return list(self.shown.items())
