"""The next-run gauge (sidecar/obs/next_run.py), issue 49: no series for a job
waiting beyond its horizon (its walk says its slot), and a scrape that costs the
series it writes, not the jobs. What is shown, and when, is unchanged
(docs/METRICS.md, "Series per job"; the rules of tests/obs/test_observability.py's
``test_a_job_has_no_series_until_...``).
"""

from __future__ import annotations

import asyncio
import calendar
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from sidecar.config.load import JobConfig, parse_config
from sidecar.core.clock import Clock
from sidecar.core.tasks import TaskSet
from sidecar.obs.exposition import render
from sidecar.obs.metrics import Metrics
from sidecar.obs.next_run import NEXT_RUN_HORIZON
from sidecar.run.timetable import Timetable
from tests.support import NatsServer, sidecars, wait_for

NEXT_RUN = "anarchon_job_next_run_timestamp_seconds"
NOW = 1_800_000_000.0
JOBS = 5000


class Slots:
    """Next slots by job, as sidecar/run/timetable.py's walks give them."""

    def __init__(self, slots: dict[str, float]) -> None:
        self.slots = slots

    def next_run(self, job: str) -> float | None:
        return self.slots.get(job)

    def soon(self, limit: float) -> list[tuple[str, float]]:
        return [(job, at) for job, at in self.slots.items() if 0 < at <= limit]


def test_a_far_slot_has_no_series_until_it_comes_near_or_the_job_claims() -> None:
    registry = CollectorRegistry()
    now = [NOW]
    metrics = Metrics(registry, wall=lambda: now[0])
    gauge = metrics.job_next_run_timestamp_seconds
    slots = Slots({f"far-{i}": NOW + 3e7 + i for i in range(1000)})
    slots.slots["near"] = NOW + 600
    gauge.follow(slots)
    for job, at in slots.slots.items():
        gauge.note(job, at)
    # Only the near job has a series object; a far one none (not one at 0).
    assert [key for key, _ in gauge._series.items()] == [("near",)]
    assert registry.get_sample_value(NEXT_RUN, {"job": "near"}) == NOW + 600
    assert registry.get_sample_value(NEXT_RUN, {"job": "far-7"}) is None
    assert 'job="far-' not in generate_latest(registry).decode()

    # far-3's slot comes within the horizon: the next scrape shows it, for good.
    now[0] = NOW + 3e7 + 3 - NEXT_RUN_HORIZON + 1
    assert registry.get_sample_value(NEXT_RUN, {"job": "far-3"}) == NOW + 3e7 + 3
    slots.slots["far-3"] = NOW + 6e7
    gauge.note("far-3", NOW + 6e7)
    assert registry.get_sample_value(NEXT_RUN, {"job": "far-3"}) == NOW + 6e7

    # far-9's first claim here (a backfill, its slot still far): shown at that slot.
    metrics.claims_lost_total.labels(job="far-9").inc()
    assert registry.get_sample_value(NEXT_RUN, {"job": "far-9"}) == NOW + 3e7 + 9
    # A job no walk knows (removed): its first claim shows 0, "no next run".
    metrics.claims_won_total.labels(job="gone").inc()
    assert registry.get_sample_value(NEXT_RUN, {"job": "gone"}) == 0.0
    # Told 0 ("runs no more") while it had no series: none made.
    gauge.note("far-11", 0)
    assert not gauge.written("far-11")


def test_a_next_run_set_again_before_its_hour_waits_for_the_new_time() -> None:
    registry = CollectorRegistry()
    now = [NOW]
    metrics = Metrics(registry, wall=lambda: now[0])
    gauge = metrics.job_next_run_timestamp_seconds
    slots = Slots({f"far-{i}": NOW + 2 * NEXT_RUN_HORIZON + i for i in range(3)})
    gauge.follow(slots)
    # Rescheduled a year on before its hour came: the old time shows nothing, and
    # notes of far slots, again and again (a stepped wall clock), make no series.
    for step in range(5):
        slots.slots["far-0"] = NOW + 3e7 + step
        gauge.note("far-0", NOW + 3e7 + step)
    # No next run any more (a removed job's 0): nothing to show by the clock.
    slots.slots["far-1"] = 0
    gauge.note("far-1", 0)
    assert gauge._series == {}
    now[0] += NEXT_RUN_HORIZON + 10
    generate_latest(registry)
    assert registry.get_sample_value(NEXT_RUN, {"job": "far-0"}) is None
    assert registry.get_sample_value(NEXT_RUN, {"job": "far-1"}) is None
    assert registry.get_sample_value(NEXT_RUN, {"job": "far-2"}) is not None
    # The job's first claim shows it whatever its time (sidecar/obs/metrics.py).
    metrics.claims_won_total.labels(job="far-0").inc()
    assert registry.get_sample_value(NEXT_RUN, {"job": "far-0"}) == NOW + 3e7 + 4


class Walked(dict[Any, Any]):
    """A dict of walks that counts the walks a scrape looks at."""

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


