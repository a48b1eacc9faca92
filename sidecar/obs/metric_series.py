"""Per-job metric series that cost a few small objects each, written at scrape time.

prometheus_client makes a whole metric object, and a value object with a
lock for every number in it, for each label set: with the 15 series per job
(three of them histograms) that came to about 19 KiB per job, 19 MiB for a
thousand jobs. :class:`Labelled` keeps each series as one small object
instead (:class:`CounterSeries`, :class:`GaugeSeries`,
:class:`HistogramSeries`) and writes the same samples at scrape time, either
as prometheus_client samples or as text piece by piece (:class:`Family`).
Every update happens on the event loop, as does the scrape (in pieces), so
they need no lock. A job's series exist only once it has something to say
(docs/METRICS.md, "Series per job"): :class:`ShownGauge` is not written
before it leaves its quiet value, :class:`ByJobHistogram` keeps one series for
the jobs not listed. Which metrics exist, and their names, is
``sidecar.obs.metric_table``'s business.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


def number(value: float) -> str:
    """A sample value as prometheus_client writes it; most values are 0."""
    return "0.0" if value == 0 else floatToGoString(value)  # type: ignore[no-untyped-call]


class CounterSeries:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount

    def samples(self) -> Iterable[tuple[str, dict[str, str], float]]:
        yield "_total", {}, self.value

    def text(self, name: str, labels: str) -> str:
        return f"{name}_total{{{labels}}} {number(self.value)}\n"


class GaugeSeries:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount

    def samples(self) -> Iterable[tuple[str, dict[str, str], float]]:
        yield "", {}, self.value

    def text(self, name: str, labels: str) -> str:
        return f"{name}{{{labels}}} {number(self.value)}\n"


class ShownGauge(GaugeSeries):
    """A gauge exposed only once it has left its quiet value (``quiet``, 0 here),
    and from then on for good: a paused flag, a pending count, a job's next run.

    A job that never had anything to say has no series (docs/METRICS.md), while a
    series once exposed stays, at 0 again too, so rates and alerts see it end.
    """

    __slots__ = ("shown",)
    quiet = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.value = self.quiet
        self.shown = False

    def set(self, value: float) -> None:
        self.value = float(value)
        self.shown = self.shown or self.value != self.quiet

    def inc(self, amount: float = 1) -> None:
        self.set(self.value + amount)

    def dec(self, amount: float = 1) -> None:
        self.set(self.value - amount)


class QuietAtOne(ShownGauge):
    """A :class:`ShownGauge` whose quiet value is 1 (``stream_covers_job``: all is well)."""

    __slots__ = ()
    quiet = 1.0


_ZEROS: dict[int, tuple[int, ...]] = {}


def _zeros(n: int) -> tuple[int, ...]:
    return _ZEROS.setdefault(n, (0,) * n)


class HistogramSeries:
    __slots__ = ("bounds", "counts", "les", "sum")

    def __init__(self, bounds: tuple[float, ...], les: tuple[str, ...]) -> None:
        # Shared by the metric's series: the bounds (ending with +Inf) and their labels.
        self.bounds = bounds
        self.les = les
        # Per bucket, not cumulative; the metric's shared zeros until the first
        # observation (most jobs' histograms of rarer events never see one).
        self.counts: list[int] | tuple[int, ...] = _zeros(len(bounds))
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.sum += amount
        # The first bucket whose bound is >= amount (none for NaN), as prometheus_client.
        i = bisect_left(self.bounds, amount)
        if i < len(self.bounds) and amount <= self.bounds[i]:
            counts = self.counts
            if isinstance(counts, tuple):
                counts = self.counts = list(counts)
            counts[i] += 1

    def samples(self) -> Iterable[tuple[str, dict[str, str], float]]:
        acc = 0.0
        for le, count in zip(self.les, self.counts, strict=True):
            acc += count
            yield "_bucket", {"le": le}, acc
        yield "_count", {}, acc
        yield "_sum", {}, self.sum

    def text(self, name: str, labels: str) -> str:
        # Labels in prometheus_client's order (sorted by name): ``job`` before ``le``;
        # none but ``le`` for the series of every job not listed (``ByJobHistogram``).
        lines = []
        acc = 0.0
        first = labels + "," if labels else ""
        braced = f"{{{labels}}}" if labels else ""
        for le, count in zip(self.les, self.counts, strict=True):
            acc += count
            lines.append(f'{name}_bucket{{{first}le="{le}"}} {number(acc)}\n')
        lines.append(f"{name}_count{braced} {number(acc)}\n")
        lines.append(f"{name}_sum{braced} {number(self.sum)}\n")
        return "".join(lines)


S = TypeVar("S", CounterSeries, GaugeSeries, ShownGauge, HistogramSeries)
# Which of a metric's series one scrape writes, given all of them in order.
Pick = Callable[[list[tuple[tuple[str, ...], S]]], list[tuple[tuple[str, ...], S]]]


# One tuple per distinct label values, shared by every metric: most per-job
# series are labelled by the job alone, so ``(job,)`` is the same key in a
# few dozen metrics. Keeping one copy took about 2 KiB a job off the RSS.
_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {}


class Labelled(Generic[S]):
    """A labelled metric (collector) whose series are the small objects above.

    ``labels(job=...)`` and the samples it exposes are those of the
    prometheus_client class of the same type (without ``_created``).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        kind: str,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        new_series: Callable[[], S],
        on_new: Callable[[tuple[str, ...]], None] | None = None,
        shown: Pick[S] | None = None,
    ) -> None:
        self.kind = kind
        self.name = name  # the whole name, prefix included
        self.documentation = documentation
        self.labelnames = labelnames
        self._new_series: Callable[[], S] = new_series
        self._series: dict[tuple[str, ...], S] = {}
        # The series at zero of every label set not yet written (nothing but
        # `labels` hands a series out, and it makes the label set its own first).
        self._zero: S = new_series()
        # Label sets exposed at zero from the start (`declare`), with no entry
        # of their own until written: the jobs' 47 series each were 2.7 KiB a job.
        # Called with a label set's values when its series is first made (the
        # companions a job's first claim brings: ``sidecar.obs.metrics``).
        self._on_new = on_new
        # Which series the scrape writes (all without it): a ShownGauge's own rule,
        # given the whole list so that it reads the clock once, not once a job.
        self._shown: Pick[S] | None = shown
        registry.register(self)

    def label_text(self, key: tuple[str, ...]) -> str:
        """``job="a",status="b"``: the series' labels in the text format, sorted by name."""
        if not key:  # a ByJobHistogram's series of every job not listed
            return ""
        pairs = sorted(zip(self.labelnames, key, strict=True))
        return ",".join(f'{name}="{escape(value)}"' for name, value in pairs)

    def labels(self, **labels: object) -> S:
        if len(labels) != len(self.labelnames):
            raise ValueError("Incorrect label names")
        try:
            key = tuple([str(labels[name]) for name in self.labelnames])
        except KeyError:
            raise ValueError("Incorrect label names") from None
        series = self._series.get(key)
        if series is None or series is self._zero:
            key = _KEYS.setdefault(key, key)
            series = self._series[key] = self._new_series()
            if self._on_new is not None:
                self._on_new(key)
        return series

    def items(self) -> list[tuple[tuple[str, ...], S]]:
        """Every series now, in the order they were made."""
        out = list(self._series.items())
        return out if self._shown is None else self._shown(out)

    def written(self, *values: str) -> bool:
        """Whether the series of these label values has its own value (not the zero)."""
        return self._series.get(values, self._zero) is not self._zero

    def add(self, *values: str) -> None:
        """Expose the series of these label values (in ``labelnames`` order) at zero,
        without the keyword checks of ``labels``: the shared zero series until written.
        (The jobs' label sets are declared instead, all at once: ``declare``.)"""
        if len(values) != len(self.labelnames):
            raise ValueError("Incorrect label names")
        if values not in self._series:
            self._series[_KEYS.setdefault(values, values)] = self._zero

    def describe(self) -> list[Metric]:
        return [Metric(self.name, self.documentation, self.kind)]

    def collect(self) -> list[Metric]:
        return [Family(self)]


