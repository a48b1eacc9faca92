"""Observability: the metric names of docs/METRICS.md, the Grafana dashboard, the alert rules.

The static tests read the shipped files. The end-to-end test starts a real
Prometheus scraping two real sidecars (against a real nats-server and app)
with the shipped scrape settings and rule file, and evaluates every dashboard
and rule expression through Prometheus's HTTP API.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sysconfig
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from sidecar.obs.metric_series import ByJobHistogram, Labelled
from sidecar.obs.metrics import Metrics
from tests.support import ROOT, NatsServer, RecordingApp, free_port, sidecars, wait_for

DASHBOARD = ROOT / "grafana" / "dashboards" / "anarchon-sidecar.json"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "anarchon-sidecar.rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "anarchon-sidecar.test.yml"
RUNBOOK = ROOT / "docs" / "RUNBOOK.md"
METRICS_DOC = ROOT / "docs" / "METRICS.md"
SCRAPE_JOB = "anarchon-sidecar"

# docs/METRICS.md's metrics: name -> (type, labels). `job` wherever per job.
SPEC_METRICS: dict[str, tuple[str, frozenset[str]]] = {
    "anarchon_claims_won_total": ("counter", frozenset({"job"})),
    "anarchon_claims_lost_total": ("counter", frozenset({"job"})),
    # Per sidecar since issue 49: per job it counted what claims_lost does.
    "anarchon_claim_duplicate_acks_total": ("counter", frozenset()),
    "anarchon_claims_skipped_total": ("counter", frozenset({"job", "reason"})),
    "anarchon_claim_errors_total": ("counter", frozenset({"job"})),
    # claim.candidates (docs/METRICS.md): slots left to their candidates.
    "anarchon_claims_deferred_total": ("counter", frozenset({"job", "outcome"})),
    # The histograms: one series for every job (issue 49), a series of its own
    # only for a job that metrics.per_job_histograms lists.
    "anarchon_claim_ack_seconds": ("histogram", frozenset()),
    "anarchon_runs_total": ("counter", frozenset({"job", "status"})),
    "anarchon_run_duration_seconds": ("histogram", frozenset()),
    "anarchon_run_start_delay_seconds": ("histogram", frozenset()),
    "anarchon_runs_in_progress": ("gauge", frozenset({"job"})),
    "anarchon_job_next_run_timestamp_seconds": ("gauge", frozenset({"job"})),
    "anarchon_job_last_success_timestamp_seconds": ("gauge", frozenset({"job"})),
    "anarchon_stream_messages": ("gauge", frozenset()),
    "anarchon_stream_bytes": ("gauge", frozenset()),
    "anarchon_stream_history_size": ("gauge", frozenset()),
    "anarchon_stream_duplicate_window_seconds": ("gauge", frozenset()),
    "anarchon_stream_replicas": ("gauge", frozenset()),
    # The stream guard of issue 21 (docs/METRICS.md).
    "anarchon_stream_covers_job": ("gauge", frozenset({"job"})),
    "anarchon_stream_raised_total": ("counter", frozenset()),
    # Leases, attempts and lost runs.
    "anarchon_job_paused": ("gauge", frozenset({"job"})),
    # Schedules (docs/METRICS.md): a timed pause's end, the slots `skip` holds back.
    "anarchon_job_paused_until_timestamp_seconds": ("gauge", frozenset({"job"})),
    "anarchon_job_skips_pending": ("gauge", frozenset({"job"})),
    "anarchon_job_backfill_pending": ("gauge", frozenset({"job"})),
    "anarchon_job_at_pending": ("gauge", frozenset({"job"})),
    "anarchon_fleet_instances": ("gauge", frozenset()),
    "anarchon_fleet_config_mismatch": ("gauge", frozenset()),
    "anarchon_runs_skipped_total": ("counter", frozenset({"job", "reason"})),
    "anarchon_runs_lost_total": ("counter", frozenset({"job"})),
    "anarchon_attempts_due_total": ("counter", frozenset({"job", "reason"})),
    "anarchon_lease_renewal_failures_total": ("counter", frozenset({"job"})),
    # The alert on retries exhausted needs it (docs/METRICS.md).
    "anarchon_retries_exhausted_total": ("counter", frozenset({"job"})),
    # overlap: replace and buffer_one (issue 42 item 4, docs/METRICS.md).
    "anarchon_runs_replaced_total": ("counter", frozenset({"job"})),
    "anarchon_cancel_requests_failed_total": ("counter", frozenset({"job"})),
    "anarchon_runs_buffered_total": ("counter", frozenset({"job"})),
    # jobs[].concurrency (issue 50 item 3, docs/METRICS.md).
    "anarchon_concurrency_slots_held": ("gauge", frozenset({"job"})),
    # run_on: every and after (issue 50, docs/METRICS.md).
    "anarchon_every_slots_missed_total": ("counter", frozenset({"job", "reason"})),
    "anarchon_chain_links_total": ("counter", frozenset({"job", "outcome"})),
    # Telling people (issue 29): pings, notifications, pause_after, expect.
    "anarchon_pings_total": ("counter", frozenset({"job", "kind", "outcome"})),
    "anarchon_notifications_total": ("counter", frozenset({"event", "outcome"})),
    "anarchon_runs_anomalous_total": ("counter", frozenset({"job", "kind"})),
    "anarchon_runs_overdue": ("gauge", frozenset({"job"})),
    "anarchon_job_consecutive_failures": ("gauge", frozenset({"job"})),
    "anarchon_job_auto_paused": ("gauge", frozenset({"job"})),
    # The state bucket checked like the stream, hostile input, permissions (issue 25).
    "anarchon_hostile_input_total": ("counter", frozenset({"what"})),
    "anarchon_state_bucket_ok": ("gauge", frozenset()),
    "anarchon_state_bucket_checks_total": ("counter", frozenset()),
    "anarchon_state_bucket_fixed_total": ("counter", frozenset()),
    "anarchon_nats_permission_denied_total": ("counter", frozenset({"operation"})),
    "anarchon_nats_connected": ("gauge", frozenset()),
    "anarchon_nats_reconnects_total": ("counter", frozenset()),
    "anarchon_build_info": ("gauge", frozenset({"version"})),
}
SPEC_LABEL_VALUES = {
    "reason": {
        "late",
        "disconnected",
        "shutdown",
        "stream",
        "paused",
        "bucket",
        "overlap",
        "retry",
        "lost",
        "excluded",
        "skip",
        "max_runs",
        "concurrency",
        "unanswered",
        "away",
        "stopped",
    },
    "status": {"succeeded", "failed", "skipped", "lost"},
    "what": {
        "due_key",
        "backfill_key",
        "value",
        "at_key",
        "job",
        "lock_key",
        "buffer_key",
        "stop_key",
        "conc_key",
        "unknown_key",
        "result",
    },
    "operation": {"publish", "subscribe"},
}
# The reasons of each metric with a reason label.
REASONS = {
    "anarchon_claims_skipped_total": {
        "late",
        "disconnected",
        "shutdown",
        "stream",
        "paused",
        "bucket",
        "excluded",
        "skip",
    },
    "anarchon_runs_skipped_total": {
        "overlap",
        "late",
        "bucket",
        "paused",
        "excluded",
        "skip",
        "max_runs",
        "concurrency",
        "unanswered",
    },
    "anarchon_attempts_due_total": {"retry", "lost"},
    "anarchon_every_slots_missed_total": {"away", "stopped"},
}
# Per-job series that a healthy job running every second never makes (issue 49:
# a job's series exist once it has something to say). The end-to-end test runs
# the queries that read only these, without asking them for series.
MADE_ON_USE = {
    "anarchon_claims_skipped_total",
    "anarchon_claim_errors_total",
    "anarchon_claims_deferred_total",
    "anarchon_stream_covers_job",
    "anarchon_job_paused",
    "anarchon_job_paused_until_timestamp_seconds",
    "anarchon_job_skips_pending",
    "anarchon_job_backfill_pending",
    "anarchon_job_at_pending",
    "anarchon_runs_skipped_total",
    "anarchon_attempts_due_total",
    "anarchon_lease_renewal_failures_total",
    "anarchon_runs_replaced_total",
    "anarchon_cancel_requests_failed_total",
    "anarchon_runs_buffered_total",
    "anarchon_runs_anomalous_total",
    "anarchon_runs_overdue",
    "anarchon_concurrency_slots_held",
    "anarchon_every_slots_missed_total",
    "anarchon_chain_links_total",
    "anarchon_job_consecutive_failures",
    "anarchon_job_auto_paused",
}
KINDS = {"anarchon_runs_anomalous_total": {"short", "long"}}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
NEXT_RUN = "anarchon_job_next_run_timestamp_seconds"
ALERTS = {
    "AnarchonJobNoRecentSuccess",
    "AnarchonRunsFailing",
    "AnarchonSlotNotClaimed",
    "AnarchonClaimErrors",
    "AnarchonSidecarDown",
    "AnarchonNatsDisconnected",
    "AnarchonStreamConfigMismatch",
    "AnarchonStreamTooWeak",
    "AnarchonStreamLowered",
    "AnarchonJobPausedLong",
    "AnarchonFleetConfigMismatch",
    "AnarchonRunLost",
    "AnarchonRetriesExhausted",
    "AnarchonOverlapSkipsPersist",
    "AnarchonConcurrencySkipsPersist",
    "AnarchonEveryInstanceMissedSlot",
    "AnarchonJobAutoPaused",
    "AnarchonRunOverdue",
    "AnarchonRunsAnomalous",
    "AnarchonPingsFailing",
    "AnarchonNotificationsFailing",
    "AnarchonNatsPermissionDenied",
    "AnarchonStateBucketUnfit",
    "AnarchonHostileInput",
}
# Alert expressions that may match on a healthy fleet, and why. Every other
# alert expression must be empty while the sidecars run normally.
MAY_MATCH_WHEN_HEALTHY = {
    # With a 1 s schedule, two periods are about 2 s, the same as one scrape
    # interval plus one evaluation interval: time since the last success seen
    # by Prometheus crosses it now and then. `for: 5m` keeps it from firing.
    "AnarchonJobNoRecentSuccess",
}
# Grafana's built-in variables as a dashboard with a 1 s scrape interval gets
# them: $__rate_interval = max(4 x scrape interval, $__interval + scrape interval).
GRAFANA_VARIABLES = {"$__rate_interval": "4s", "$__interval": "1s", "$__range": "5m"}

SELECTOR = re.compile(r"(?<![\w:])((?:[a-z_]+:)?anarchon_[a-z_:]*[a-z_]|up)\b(\{[^}]*\})?")
RANGE = re.compile(r"\[([^\]]*)\]")
COMPARISON = re.compile(r"==|!=|>=|<=|>|<")


def load_dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def dashboard_panels() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in load_dashboard()["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows hold their panels
    return panels


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard_panels()
        for target in panel.get("targets", [])
    ]


def load_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alert_rules() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in load_rules() if "alert" in rule}


def family_of(name: str) -> str | None:
    """The docs/METRICS.md metric a sample name belongs to (histogram suffixes stripped)."""
    if name in SPEC_METRICS:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and SPEC_METRICS.get(base, ("",))[0] == "histogram":
            return base
    return None


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, matchers text) of every selector of our metrics (and `up`) in expr."""
    return [(m.group(1), m.group(2) or "") for m in SELECTOR.finditer(expr)]


