"""``@every`` intervals: pure slot maths and the config rules (three real sidecars
running them: tests/run/test_interval_fleet.py)."""

from __future__ import annotations

import itertools
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from sidecar.config.load import parse_config
from sidecar.core.errors import ConfigError, ScheduleError
from sidecar.when.schedule import Interval, parse_schedule
from sidecar.when.slots import parse_calendar

UTC_ZONE = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")
REF = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def parse(jobs: list[dict[str, Any]], **top: Any) -> Any:
    return parse_config({"nats": {"servers": "nats://127.0.0.1:4222", **top}, "jobs": jobs}, {})


# ---------------------------------------------------------------- slot maths


def test_every_is_anchored_to_the_epoch_whatever_the_instant_asked_from() -> None:
    sched = parse_schedule("@every 90m", UTC_ZONE)
    assert isinstance(sched, Interval)
    step = 90 * 60_000
    for after in (0, REF - 1, REF + 1, REF + 12_345_678, 1_999_999_999_999):
        slot = sched.next_slot(after)
        assert slot % step == 0 and after < slot <= after + step
    assert sched.slots(REF - 1, 3) == [REF, REF + step, REF + 2 * step]
    assert sched.min_interval_ms() == sched.interval_floor_ms() == step


def test_offset_shifts_the_grid_like_a_temporal_interval_phase() -> None:
    sched = parse_schedule("@every 1h offset 15m", UTC_ZONE)
    assert sched.slots(REF, 2) == [REF + 15 * 60_000, REF + 75 * 60_000]
    # Whitespace and the job's timezone change nothing: intervals are absolute time.
    assert parse_schedule("  @every  1h   offset 15m ", BERLIN).slots(REF, 2) == sched.slots(REF, 2)


def test_from_starts_the_grid_at_an_instant_with_no_slot_before() -> None:
    sched = parse_schedule("@every 7s from 2026-01-01T00:00:03Z", UTC_ZONE)
    assert sched.next_slot(0) == REF + 3000  # nothing before the anchor
    assert sched.slots(REF + 3000, 2) == [REF + 10_000, REF + 17_000]
    # Without an offset, the instant is a wall time in the job's timezone (CET: +1h).
    local = parse_schedule("@every 1d from 2026-01-01T06:00:00", BERLIN)
    assert local.next_slot(0) == REF + 5 * 3_600_000


def test_an_interval_across_dst_keeps_its_period_in_absolute_time() -> None:
    # 2026-03-29 01:00Z Berlin springs forward: an hourly interval does not care.
    cal = parse_calendar("@every 1h", BERLIN)
    spring = 1_774_746_000_000  # 2026-03-29T01:00:00Z
    run = cal.slots(spring - 3 * 3_600_000, 6)
    assert all(b - a == 3_600_000 for a, b in itertools.pairwise(run))


def test_intervals_mix_with_cron_exclusions_spread_and_previous_slot() -> None:
    cal = parse_calendar(
        ["@every 20m", "0 * * * *"],
        UTC_ZONE,
        job="mix",
        exclude=["2026-01-01T00:40:00Z/PT1M"],
    )
    # :00 is shared by both (one slot); :40 is excluded from runs but is a slot.
    assert cal.slots(REF - 1, 4) == [REF, REF + 1_200_000, REF + 2_400_000, REF + 3_600_000]
    assert cal.runs(REF - 1, 3) == [REF, REF + 1_200_000, REF + 3_600_000]
    assert cal.previous_slot(REF + 1_200_000) == REF
    yearly = parse_calendar("@every 365d", UTC_ZONE)
    first = yearly.next_slot(REF)
    assert yearly.previous_slot(first) == first - 365 * 86_400_000
    assert cal.min_interval_ms() == 1_200_000
    assert "'@every' (an interval)" in cal.unportable()
    spread = parse_calendar("@every 10m", UTC_ZONE, job="s", spread=60.0)
    assert spread.slots(REF - 1, 1)[0] % 600_000 == spread.offset_ms


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("@every", "expected '@every <interval>'"),
        ("@every 90", "not an interval"),
        ("@every 500ms", "not an interval"),
        ("@every 0s", "at least 1s"),
        ("@every 366d", "at most 365d"),
        ("@every 1h offset 1h", "shorter than the interval"),
        ("@every 1h from yesterday", "not an ISO 8601"),
        ("@every 1h from 2026-01-01T00:00:00.5Z", "whole seconds"),
        ("@every 1h sometimes 5m", "expected '@every <interval>'"),
    ],
)
def test_bad_intervals_say_why(expr: str, fragment: str) -> None:
    with pytest.raises(ScheduleError) as info:
        parse_schedule(expr, UTC_ZONE)
    assert fragment in str(info.value)


def test_config_names_the_key_and_applies_the_window_rules_to_the_interval() -> None:
    with pytest.raises(ConfigError) as info:
        parse([{"name": "a", "schedule": ["* * * * *", "@every 5x"]}])
    assert info.value.key == "jobs[0].schedule[1]"
    # spread must stay below the interval
    with pytest.raises(ConfigError) as info:
        parse([{"name": "a", "schedule": "@every 30s", "spread": "30s"}])
    assert info.value.key == "jobs[0].spread" and "shortest interval (30s)" in str(info.value)
    # history_size x interval must cover jitter + max_late (the duplicate memory rule)
    with pytest.raises(ConfigError) as info:
        parse([{"name": "a", "schedule": "@every 1s", "max_late": "5s"}], history_size=4)
    assert info.value.key == "nats.history_size" and "shortest interval 1s" in str(info.value)
    # jitter + max_late must stay below the duplicate window, whatever the schedule
    with pytest.raises(ConfigError) as info:
        parse([{"name": "a", "schedule": "@every 1h", "max_late": "10m"}])
    assert info.value.key == "jobs[0].jitter"
    ok = parse([{"name": "a", "schedule": "@every 90m offset 5m"}]).jobs[0]
    assert ok.schedule.identity == "@every 90m offset 5m"


def test_the_history_rule_sees_a_union_gap_shorter_than_either_schedule() -> None:
    # :00 of every hour and 30 s after it: 30 s apart, though neither repeats within a minute.
    cal = parse_calendar(["0 * * * *", "@every 1h offset 30s"], UTC_ZONE)
    assert cal.interval_floor_ms() <= cal.min_interval_ms() == 30_000
    with pytest.raises(ConfigError) as info:
        parse(
            [{"name": "a", "schedule": ["0 * * * *", "@every 1h offset 30s"], "max_late": "1m"}],
            history_size=2,
        )
    assert info.value.key == "nats.history_size" and "shortest interval 30s" in str(info.value)
    # A union with an interval that begins later is sampled from its beginning.
    late = parse_calendar(["0 * * * *", "@every 1h from 2031-01-01T00:00:10Z"], UTC_ZONE)
    assert late.min_interval_ms() == 10_000