class Looked(list[Any]):
    """The timer's heap, counting the entries read from Python (heapq's own C
    reads are not counted: those of arming and firing, not of a scrape)."""

    looked = 0

    def __getitem__(self, at: Any) -> Any:
        self.looked += 1
        return super().__getitem__(at)

    def __iter__(self) -> Iterator[Any]:
        self.looked += len(self)
        return super().__iter__()


def jobs() -> list[JobConfig]:
    """JOBS jobs a minute apart, their next slots spread over 1,000 hours."""
    return parse_config(
        {
            "nats": {"servers": ["nats://127.0.0.1:4222"]},  # never connected
            "target": {"url": "http://127.0.0.1:9"},
            "jobs": [
                {"name": f"tenant-{i:05d}", "schedule": f"@every 1000h offset {i * 60}s"}
                for i in range(JOBS)
            ],
        },
        {},
    ).jobs


async def never(*_: object) -> Any:
    raise AssertionError("nothing is due in the test")


def test_a_scrape_looks_at_the_jobs_it_writes_not_at_every_job() -> None:
    """A real timetable of JOBS walks: a scrape finds the few whose slot came within
    the horizon without looking at every walk (the dict of walks, or the whole
    heap): before, 100,000 jobs were 100,000 looks on the event loop per scrape."""
    configs = jobs()

    async def scrape_twice() -> None:
        registry = CollectorRegistry()
        now = [time.time() - 10 * NEXT_RUN_HORIZON]  # every slot beyond the horizon
        metrics = Metrics(registry, wall=lambda: now[0])
        stopping = asyncio.Event()
        timetable = Timetable(
            clock=Clock(),
            stopping=stopping,
            metrics=metrics,
            tasks=TaskSet("side tasks"),
            attempt=never,
            late=never,  # type: ignore[arg-type]
            over=lambda job, slot: None,
            catch_up=never,
        )
        for job in configs:
            timetable.start(job)
        try:
            gauge = metrics.job_next_run_timestamp_seconds
            assert gauge._series == {}, "a series for a job waiting beyond its hour"
            body = (await render(registry)).decode()
            assert 'job="' not in body
            walks = timetable.walks = Walked(timetable.walks)
            heap = timetable.timer._heap = Looked(timetable.timer._heap)
            # The clock reaches the first three jobs' hour: a scrape shows them, and
            # only them, without looking at the others.
            first = sorted(timetable.walks.copy().values(), key=lambda w: w.slot)[:3]
            now[0] = first[-1].slot / 1000 - NEXT_RUN_HORIZON
            walks.walked = heap.looked = 0
            body = (await render(registry)).decode()
            shown = [line for line in body.splitlines() if line.startswith(NEXT_RUN + "{")]
            assert sorted(line.split('"')[1] for line in shown) == [w.job.name for w in first]
            assert walks.walked == 0, f"a scrape looked at {walks.walked} walks"
            # The entries due by the limit plus the jitter, and their children.
            assert heap.looked < 30, f"a scrape looked at {heap.looked} of {len(heap)} entries"
            assert len(gauge._series) == 3
        finally:
            stopping.set()
            timetable.timer.wake()

    asyncio.run(scrape_twice())


def test_a_scrape_while_a_slot_is_handled_shows_that_slot() -> None:
    """A walk handling its slot is out of the timer's heap; a scrape then still
    finds the slot, as one did when every job had a series (issue 49)."""
    (job,) = parse_config(
        {
            "nats": {"servers": ["nats://127.0.0.1:4222"]},  # never connected
            "target": {"url": "http://127.0.0.1:9"},
            "jobs": [{"name": "every", "schedule": "@every 1s", "jitter": 0}],
        },
        {},
    ).jobs

    async def scrape_while_handled() -> None:
        registry = CollectorRegistry()
        now = [time.time() - 10 * NEXT_RUN_HORIZON]  # its slot beyond the horizon
        metrics = Metrics(registry, wall=lambda: now[0])
        stopping = asyncio.Event()
        attempted, release = asyncio.Event(), asyncio.Event()

        async def attempt(*_: object) -> None:
            attempted.set()
            await release.wait()

        timetable = Timetable(
            clock=Clock(),
            stopping=stopping,
            metrics=metrics,
            tasks=TaskSet("side tasks"),
            attempt=attempt,
            late=never,  # type: ignore[arg-type]
            over=lambda job, slot: None,
            catch_up=never,
        )
        timetable.start(job)
        try:
            assert not metrics.job_next_run_timestamp_seconds.written("every")
            await asyncio.wait_for(attempted.wait(), 5)
            slot = timetable.walks["every"].slot
            now[0] = time.time()  # the gauge's clock reaches the slot being handled
            assert registry.get_sample_value(NEXT_RUN, {"job": "every"}) == slot / 1000
        finally:
            release.set()
            stopping.set()
            timetable.timer.wake()
            timetable.wake()

    asyncio.run(scrape_while_handled())


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
            # Half a year away: never within the hour (1 January is, on 31 December).
            {"name": "yearly", "schedule": f"0 0 1 {(time.gmtime().tm_mon + 5) % 12 + 1} *"},
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