def with_bool(expr: str) -> str:
    """expr with every comparison made a `bool` one: it reports 0 or 1 instead of filtering.

    Label matchers (inside braces) and strings are left alone.
    """
    out: list[str] = []
    i, depth, quote = 0, 0, ""
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\":
                out.append(expr[i + 1])
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'`":
            quote = c
            out.append(c)
        elif c == "{":
            depth += 1
            out.append(c)
        elif c == "}":
            depth -= 1
            out.append(c)
        elif depth == 0 and (m := COMPARISON.match(expr, i)):
            out.append(m.group() + " bool")
            i = m.end()
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def on_use_only(expr: str) -> bool:
    """Whether every metric expr reads is one a healthy job does not make (MADE_ON_USE)."""
    return all(family_of(name) in MADE_ON_USE for name, _ in selectors(expr))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


# --------------------------------------------------------------------------- metrics


def said_everything(metrics: Metrics, job: str) -> None:
    """Give every per-job series of `job` something to say (a job's series exist
    only then): each label value of SPEC_LABEL_VALUES, 2 in every gauge."""
    for series in vars(metrics).values():
        if not isinstance(series, Labelled):
            continue
        if isinstance(series, ByJobHistogram):
            series.labels(job=job).observe(1)
            continue
        names = [n for n in series.labelnames if n != "job"]
        choices = {
            "reason": REASONS.get(series.name + "_total", ()),
            "status": SPEC_LABEL_VALUES["status"],
            "kind": KINDS.get(series.name + "_total", ("start", "success", "fail")),
            "outcome": ("sent", "failed") if "pings" in series.name else ("seen", "fallback"),
        }
        combos: list[dict[str, str]] = [{}]
        for name in names:
            combos = [{**c, name: v} for c in combos for v in sorted(choices[name])]
        for combo in combos:
            one = series.labels(job=job, **combo)
            one.inc(2) if series.kind == "counter" else one.set(2)


