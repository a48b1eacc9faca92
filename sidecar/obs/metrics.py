"""Prometheus metrics of docs/METRICS.md: one table (``METRICS``), made on a registry
that the caller injects.

No global registry and no global switch: tests create as many sidecars in one
process as they like and read values with ``registry.get_sample_value``, and
importing this module changes nothing in prometheus_client (its few own
counters drop their ``_created`` series themselves: :class:`NoCreated`). Every
name is prefixed ``anarchon_``; the only labels are ``job`` (bounded by the
config), ``status`` and ``reason`` (fixed sets) and ``version``. The per-job
series are the lean ones of ``sidecar.obs.metric_series``, and a job has none
until it has something to say (docs/METRICS.md, "Series per job"): at 100,000
jobs a series each is megabytes at every scrape.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from fnmatch import fnmatchcase

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import INF, floatToGoString

from sidecar import __version__
from sidecar.obs.metric_series import (
    ByJobHistogram,
    CounterSeries,
    HistogramSeries,
    Labelled,
    ShownGauge,
)
from sidecar.obs.metric_table import METRICS, PREFIX, Spec
from sidecar.obs.next_run import NextRunGauge


def shown(
    items: list[tuple[tuple[str, ...], ShownGauge]],
) -> list[tuple[tuple[str, ...], ShownGauge]]:
    """The series of a ShownGauge metric that left their quiet value."""
    return [(key, series) for key, series in items if series.shown]


class NoCreated:
    """A prometheus_client counter as the registry's collector, without the
    ``_created`` sample of each series (a start time, of no use here, that would
    double the counters' series): this metric's own, where prometheus_client's
    ``disable_created_metrics()`` would switch them off in the whole process."""

    __slots__ = ("metric",)

    def __init__(self, metric: Counter) -> None:
        self.metric = metric

    def describe(self) -> list[Metric]:
        return list(self.metric.describe())

    def collect(self) -> list[Metric]:
        families = list(self.metric.collect())
        for family in families:  # made afresh by each collect: ours to change
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
        return families


class Metrics:
    """Every metric of ``METRICS``, each an attribute named as the metric without prefix."""

    # What METRICS makes, typed (tests/obs/test_metrics_table.py holds the two together).
    claims_won_total: Labelled[CounterSeries]
    claims_lost_total: Labelled[CounterSeries]
    claim_duplicate_acks_total: Counter
    claims_skipped_total: Labelled[CounterSeries]
    claim_errors_total: Labelled[CounterSeries]
    claims_deferred_total: Labelled[CounterSeries]
    claim_ack_seconds: ByJobHistogram
    runs_total: Labelled[CounterSeries]
    run_duration_seconds: ByJobHistogram
    run_start_delay_seconds: ByJobHistogram
    runs_in_progress: Labelled[ShownGauge]
    job_next_run_timestamp_seconds: NextRunGauge
    job_last_success_timestamp_seconds: Labelled[ShownGauge]
    stream_messages: Gauge
    stream_bytes: Gauge
    stream_history_size: Gauge
    stream_duplicate_window_seconds: Gauge
    stream_replicas: Gauge
    stream_covers_job: Labelled[ShownGauge]
    job_paused: Labelled[ShownGauge]
    job_paused_until_timestamp_seconds: Labelled[ShownGauge]
    job_skips_pending: Labelled[ShownGauge]
    job_backfill_pending: Labelled[ShownGauge]
    job_at_pending: Labelled[ShownGauge]
    runs_skipped_total: Labelled[CounterSeries]
    runs_lost_total: Labelled[CounterSeries]
    runs_replaced_total: Labelled[CounterSeries]
    cancel_requests_failed_total: Labelled[CounterSeries]
    runs_buffered_total: Labelled[CounterSeries]
    concurrency_slots_held: Labelled[ShownGauge]
    every_slots_missed_total: Labelled[CounterSeries]
    chain_links_total: Labelled[CounterSeries]
    attempts_due_total: Labelled[CounterSeries]
    retries_exhausted_total: Labelled[CounterSeries]
    lease_renewal_failures_total: Labelled[CounterSeries]
    fleet_instances: Gauge
    fleet_config_mismatch: Gauge
    hostile_input_total: Counter
    state_bucket_ok: Gauge
    state_bucket_checks_total: Counter
    state_bucket_fixed_total: Counter
    nats_permission_denied_total: Counter
    stream_raised_total: Counter
    nats_connected: Gauge
    nats_reconnects_total: Counter
    pings_total: Labelled[CounterSeries]
    notifications_total: Counter
    runs_anomalous_total: Labelled[CounterSeries]
    runs_overdue: Labelled[ShownGauge]
    job_consecutive_failures: Labelled[ShownGauge]
    job_auto_paused: Labelled[ShownGauge]
    build_info: Gauge

    def __init__(
        self,
        registry: CollectorRegistry,
        per_job_histograms: tuple[str, ...] = (),
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``per_job_histograms``: globs of the jobs whose histograms have a series of
        their own (``metrics.per_job_histograms``); ``wall``: the clock's Unix time."""
        self.registry = registry
        self.wall = wall
        self._per_job_histograms = per_job_histograms
        for spec in METRICS:
            setattr(self, spec.name, self._make(spec))
        self.build_info.labels(version=__version__).set(1)

    def _make(self, spec: Spec) -> object:
        """The metric of one row of METRICS, registered on the registry."""
        registry, labels, doc = self.registry, spec.labelnames, spec.doc
        if spec.kind == "counter":
            counter = Counter(spec.name, doc, labels, namespace=PREFIX, registry=None)
            registry.register(NoCreated(counter))
            for values in spec.at_start:
                counter.labels(*values)
            return counter
        if spec.kind == "gauge":
            return Gauge(spec.name, doc, labels, namespace=PREFIX, registry=registry)
        full = f"{PREFIX}_{spec.name}"
        if spec.kind == "job_counter":
            on_new = self._first_claim if spec.first_claim else None
            name = full.removesuffix("_total")  # CounterSeries writes it
            return Labelled(registry, "counter", name, doc, labels, CounterSeries, on_new)
        if spec.kind == "job_gauge":
            return Labelled(registry, "gauge", full, doc, labels, spec.series, shown=shown)
        if spec.kind == "next_run":  # no series a waiting job; a scrape costs what it writes
            return NextRunGauge(registry, full, doc, labels, lambda: self.wall())
        bounds = (*spec.buckets, INF)
        les = tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]
        series = functools.partial(HistogramSeries, bounds, les)
        return ByJobHistogram(registry, full, doc, series, self._per_job)

    def _per_job(self, job: str) -> bool:
        return any(fnmatchcase(job, glob) for glob in self._per_job_histograms)

    def _first_claim(self, key: tuple[str, ...]) -> None:
        """A job's first claim here (won or lost): its series that the alert rules
        count with increase() start at 0 now, so that the first failure, loss or
        exhausted retry counts (a series born at 1 has no increase), and its next
        run is shown from now on."""
        (job,) = key
        for metric in (
            self.claims_won_total,
            self.claims_lost_total,
            self.runs_lost_total,
            self.retries_exhausted_total,
        ):
            metric.add(job)
        self.runs_total.add(job, "failed")
        self.job_next_run_timestamp_seconds.claimed(job)