class ByJobHistogram(Labelled[HistogramSeries]):
    """A histogram with a series per job only for the jobs ``per_job`` picks
    (``metrics.per_job_histograms``, docs/CONFIG.md); the other jobs' observations
    all go to one series without a ``job`` label, exposed from the start.

    A histogram is 15 to 19 series: one per job made /metrics grow by them at
    every job (docs/METRICS.md, "Series per job").
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        documentation: str,
        new_series: Callable[[], HistogramSeries],
        per_job: Callable[[str], bool],
    ) -> None:
        self.others = new_series()
        self._per_job = per_job
        super().__init__(registry, "histogram", name, documentation, ("job",), new_series)

    def labels(self, **labels: object) -> HistogramSeries:
        if set(labels) == {"job"} and not self._per_job(str(labels["job"])):
            return self.others
        return super().labels(**labels)

    def items(self) -> list[tuple[tuple[str, ...], HistogramSeries]]:
        return [((), self.others), *super().items()]


class Family(Metric):
    """A Labelled metric at one scrape: its series as they are now.

    ``samples`` are built when first read (``get_sample_value``, prometheus_client's
    own exposition); the admin server writes ``text()`` instead, piece by piece,
    yielding to the event loop between pieces.
    """

    def __init__(self, owner: Labelled[Any]) -> None:
        self._samples: list[Sample] = []
        super().__init__(owner.name, owner.documentation, owner.kind)
        self._owner = owner
        self._items = owner.items()  # a copy: the loop may add a series meanwhile

    @property
    def samples(self) -> list[Sample]:
        if not self._samples and self._items:
            for key, series in self._items:
                base = dict(zip(self._owner.labelnames, key, strict=True)) if key else {}
                for suffix, extra, value in series.samples():
                    self._samples.append(Sample(self.name + suffix, {**base, **extra}, value))
        return self._samples

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        self._samples = value

    def text(self) -> Iterator[str]:
        """The text format: the HELP and TYPE lines, then one piece per series."""
        name = self.name + ("_total" if self.type == "counter" else "")
        doc = self.documentation.replace("\\", r"\\").replace("\n", r"\n")
        yield f"# HELP {name} {doc}\n# TYPE {name} {self.type}\n"
        label_text = self._owner.label_text
        for key, series in self._items:
            yield series.text(self.name, label_text(key))


def escape(value: str) -> str:
    """A label value in the text format."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