def test_metrics_match_spec_names_types_and_labels() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    said_everything(metrics, "j")
    found: dict[str, tuple[str, frozenset[str]]] = {}
    values: dict[str, set[str]] = {}
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
            for key, value in sample.labels.items():
                values.setdefault(key, set()).add(value)
        found[name] = (family.type, frozenset(labels))
    # The histograms have a job label only for the jobs listed: none here.
    assert found == SPEC_METRICS
    for label, expected in SPEC_LABEL_VALUES.items():
        assert values[label] == expected, label
    assert values["job"] == {"j"}


def per_job_lines(body: str, job: str) -> list[str]:
    return [line for line in body.splitlines() if f'job="{job}"' in line]


def test_a_job_has_no_series_until_it_has_something_to_say() -> None:
    """Issue 49: no series made for a job that never ran, at most ~10 for one that
    did, and the counters the alerts count with increase() at 0 from its first claim.
    (Replaces the test that every per-job series exists at 0 from the start.)"""
    registry = CollectorRegistry()
    now = [1_800_000_000.0]
    metrics = Metrics(registry, wall=lambda: now[0])
    for i in range(1000):  # waiting for a slot a year away, as the fleet's jobs do
        metrics.job_next_run_timestamp_seconds.labels(job=f"idle-{i}").set(now[0] + 3e7)
        metrics.stream_covers_job.labels(job=f"idle-{i}").set(1)
        metrics.job_paused.labels(job=f"idle-{i}").set(0)
    body = generate_latest(registry).decode()
    assert per_job_lines(body, "idle-7") == []
    assert 'job="' not in body
    # Its slot comes within the hour: its next run is shown, and stays shown.
    metrics.job_next_run_timestamp_seconds.labels(job="idle-7").set(now[0] + 600)
    assert registry.get_sample_value(NEXT_RUN, {"job": "idle-7"}) == now[0] + 600
    metrics.job_next_run_timestamp_seconds.labels(job="idle-7").set(now[0] + 3e7)
    assert registry.get_sample_value(NEXT_RUN, {"job": "idle-7"}) == now[0] + 3e7

    # A job that claims, succeeds and fails, as a busy job does.
    job = {"job": "busy"}
    metrics.job_next_run_timestamp_seconds.labels(**job).set(now[0] + 3e7)
    metrics.claims_lost_total.labels(**job).inc()
    for name in ("claims_won", "runs_lost", "retries_exhausted"):
        assert registry.get_sample_value(f"anarchon_{name}_total", job) == 0.0, name
    assert registry.get_sample_value("anarchon_runs_total", {**job, "status": "failed"}) == 0.0
    assert registry.get_sample_value(NEXT_RUN, job) == now[0] + 3e7
    metrics.claims_won_total.labels(**job).inc()
    metrics.claim_ack_seconds.labels(**job).observe(0.001)
    metrics.claim_duplicate_acks_total.inc()
    metrics.runs_in_progress.labels(**job).inc()
    metrics.run_start_delay_seconds.labels(**job).observe(0.1)
    metrics.run_duration_seconds.labels(**job).observe(1)
    metrics.runs_in_progress.labels(**job).dec()
    metrics.runs_total.labels(**job, status="succeeded").inc()
    metrics.runs_total.labels(**job, status="failed").inc()
    metrics.job_last_success_timestamp_seconds.labels(**job).set(now[0])
    metrics.stream_covers_job.labels(**job).set(1)
    metrics.job_paused.labels(**job).set(0)
    lines = per_job_lines(generate_latest(registry).decode(), "busy")
    assert 8 <= len(lines) <= 10, lines
    assert not any("_bucket" in line for line in lines)
    assert registry.get_sample_value("anarchon_run_duration_seconds_count") == 1.0


