"""The metrics are made from their table (sidecar/obs/metric_table.py), without a
``_created`` series, and without touching prometheus_client's process-wide switch."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import typing

import prometheus_client.metrics
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from sidecar.obs.exposition import render
from sidecar.obs.metric_series import ByJobHistogram, CounterSeries, Labelled, ShownGauge
from sidecar.obs.metric_table import METRICS
from sidecar.obs.metrics import Metrics, NextRunGauge
from tests.support import ROOT, sidecar_env

# What a row of each kind makes, as Metrics' annotations type it.
MADE: dict[str, object] = {
    "counter": Counter,
    "gauge": Gauge,
    "job_counter": Labelled[CounterSeries],
    "job_gauge": Labelled[ShownGauge],
    "next_run": NextRunGauge,
    "job_histogram": ByJobHistogram,
}

# Imports the metrics, makes them, scrapes them: the switch before and after.
PROGRAM = """
import json
import prometheus_client.metrics as pm
from prometheus_client import CollectorRegistry, generate_latest
before = pm._use_created
from sidecar.obs.metrics import Metrics
registry = CollectorRegistry()
Metrics(registry).nats_reconnects_total.inc()
body = generate_latest(registry).decode()
print(json.dumps([before, pm._use_created, "_created" in body]))
"""


def test_importing_the_metrics_leaves_prometheus_clients_created_switch_alone() -> None:
    env = sidecar_env()
    env.pop("PROMETHEUS_DISABLE_CREATED_SERIES", None)
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=True,
    ).stdout
    # On before and after (another library's counters in the process keep theirs);
    # none of ours is written all the same.
    assert json.loads(out) == [True, True, False]


def test_no_created_series_while_prometheus_client_writes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prometheus_client.metrics, "_use_created", True)
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.nats_reconnects_total.inc()
    metrics.hostile_input_total.labels(what="value").inc()
    metrics.notifications_total.labels(event="lost", outcome="sent").inc()
    metrics.runs_total.labels(job="a", status="succeeded").inc()
    metrics.run_duration_seconds.labels(job="a").observe(0.5)
    # The switch is on: a counter of prometheus_client's own writes its _created.
    stock = CollectorRegistry()
    Counter("stock", "A plain counter.", registry=stock).inc()
    assert b"stock_created" in generate_latest(stock)

    for body in (generate_latest(registry), asyncio.run(render(registry))):
        assert b"_created" not in body
        assert b"anarchon_nats_reconnects_total 1.0\n" in body
        assert b'anarchon_hostile_input_total{what="value"} 1.0\n' in body
    assert registry.get_sample_value("anarchon_nats_reconnects_total") == 1.0
    assert registry.get_sample_value("anarchon_nats_reconnects_created") is None


def test_every_row_of_the_table_is_an_attribute_typed_as_its_kind() -> None:
    hints = typing.get_type_hints(Metrics)
    names = [spec.name for spec in METRICS]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(name for name in hints if not name.startswith("_"))
    metrics = Metrics(CollectorRegistry())
    for spec in METRICS:
        assert hints[spec.name] == MADE[spec.kind], spec.name
        made = getattr(metrics, spec.name)
        assert isinstance(made, typing.get_origin(MADE[spec.kind]) or MADE[spec.kind])  # type: ignore[arg-type]
        # The exposed name is the attribute's, prefixed (counters: with _total).
        family = next(iter(made.describe()))
        suffix = "_total" if family.type == "counter" else ""
        assert f"{family.name}{suffix}" == f"anarchon_{spec.name}", spec.name
        assert family.documentation == spec.doc
