"""The next-run gauge (sidecar/obs/next_run.py): a scrape costs the series it writes.

Issue 49: with 100,000 jobs waiting for a slot hours away, a scrape looked at
every job's next-run series to find the few within the hour; it took up to
0.8 s on the event loop. What is shown, and when, is unchanged (the rules of
tests/obs/test_observability.py's ``test_a_job_has_no_series_until_...``).
"""

from __future__ import annotations

import asyncio
import calendar
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from sidecar.obs.exposition import render
from sidecar.obs.metrics import Metrics
from sidecar.obs.next_run import NEXT_RUN_HORIZON, SLACK
from tests.support import NatsServer, sidecars, wait_for

NEXT_RUN = "anarchon_job_next_run_timestamp_seconds"
JOBS = 20_000


class Walked(dict[Any, Any]):
    """A series dict that counts the series a scrape walks over."""

    walked = 0

    def items(self) -> Any:
        self.walked += len(self)
        return super().items()

    def values(self) -> Any:
        self.walked += len(self)
        return super().values()

    def __iter__(self) -> Iterator[Any]:
        self.walked += len(self)
        return super().__iter__()


def waiting_jobs() -> tuple[CollectorRegistry, Metrics, list[float], Walked]:
    registry = CollectorRegistry()
    now = [1_800_000_000.0]
    metrics = Metrics(registry, wall=lambda: now[0])
    gauge = metrics.job_next_run_timestamp_seconds
    walked = Walked()
    gauge._series = walked  # counts what a scrape looks at
    for i in range(JOBS):  # a slot hours to a year away, as a tenant's jobs wait
        gauge.labels(job=f"tenant-{i:05d}").set(now[0] + 2 * NEXT_RUN_HORIZON + i * 1000)
    return registry, metrics, now, walked


def test_a_scrape_looks_at_the_jobs_it_writes_not_at_every_job() -> None:
    registry, metrics, now, walked = waiting_jobs()
    walked.walked = 0
    body = asyncio.run(render(registry)).decode()
    assert 'job="' not in body
    assert generate_latest(registry).decode().count(NEXT_RUN + "{") == 0
    # The clock reaches the first three jobs' hour: a scrape shows them, and only
    # them, without looking at the others.
    now[0] += NEXT_RUN_HORIZON + 2500
    body = asyncio.run(render(registry)).decode()
    shown = [line for line in body.splitlines() if line.startswith(NEXT_RUN + "{")]
    assert [line.split('"')[1] for line in shown] == [
        "tenant-00000",
        "tenant-00001",
        "tenant-00002",
    ]
    assert walked.walked == 0, f"a scrape walked {walked.walked} series"
    # Shown for good, also once set to a slot a year away again.
    metrics.job_next_run_timestamp_seconds.labels(job="tenant-00001").set(now[0] + 3e7)
    assert registry.get_sample_value(NEXT_RUN, {"job": "tenant-00001"}) == now[0] + 3e7
    assert walked.walked == 0


def test_a_next_run_set_again_before_its_hour_waits_for_the_new_time() -> None:
    registry, metrics, now, _ = waiting_jobs()
    gauge = metrics.job_next_run_timestamp_seconds
    # Rescheduled a year on before its hour came: the old time shows nothing.
    year_on = now[0] + 3e7
    gauge.labels(job="tenant-00000").set(year_on)
    # No next run (a removed job's 0): nothing to wait for, never shown by the clock.
    gauge.labels(job="tenant-00001").set(0)
    now[0] += 2 * NEXT_RUN_HORIZON + 1500
    generate_latest(registry)
    assert registry.get_sample_value(NEXT_RUN, {"job": "tenant-00000"}) is None
    assert registry.get_sample_value(NEXT_RUN, {"job": "tenant-00001"}) is None
    assert registry.get_sample_value(NEXT_RUN, {"job": "tenant-00002"}) is not None
    # The job's first claim shows it whatever its time (sidecar/obs/metrics.py).
    metrics.claims_won_total.labels(job="tenant-00000").inc()
    assert registry.get_sample_value(NEXT_RUN, {"job": "tenant-00000"}) == year_on


def test_setting_next_runs_again_and_again_keeps_the_heap_bounded() -> None:
    """A wall-clock step recomputes every job's next run: the stale times are
    dropped, not kept beside the live ones for good."""
    _, metrics, now, _ = waiting_jobs()
    gauge = metrics.job_next_run_timestamp_seconds
    for step in range(5):
        for i in range(JOBS):
            gauge.labels(job=f"tenant-{i:05d}").set(now[0] + 3e7 + step + i)
    assert len(gauge.waiting) <= 2 * JOBS + SLACK


def test_a_sidecar_shows_a_next_run_once_the_clock_brings_it_within_the_hour(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    """A real sidecar: a job whose slot is a little more than an hour away has no
    next-run series, then has it once a scrape finds the slot within the hour, with
    no write of the job's in between (its walk set the time once)."""
    at = time.gmtime(time.time() + NEXT_RUN_HORIZON + 25)
    config = {
        "nats": {"servers": [nats_server.url]},
        "target": {"url": "http://127.0.0.1:9"},  # never called: not due in the test
        "jobs": [
            {
                "name": "soon",
                "schedule": f"{at.tm_sec} {at.tm_min} {at.tm_hour} * * *",
                "timezone": "UTC",
            },
            {"name": "yearly", "schedule": "0 0 1 1 *"},
        ],
    }
    within = calendar.timegm(at) - NEXT_RUN_HORIZON  # when the slot's hour begins
    with sidecars(tmp_path, [("a", config, {})]) as (proc,):
        scraped = time.time()
        _, first = proc.get("/metrics")
        if scraped < within - 1:  # a slow start may have come past it: then not asserted
            assert 'job="soon"' not in first, first

        def shown() -> str | None:
            _, body = proc.get("/metrics")
            return body if 'job="soon"' in body else None

        body = wait_for(shown, 60, what="the next run of job soon shown")
        assert time.time() >= within - 1
        assert proc.metric(NEXT_RUN, {"job": "soon"}) == calendar.timegm(at)
        assert 'job="yearly"' not in body