def test_jobs_listed_have_histograms_of_their_own() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, ("nightly-*", "billing"))
    for name in ("nightly-eu", "billing", "other", "billing-2"):
        metrics.run_duration_seconds.labels(job=name).observe(0.2)
    count = "anarchon_run_duration_seconds_count"
    assert registry.get_sample_value(count, {"job": "nightly-eu"}) == 1.0
    assert registry.get_sample_value(count, {"job": "billing"}) == 1.0
    assert registry.get_sample_value(count, {"job": "other"}) is None
    assert registry.get_sample_value(count) == 2.0  # other and billing-2


def test_a_gauge_once_shown_stays_and_stream_covers_job_shows_only_a_gap() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.job_paused.labels(job="j").set(1)
    metrics.job_paused.labels(job="j").set(0)  # a resume: seen as 0, not as a gap
    assert registry.get_sample_value("anarchon_job_paused", {"job": "j"}) == 0.0
    covers = "anarchon_stream_covers_job"
    metrics.stream_covers_job.labels(job="j").set(1)
    assert registry.get_sample_value(covers, {"job": "j"}) is None
    metrics.stream_covers_job.labels(job="j").set(0)
    assert registry.get_sample_value(covers, {"job": "j"}) == 0.0
    metrics.stream_covers_job.labels(job="j").set(1)
    assert registry.get_sample_value(covers, {"job": "j"}) == 1.0


