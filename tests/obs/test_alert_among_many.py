"""Issue 49: one failing job among 1,500 that wait for their yearly slot.

A real Prometheus with the shipped scrape settings and rule file scrapes a real
sidecar (real nats-server, real app): the alerts name the job that broke, and
the 1,500 jobs that have said nothing yet cost no series on /metrics.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.obs.test_observability import SCRAPE_JOB, prometheus_binary, prometheus_scraping
from tests.support import NatsServer, RecordingApp, sidecars, wait_for

IDLE = 1500


def alerts(prom: Any) -> list[dict[str, Any]]:
    return list(prom.api("/api/v1/alerts")["alerts"])


def test_one_failing_job_among_many_fires_its_alerts_by_name(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    prometheus_binary()  # skip or fail before starting anything
    http_app.status["/jobs/broken"] = 500
    # A slot on the first day of a month half a year away, at a minute of its own:
    # none is due within the hour (on 1 January they were, every New Year's Eve).
    month = (time.gmtime().tm_mon + 5) % 12 + 1
    idle = [
        {"name": f"tenant-{i:05d}", "schedule": f"{i % 60} {i % 24} 1 {month} *"}
        for i in range(IDLE)
    ]
    broken = {
        "name": "broken",
        "schedule": "* * * * * *",
        "jitter": "0s",
        "max_late": "5s",
        # Enough failures for Prometheus (started after the sidecar) to see a rate.
        "pause_after": 8,
    }
    config = {
        "nats": {"servers": [nats_server.url]},
        "target": {"url": http_app.url},
        "jobs": [*idle, broken],
    }
    with (
        sidecars(tmp_path, [("a", config, {})]) as (proc,),
        prometheus_scraping(tmp_path / "prometheus", [f"127.0.0.1:{proc.metrics_port}"]) as prom,
    ):
        wait_for(
            lambda: prom.query(f'up{{job="{SCRAPE_JOB}"}} == 1'), 30, what="the sidecar scraped"
        )
        # pause_after: 8 failed runs in a row paused it everywhere; the critical
        # alert (no `for`) fires naming the job.
        firing = wait_for(
            lambda: [
                a
                for a in alerts(prom)
                if a["labels"]["alertname"] == "AnarchonJobAutoPaused" and a["state"] == "firing"
            ],
            60,
            what="AnarchonJobAutoPaused firing",
        )
        assert [a["labels"]["job"] for a in firing] == ["broken"]
        assert firing[0]["labels"]["severity"] == "critical"
        # The runs failed in the last minutes: AnarchonRunsFailing (for: 10m) is
        # pending for that job, and nothing names another job.
        failing = [a for a in alerts(prom) if a["labels"]["alertname"] == "AnarchonRunsFailing"]
        assert [(a["labels"]["job"], a["state"]) for a in failing] == [("broken", "pending")]
        named = {a["labels"].get("job") for a in alerts(prom)}
        assert named == {"broken"}, alerts(prom)

        # The jobs that waited said nothing: no series of theirs on /metrics or in
        # Prometheus. The broken one has what it said: its claims, failures and
        # alert counters, next run, runs in progress, failures in a row, its
        # (auto) pause, and the slots skipped since (claimed and recorded).
        _, body = proc.get("/metrics")
        assert 'job="tenant-' not in body
        per_job = [line for line in body.splitlines() if 'job="broken"' in line]
        assert 8 <= len(per_job) <= 14, per_job
        assert prom.query('count({__name__=~"anarchon_.+", job=~"tenant-.+"})') == []
