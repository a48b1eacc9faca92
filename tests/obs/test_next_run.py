"""The next-run gauge keeps no series for a job waiting beyond its horizon (issue 49):
the timetable's walks say its slot; a scrape shows the jobs whose slot came near, a
job's first claim shows the slot it waits for (docs/METRICS.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from sidecar.obs.metrics import NEXT_RUN_HORIZON, Metrics

NEXT_RUN = "anarchon_job_next_run_timestamp_seconds"
NOW = 1_800_000_000.0


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