# --------------------------------------------------------------------------- dashboard


def test_dashboard_identity_and_variables() -> None:
    dash = load_dashboard()
    assert dash["uid"] == "anarchon-sidecar"
    assert dash["schemaVersion"] >= 41
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    expected_queries = {
        "job": "label_values(anarchon_job_next_run_timestamp_seconds, job)",
        "instance": "label_values(anarchon_build_info, instance)",
    }
    for name, query in expected_queries.items():
        var = variables[name]
        assert var["type"] == "query"
        assert var["multi"] is True and var["includeAll"] is True, name
        assert var["allValue"] == ".*", name
        assert var["datasource"]["uid"] == "${datasource}", name
        assert var["query"]["query"] == var["definition"] == query, name


def test_dashboard_panels_have_title_description_unit_and_the_datasource_variable() -> None:
    titles = {}
    for panel in dashboard_panels():
        assert panel.get("title"), panel
        if panel["type"] == "row":
            continue
        title = panel["title"]
        assert panel.get("description"), title
        assert panel["fieldConfig"]["defaults"].get("unit"), title
        assert panel["datasource"]["uid"] == "${datasource}", title
        assert panel["targets"], title
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"])["uid"] == "${datasource}"
        titles[panel["id"]] = title
    assert len(titles) == len(set(titles.values())), "panel titles repeat"
    rows = [p["title"] for p in load_dashboard()["panels"] if p["type"] == "row"]
    assert rows == [
        "Claims",
        "Runs",
        "Schedule",
        "Stream",
        "NATS",
        "Fleet",
        "Telling people",
        "Pause, skip, backfill",
    ]


def test_dashboard_queries_are_filtered_and_use_rate_interval() -> None:
    shown: set[str] = set()
    for title, expr in dashboard_exprs():
        found = selectors(expr)
        assert found, f"{title}: no anarchon metric in {expr}"
        for name, matchers in found:
            family = family_of(name)
            assert family, f"{title}: {name} is not a metric of docs/METRICS.md"
            shown.add(family)
            has_job = "job" in SPEC_METRICS[family][1]
            assert ('job=~"$job"' in matchers) == has_job, f"{title}: job filter in {expr}"
            assert 'instance=~"$instance"' in matchers, f"{title}: instance filter in {expr}"
        for window in RANGE.findall(expr):
            assert window == "$__rate_interval", f"{title}: [{window}] in {expr}"
        if re.search(r"\b(rate|irate|increase)\(", expr):
            assert "[$__rate_interval]" in expr, f"{title}: {expr}"
    # Every metric of docs/METRICS.md is on the dashboard (build_info feeds $instance).
    assert shown | {"anarchon_build_info"} == set(SPEC_METRICS)


