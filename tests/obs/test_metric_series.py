"""The lean per-job series expose what prometheus_client's own metrics do, byte for byte."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sidecar.obs.exposition import render
from sidecar.obs.metric_series import (
    CounterSeries,
    GaugeSeries,
    HistogramSeries,
    Labelled,
)
from sidecar.obs.metrics import Metrics

BUCKETS = (0.01, 0.1, 1.0, 10.0)


def lean(registry: CollectorRegistry) -> dict[str, Labelled]:  # type: ignore[type-arg]
    bounds = (*BUCKETS, float("inf"))
    les = ("0.01", "0.1", "1.0", "10.0", "+Inf")
    hist = functools.partial(HistogramSeries, bounds, les)
    return {
        "runs": Labelled(registry, "counter", "t_runs", "Runs.", ("job", "status"), CounterSeries),
        "late": Labelled(registry, "counter", "t_late", "Late.", ("job",), CounterSeries),
        "busy": Labelled(registry, "gauge", "t_busy", "Busy.", ("job",), GaugeSeries),
        "delay": Labelled(registry, "histogram", "t_delay", "Delay.", ("job",), hist),
        "took": Labelled(registry, "histogram", "t_took", "Took.", ("job",), hist),
    }


def reference(registry: CollectorRegistry) -> dict[str, object]:
    def kw(name: str, doc: str, labels: tuple[str, ...]) -> dict[str, object]:
        return {"name": name, "documentation": doc, "labelnames": labels, "registry": registry}

    return {
        "runs": Counter(**kw("t_runs", "Runs.", ("job", "status"))),  # type: ignore[arg-type]
        "late": Counter(**kw("t_late", "Late.", ("job",))),  # type: ignore[arg-type]
        "busy": Gauge(**kw("t_busy", "Busy.", ("job",))),  # type: ignore[arg-type]
        "delay": Histogram(buckets=BUCKETS, **kw("t_delay", "Delay.", ("job",))),  # type: ignore[arg-type]
        "took": Histogram(buckets=BUCKETS, **kw("t_took", "Took.", ("job",))),  # type: ignore[arg-type]
    }


def text(registry: CollectorRegistry) -> bytes:
    # prometheus_client writes _created samples for its own metrics; ours have none.
    return b"\n".join(
        line for line in generate_latest(registry).splitlines() if b"_created" not in line
    )


def test_series_of_many_jobs_expose_what_prometheus_client_does() -> None:
    ours_registry, ref_registry = CollectorRegistry(), CollectorRegistry()
    ours, ref = lean(ours_registry), reference(ref_registry)
    both: list[dict[str, Any]] = [ours, ref]

    for job in (f"job-{i}" for i in range(5)):  # every series made, none moved: all zeros
        for m in both:
            m["runs"].labels(job=job, status="ok")
            m["runs"].labels(job=job, status="failed")
            for name in ("late", "busy", "delay", "took"):
                m[name].labels(job=job)
    assert text(ours_registry) == text(ref_registry)

    # One job's histogram observed: no other series (of this metric, or of the
    # other one with the same labels) moves with it.
    for m in both:
        m["delay"].labels(job="job-1").observe(0.05)
        m["delay"].labels(job="job-1").observe(3.0)
        m["delay"].labels(job="job-3").observe(20.0)
        m["took"].labels(job="job-3").observe(0.005)
        m["runs"].labels(job="job-2", status="ok").inc(2)
        m["late"].labels(job="job-4").inc()
        m["busy"].labels(job="job-0").set(1)
    ours_text = text(ours_registry)
    assert ours_text == text(ref_registry)
    assert b't_delay_bucket{job="job-1",le="0.1"} 1.0' in ours_text
    assert b't_delay_bucket{job="job-2",le="+Inf"} 0.0' in ours_text
    assert b't_took_bucket{job="job-1",le="+Inf"} 0.0' in ours_text

    # The admin server's rendering, piece by piece, writes the same bytes.
    assert asyncio.run(render(ours_registry)) == generate_latest(ours_registry)


def test_series_made_by_add_are_those_labels_makes() -> None:
    """``add`` (the start's way, label values in order) makes what ``labels`` would."""
    ours_registry, ref_registry = CollectorRegistry(), CollectorRegistry()
    ours, ref = lean(ours_registry), reference(ref_registry)
    for job in (f"job-{i}" for i in range(3)):
        ours["runs"].add(job, "ok")
        ours["runs"].add(job, "failed")
        ref["runs"].labels(job=job, status="ok")
        ref["runs"].labels(job=job, status="failed")
        for name in ("late", "busy", "delay", "took"):
            ours[name].add(job)
            ref[name].labels(job=job)
    assert text(ours_registry) == text(ref_registry)

    # labels() finds the series add made; add again leaves a moved one as it is.
    ours["runs"].labels(job="job-1", status="failed").inc(3)
    ours["runs"].add("job-1", "failed")
    ours["delay"].labels(job="job-2").observe(0.05)
    ours["delay"].add("job-2")
    ref["runs"].labels(job="job-1", status="failed").inc(3)
    ref["delay"].labels(job="job-2").observe(0.05)
    ours_text = text(ours_registry)
    assert ours_text == text(ref_registry)
    assert b't_runs_total{job="job-1",status="failed"} 3.0' in ours_text
    assert len(ours["runs"]._series) == 6

    for bad in ((), ("job-1",), ("job-1", "ok", "extra")):
        with pytest.raises(ValueError, match="Incorrect label names"):
            ours["runs"].add(*bad)


def test_label_sets_at_zero_stay_apart_once_written() -> None:
    """Label sets not yet written share one zero series (``add``): writing one never
    moves another, of any kind; a label set never added comes after the added
    ones, as it was made."""
    ours_registry, ref_registry = CollectorRegistry(), CollectorRegistry()
    ours, ref = lean(ours_registry), reference(ref_registry)
    jobs = [f"job-{i}" for i in range(4)]
    for name in ("late", "busy", "delay", "took"):
        for job in jobs:
            ours[name].add(job)
        for job in jobs:
            ref[name].labels(job=job)
    for job in jobs:
        for status in ("ok", "failed"):
            ours["runs"].add(job, status)
    for job in jobs:
        for status in ("ok", "failed"):
            ref["runs"].labels(job=job, status=status)
    for reg in (ours, ref):
        reg["late"].labels(job="job-1").inc(2)
        reg["busy"].labels(job="job-2").set(5)
        reg["busy"].labels(job="job-3").dec(1)
        reg["delay"].labels(job="job-0").observe(0.05)
        reg["took"].labels(job="job-0").observe(7)
        reg["runs"].labels(job="job-3", status="failed").inc()
        reg["runs"].labels(job="job-3", status="lost").inc()  # a status never declared
        reg["late"].labels(job="other").inc()  # a job never declared
    assert text(ours_registry) == text(ref_registry)
    assert ours["late"].labels(job="job-1") is ours["late"].labels(job="job-1")
    assert ours["late"].labels(job="job-0") is not ours["late"].labels(job="job-2")
    assert [key for key, _ in ours["late"].items()] == [(job,) for job in [*jobs, "other"]]
    assert [ours["busy"].written(job) for job in jobs] == [False, False, True, True]
    assert not ours["busy"].written("never-added")


def test_the_jobs_series_are_made_and_stored_once_written() -> None:
    """Issue 49: nothing stored or exposed for a job before it has something to say
    (until then every per-job series was exposed at 0 from the start)."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    assert metrics.claims_won_total._series == {} and metrics.runs_total._series == {}
    assert registry.get_sample_value("anarchon_claims_won_total", {"job": "job-999"}) is None
    labels = {"job": "job-7", "status": "failed"}
    assert registry.get_sample_value("anarchon_runs_total", labels) is None
    metrics.runs_total.labels(**labels).inc()
    assert registry.get_sample_value("anarchon_runs_total", labels) == 1.0
    assert len(metrics.runs_total._series) == 1
    exposed = text(registry).decode()
    assert exposed.count('anarchon_runs_total{job="job-7",status="failed"}') == 1
    assert exposed.count("anarchon_claims_won_total{") == 0


def test_shown_gauges_and_the_histogram_of_all_jobs_render_as_generate_latest() -> None:
    """The scrape's own writer (``render``) and prometheus_client's agree on the
    series issue 49 added: a histogram set without a job label beside a listed
    job's, gauges not written before they leave their quiet value."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, ("listed",))
    for job in ("listed", "other", "more"):
        metrics.run_duration_seconds.labels(job=job).observe(0.2)
    metrics.job_paused.labels(job="quiet").set(0)
    metrics.job_paused.labels(job="said").set(1)
    metrics.stream_covers_job.labels(job="held").set(1)
    metrics.stream_covers_job.labels(job="gap").set(0)
    body = asyncio.run(render(registry))
    assert body == generate_latest(registry)
    text = body.decode()
    assert 'anarchon_run_duration_seconds_count{job="listed"} 1.0' in text
    assert "anarchon_run_duration_seconds_count 2.0" in text
    assert 'job="quiet"' not in text and 'job="held"' not in text
    assert 'anarchon_job_paused{job="said"} 1.0' in text
    assert 'anarchon_stream_covers_job{job="gap"} 0.0' in text
