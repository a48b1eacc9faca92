"""Every date, interval and schedule the docs accept is handled: slots in range, or a
clear error.

datetime names years 1 to 9999 in any offset from -14:00 to +14:00, and
``9999-12-31T23:59:59-14:00`` is in the year 10000 in UTC: converting it
overflowed once. Property-based tests walk the whole range for exclusions,
a calendar's runs and a backfill's slots (an instant an operator types:
tests/config/test_instants.py; the exit codes and the HTTP status against a
real nats-server: tests/cli/test_time_edges.py, tests/admin/test_time_edges.py).
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import cast
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.config.load import JobConfig
from sidecar.core.bounds import MAX_SLOT_MS
from sidecar.core.errors import ScheduleError
from sidecar.when.backfillrange import backfill_slots
from sidecar.when.slots import parse_calendar, parse_exclusion
from tests.support import examples

OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
# Every datetime in every offset, so both ends of the range in both directions.
AWARE = st.datetimes(min_value=datetime.min, max_value=datetime.max, timezones=OFFSETS)
ZONES = st.sampled_from(
    [ZoneInfo(z) for z in ("UTC", "Pacific/Kiritimati", "Etc/GMT+12", "America/New_York")]
)
SCHEDULES = st.sampled_from(["0 0 1 1 *", "* * * * *", "*/7 * * * * *", "0 3 29 2 *"])
SETTINGS = settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def text_of(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


@SETTINGS
@given(st.dates(min_value=date.min, max_value=date.max), ZONES)
def test_every_date_is_an_exclusion(day: date, tz: ZoneInfo) -> None:
    exclusion = parse_exclusion(day.isoformat(), tz)
    assert exclusion.start_ms < exclusion.end_ms
    assert 22 * 3_600_000 <= exclusion.end_ms - exclusion.start_ms <= 26 * 3_600_000


@SETTINGS
@given(AWARE, AWARE | st.integers(1, 10**7).map(lambda s: f"PT{s}S"), ZONES, st.booleans())
def test_every_interval_is_an_exclusion_or_a_value_error(
    start: datetime, end: datetime | str, tz: ZoneInfo, naive: bool
) -> None:
    first = start.replace(tzinfo=None).isoformat() if naive else text_of(start)
    second = end if isinstance(end, str) else text_of(end)
    try:
        exclusion = parse_exclusion(f"{first}/{second}", tz)
    except ValueError:
        return
    assert exclusion.start_ms < exclusion.end_ms


@SETTINGS
@given(SCHEDULES, ZONES, st.integers(0, MAX_SLOT_MS), st.integers(1, 1000))
def test_runs_are_slots_in_range_or_a_schedule_error(
    expr: str, tz: ZoneInfo, after: int, count: int
) -> None:
    calendar = parse_calendar(expr, tz, exclude=["9999-12-31", "1970-01-01"])
    try:
        runs = calendar.runs(after, count)
    except ScheduleError:
        return
    assert len(runs) == count and all(after < s <= MAX_SLOT_MS + 14 * 3_600_000 for s in runs)


@SETTINGS
@given(SCHEDULES, ZONES, st.integers(0, MAX_SLOT_MS), st.integers(0, MAX_SLOT_MS))
def test_backfill_slots_are_slots_or_a_value_error(expr: str, tz: ZoneInfo, a: int, b: int) -> None:
    spec = cast(JobConfig, SimpleNamespace(name="j", schedule=parse_calendar(expr, tz)))
    try:
        found = backfill_slots(spec.schedule, min(a, b), max(a, b))
    except ValueError:
        return
    assert all(min(a, b) <= s <= max(a, b) for s in found)