def test_selector_and_bool_helpers() -> None:
    expr = 'max(anarchon_x{a!="b", c=~"d"} > 0) != min(up{j="k"}) or f("<")'
    assert selectors(expr) == [("anarchon_x", '{a!="b", c=~"d"}'), ("up", '{j="k"}')]
    assert (
        with_bool(expr)
        == 'max(anarchon_x{a!="b", c=~"d"} > bool 0) != bool min(up{j="k"}) or f("<")'
    )
    assert selectors("job:anarchon_y:max - time()") == [("job:anarchon_y:max", "")]
    assert family_of("anarchon_claim_ack_seconds_bucket") == "anarchon_claim_ack_seconds"
    assert family_of("anarchon_runs_total_count") is None
    assert github_anchor("AnarchonSlotNotClaimed") == "anarchonslotnotclaimed"
    assert github_anchor("What it means (and why)") == "what-it-means-and-why"


# --------------------------------------------------------------------------- rules and docs


def test_every_alert_has_severity_annotations_and_a_runbook_section() -> None:
    alerts = alert_rules()
    assert set(alerts) == ALERTS
    anchors = {
        github_anchor(line.lstrip("#"))
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("#")
    }
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        path, _, anchor = notes["runbook_url"].partition("#")
        assert path == "docs/RUNBOOK.md", name
        assert anchor == github_anchor(name) and anchor in anchors, name
        # The runbook's index gives the same severity.
        assert f"[{name}](#{anchor}) | {rule['labels']['severity']} |" in RUNBOOK.read_text()


def test_every_rule_file_alert_has_promtool_unit_tests() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert firing == ALERTS
    assert quiet == ALERTS


def test_metrics_doc_describes_every_metric() -> None:
    text = METRICS_DOC.read_text()
    for name in SPEC_METRICS:
        assert f"`{name}" in text, name


# --------------------------------------------------------------------------- end to end


def prometheus_binary() -> str:
    """`make prometheus` puts it into the venv (tests/install-prometheus.sh); else PATH."""
    found = shutil.which("prometheus", path=sysconfig.get_path("scripts")) or shutil.which(
        "prometheus"
    )
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("prometheus is missing under CI: `make test` puts it into .venv/bin")
    pytest.skip("prometheus is not installed: `make prometheus` puts it into .venv/bin")


class Prometheus:
    """A real Prometheus server on a free loopback port with a temporary store."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    prometheus_binary(),
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(self.ready, 30, what="prometheus ready")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def ready(self) -> bool:
        if self.proc and self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log_path.read_text()}")
        try:
            with urllib.request.urlopen(self.url("/-/ready"), timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def url(self, path: str, **params: str) -> str:
        query = urllib.parse.urlencode(params)
        return f"http://127.0.0.1:{self.port}{path}" + (f"?{query}" if query else "")

    def api(self, path: str, **params: str) -> Any:
        """`data` of an API answer; AssertionError with Prometheus's message on an error."""
        try:
            with urllib.request.urlopen(self.url(path, **params), timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            with exc:
                body = json.load(exc)
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return list(data["result"])


@contextlib.contextmanager
def prometheus_scraping(workdir: Path, targets: list[str]) -> Iterator[Prometheus]:
    """Prometheus with the shipped scrape settings and rules, at 1 s intervals."""
    shipped = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    (scrape,) = [s for s in shipped["scrape_configs"] if s["job_name"] == SCRAPE_JOB]
    scrape = {
        **scrape,
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "static_configs": [{"targets": targets}],
    }
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [scrape],
    }
    workdir.mkdir()
    server = Prometheus(workdir, config)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def grafana_regex(values: list[str]) -> str:
    """A multi-value selection as Grafana's Prometheus data source writes it into a query."""
    escaped = [re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m.group(), v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in sorted({**GRAFANA_VARIABLES, **variables}.items(), key=lambda x: -len(x[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown variable left in {expr}"
    return expr


def rules_evaluated(prom: Prometheus) -> list[dict[str, Any]]:
    """The loaded rules once each has been evaluated at least once."""
    rules = [r for g in prom.api("/api/v1/rules")["groups"] for r in g["rules"]]
    if not rules or any(r["lastEvaluation"].startswith("0001") for r in rules):
        return []
    return rules


def test_dashboard_and_rules_evaluate_against_live_sidecars(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    prometheus_binary()  # skip or fail before starting anything
    config = {
        "nats": {"servers": [nats_server.url]},
        "target": {"url": http_app.url},
        "jobs": [{"name": "tick", "schedule": "* * * * * *", "jitter": "0s", "max_late": "5s"}],
        # Pings have series for the jobs that have one.
        "defaults": {"ping": {"url": f"{http_app.url}/ping/{{job}}"}},
    }
    with (
        sidecars(tmp_path, [("a", config, {}), ("b", config, {})]) as procs,
        prometheus_scraping(
            tmp_path / "prometheus", [f"127.0.0.1:{p.metrics_port}" for p in procs]
        ) as prom,
    ):
        instances = sorted(f"127.0.0.1:{p.metrics_port}" for p in procs)

        # Both targets up, a run succeeded somewhere, and rates have samples.
        wait_for(
            lambda: (
                len(prom.query(f'up{{job="{SCRAPE_JOB}"}} == 1')) == 2
                and prom.query('anarchon_job_last_success_timestamp_seconds{job="tick"} > 0')
                and prom.query('rate(anarchon_runs_total{status="succeeded"}[4s]) > 0')
            ),
            30,
            what="samples of both sidecars in prometheus, with job as the cron job's name",
        )

        # The variables' label_values queries, as Grafana sends them.
        dash_vars = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
        options = {}
        for name in ("job", "instance"):
            metric = re.fullmatch(rf"label_values\((\w+), {name}\)", dash_vars[name]["definition"])
            assert metric, dash_vars[name]["definition"]
            options[name] = prom.api(f"/api/v1/label/{name}/values", **{"match[]": metric[1]})
        assert options == {"job": ["tick"], "instance": instances}

        # Every dashboard query returns series, with "All" and with chosen values.
        selections = [
            {"$job": ".*", "$instance": ".*"},
            {"$job": grafana_regex(["tick"]), "$instance": grafana_regex(instances)},
        ]
        for variables in selections:
            for title, expr in dashboard_exprs():
                query = substitute(expr, variables)
                prom.query(query)  # a query that does not parse or run fails here at once
                if on_use_only(expr):
                    continue  # runs; its series come with what they count (MADE_ON_USE)
                wait_for(lambda q=query: prom.query(q), 10, what=f"series of {title}: {query}")

        # Every rule loaded and evaluated without error.
        loaded = wait_for(lambda: rules_evaluated(prom), 20, what="rules evaluated")
        assert {r["name"] for r in loaded} == {r.get("alert") or r["record"] for r in load_rules()}
        for rule in loaded:
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))

        for rule in load_rules():
            name, expr = rule.get("alert") or rule["record"], rule["expr"]
            # Every metric it reads (and every recorded series) has series.
            prom.query(expr)  # parses and runs
            for metric, matchers in selectors(expr):
                if family_of(metric) in MADE_ON_USE:
                    continue
                wait_for(lambda s=metric + matchers: prom.query(s), 10, what=f"{name}: {metric}")
            if "record" in rule:
                assert prom.query(expr), f"recording rule {name} gives no series"
                continue
            # The comparisons as `bool` see the series they compare...
            if not on_use_only(expr):
                assert prom.query(with_bool(expr)), f"{name}: {with_bool(expr)}"
            # ...and none of them crosses its threshold on a healthy fleet.
            matched = prom.query(expr)
            if name not in MAY_MATCH_WHEN_HEALTHY:
                assert matched == [], f"{name} matches on healthy sidecars: {matched}"
