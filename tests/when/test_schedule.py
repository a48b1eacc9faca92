"""Tables for sidecar/when/schedule.py: plain crons, DST days, errors, min_interval_ms.

Every expected slot is written as a UTC datetime worked out by hand from the
2026 transitions asserted in ``test_transitions_2026``:

* Europe/Berlin: CET +1 / CEST +2. Spring 2026-03-29 01:00Z (local 02:00-03:00
  missing), fall 2026-10-25 01:00Z (local 02:00-03:00 twice).
* America/New_York: EST -5 / EDT -4. Spring 2026-03-08 07:00Z (02:00-03:00
  missing), fall 2026-11-01 06:00Z (01:00-02:00 twice).
* Australia/Lord_Howe: LHST +10:30 / LHDT +11. Fall 2026-04-04 15:00Z (local
  2026-04-05 01:30-02:00 twice), spring 2026-10-03 15:30Z (local 2026-10-04
  02:00-02:30 missing).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

import sidecar.when.schedule as schedule_module
from sidecar.core.errors import ScheduleError
from sidecar.when.schedule import Schedule, parse_schedule
from tests.support import examples

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BERLIN, NEW_YORK, LORD_HOWE = "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"


def u(text: str) -> datetime:
    """A UTC datetime from "YYYY-MM-DD HH:MM[:SS[.fff]]"."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def ms(dt: datetime) -> int:
    """Epoch milliseconds, exact (no float)."""
    return (dt - EPOCH) // timedelta(milliseconds=1)


def slots_of(expr: str, zone: str, after: datetime, count: int) -> list[datetime]:
    sched = parse_schedule(expr, ZoneInfo(zone))
    return [EPOCH + timedelta(milliseconds=s) for s in sched.slots(ms(after), count)]


@pytest.mark.parametrize(
    ("zone", "instant", "before", "after"),
    [
        (BERLIN, u("2026-03-29 01:00"), 60, 120),
        (BERLIN, u("2026-10-25 01:00"), 120, 60),
        (NEW_YORK, u("2026-03-08 07:00"), -300, -240),
        (NEW_YORK, u("2026-11-01 06:00"), -240, -300),
        (LORD_HOWE, u("2026-04-04 15:00"), 660, 630),
        (LORD_HOWE, u("2026-10-03 15:30"), 630, 660),
    ],
)
def test_transitions_2026(zone: str, instant: datetime, before: int, after: int) -> None:
    """The offsets (minutes) the tables below rely on, straight from zoneinfo."""
    tz = ZoneInfo(zone)
    second = timedelta(seconds=1)
    assert (instant - second).astimezone(tz).utcoffset() == timedelta(minutes=before)
    assert instant.astimezone(tz).utcoffset() == timedelta(minutes=after)


# fmt: off
PLAIN = [
    # every 5 minutes; "after" is exclusive
    ("*/5 * * * *", "UTC", u("2026-01-01 00:03"), [u("2026-01-01 00:05"), u("2026-01-01 00:10")]),
    ("*/5 * * * *", "UTC", u("2026-01-01 00:05"), [u("2026-01-01 00:10")]),
    ("*/5 * * * *", "UTC", u("2026-01-01 00:04:59.999"), [u("2026-01-01 00:05")]),
    ("*/5 * * * *", BERLIN, u("2026-01-01 00:03"), [u("2026-01-01 00:05")]),
    # hourly; Lord Howe is +10:30 in its winter
    ("0 * * * *", "UTC", u("2026-01-01 10:00:00.001"),
        [u("2026-01-01 11:00"), u("2026-01-01 12:00")]),
    ("0 * * * *", LORD_HOWE, u("2026-07-01 10:00"), [u("2026-07-01 10:30"), u("2026-07-01 11:30")]),
    # daily 02:30 local: CET/EST in January, CEST in July
    ("30 2 * * *", BERLIN, u("2026-01-10 00:00"), [u("2026-01-10 01:30"), u("2026-01-11 01:30")]),
    ("30 2 * * *", BERLIN, u("2026-07-01 00:00"), [u("2026-07-01 00:30"), u("2026-07-02 00:30")]),
    ("30 2 * * *", NEW_YORK, u("2026-01-10 00:00"), [u("2026-01-10 07:30"), u("2026-01-11 07:30")]),
    # 6 fields, seconds first
    ("* * * * * *", "UTC", u("2026-01-01 00:00:00.5"),
        [u("2026-01-01 00:00:01"), u("2026-01-01 00:00:02")]),
    ("*/10 * * * * *", "UTC", u("2026-01-01 00:00:05"),
        [u("2026-01-01 00:00:10"), u("2026-01-01 00:00:20")]),
    ("30 15 10 * * *", "UTC", u("2026-01-01 00:00"),
        [u("2026-01-01 10:15:30"), u("2026-01-02 10:15:30")]),
    # leap day only
    ("0 0 29 2 *", "UTC", u("2026-01-01 00:00"), [u("2028-02-29 00:00"), u("2032-02-29 00:00")]),
    ("0 0 29 2 *", BERLIN, u("2026-01-01 00:00"), [u("2028-02-28 23:00"), u("2032-02-28 23:00")]),
    # day-of-week and month names in any case (2026-01-02 is a Friday); 7 is Sunday
    ("0 9 * * MON-FRI", "UTC", u("2026-01-02 09:00"),
        [u("2026-01-05 09:00"), u("2026-01-06 09:00")]),
    ("0 12 * * sat,sun", "UTC", u("2026-01-01 00:00"),
        [u("2026-01-03 12:00"), u("2026-01-04 12:00"), u("2026-01-10 12:00")]),
    ("0 0 1 jan,JUL *", "UTC", u("2026-01-01 00:00"),
        [u("2026-07-01 00:00"), u("2027-01-01 00:00")]),
    ("0 0 * * 7", "UTC", u("2026-01-01 00:00"), [u("2026-01-04 00:00")]),
]

SPRING = [
    # Berlin 2026-03-29: local 02:00-03:00 missing, transition 01:00Z
    ("30 2 * * *", BERLIN, u("2026-03-27 02:00"),
        [u("2026-03-28 01:30"), u("2026-03-29 01:00"), u("2026-03-30 00:30")]),
    ("0 2 * * *", BERLIN, u("2026-03-28 02:00"), [u("2026-03-29 01:00"), u("2026-03-30 00:00")]),
    ("0 2,3 * * *", BERLIN, u("2026-03-28 22:00"), [u("2026-03-29 01:00"), u("2026-03-30 00:00")]),
    ("0 3 * * *", BERLIN, u("2026-03-28 03:00"), [u("2026-03-29 01:00"), u("2026-03-30 01:00")]),
    ("*/15 * * * *", BERLIN, u("2026-03-29 00:30"),
        [u("2026-03-29 00:45"), u("2026-03-29 01:00"), u("2026-03-29 01:15")]),
    ("*/5 * * * *", BERLIN, u("2026-03-29 00:59:59.999"),
        [u("2026-03-29 01:00"), u("2026-03-29 01:05")]),
    ("*/5 * * * *", BERLIN, u("2026-03-29 01:00"), [u("2026-03-29 01:05")]),
    ("0 * * * *", BERLIN, u("2026-03-28 23:30"),
        [u("2026-03-29 00:00"), u("2026-03-29 01:00"), u("2026-03-29 02:00")]),
    ("* * * * * *", BERLIN, u("2026-03-29 00:59:58"),
        [u("2026-03-29 00:59:59"), u("2026-03-29 01:00:00"), u("2026-03-29 01:00:01")]),
    # New York 2026-03-08: local 02:00-03:00 missing, transition 07:00Z
    ("30 2 * * *", NEW_YORK, u("2026-03-07 07:00"),
        [u("2026-03-07 07:30"), u("2026-03-08 07:00"), u("2026-03-09 06:30")]),
    ("*/15 * * * *", NEW_YORK, u("2026-03-08 06:40"),
        [u("2026-03-08 06:45"), u("2026-03-08 07:00"), u("2026-03-08 07:15")]),
    ("* * * * * *", NEW_YORK, u("2026-03-08 06:59:59"),
        [u("2026-03-08 07:00:00"), u("2026-03-08 07:00:01")]),
    # Lord Howe 2026-10-04: local 02:00-02:30 missing, transition 2026-10-03 15:30Z
    ("15 2 * * *", LORD_HOWE, u("2026-10-02 16:00"),
        [u("2026-10-03 15:30"), u("2026-10-04 15:15")]),
    ("0 * * * *", LORD_HOWE, u("2026-10-03 14:00"),
        [u("2026-10-03 14:30"), u("2026-10-03 15:30"), u("2026-10-03 16:00")]),
    ("*/15 * * * *", LORD_HOWE, u("2026-10-03 15:00"),
        [u("2026-10-03 15:15"), u("2026-10-03 15:30"), u("2026-10-03 15:45")]),
    ("0,40 * * * *", LORD_HOWE, u("2026-10-03 15:00"),
        [u("2026-10-03 15:10"), u("2026-10-03 15:30"), u("2026-10-03 15:40")]),
]

FALL = [
    # Berlin 2026-10-25: local 02:00-03:00 twice; first pass 00:00-01:00Z, second 01:00-02:00Z
    ("30 2 * * *", BERLIN, u("2026-10-24 01:00"), [u("2026-10-25 00:30"), u("2026-10-26 01:30")]),
    ("*/15 * * * *", BERLIN, u("2026-10-25 00:40"),
        [u("2026-10-25 00:45"), u("2026-10-25 02:00"), u("2026-10-25 02:15")]),
    ("0 * * * *", BERLIN, u("2026-10-24 23:30"),
        [u("2026-10-25 00:00"), u("2026-10-25 02:00"), u("2026-10-25 03:00")]),
    ("* * * * * *", BERLIN, u("2026-10-25 00:59:58"),
        [u("2026-10-25 00:59:59"), u("2026-10-25 02:00:00"), u("2026-10-25 02:00:01")]),
    # New York 2026-11-01: local 01:00-02:00 twice; first pass 05:00-06:00Z, second 06:00-07:00Z
    ("30 1 * * *", NEW_YORK, u("2026-10-31 06:00"), [u("2026-11-01 05:30"), u("2026-11-02 06:30")]),
    ("*/15 * * * *", NEW_YORK, u("2026-11-01 05:40"),
        [u("2026-11-01 05:45"), u("2026-11-01 07:00"), u("2026-11-01 07:15")]),
    # Lord Howe 2026-04-05: local 01:30-02:00 twice; first pass 14:30-15:00Z, second 15:00-15:30Z
    ("45 1 * * *", LORD_HOWE, u("2026-04-03 16:00"),
        [u("2026-04-04 14:45"), u("2026-04-05 15:15")]),
    ("*/15 * * * *", LORD_HOWE, u("2026-04-04 14:20"),
        [u("2026-04-04 14:30"), u("2026-04-04 14:45"), u("2026-04-04 15:30")]),
    ("* * * * * *", LORD_HOWE, u("2026-04-04 14:59:58"),
        [u("2026-04-04 14:59:59"), u("2026-04-04 15:30:00")]),
]

SECOND_PASS = [
    # "after" lies in the second pass of an overlap: nothing until the overlap ends
    ("*/15 * * * *", BERLIN, u("2026-10-25 01:00"), u("2026-10-25 02:00")),
    ("*/15 * * * *", BERLIN, u("2026-10-25 01:37:12.345"), u("2026-10-25 02:00")),
    ("*/15 * * * *", BERLIN, u("2026-10-25 01:59:59.999"), u("2026-10-25 02:00")),
    ("*/15 * * * *", BERLIN, u("2026-10-25 00:59:59.999"), u("2026-10-25 02:00")),
    ("30 2 * * *", BERLIN, u("2026-10-25 01:30"), u("2026-10-26 01:30")),
    ("* * * * * *", BERLIN, u("2026-10-25 01:30"), u("2026-10-25 02:00")),
    ("* * * * * *", NEW_YORK, u("2026-11-01 06:00:00.001"), u("2026-11-01 07:00")),
    ("*/15 * * * *", NEW_YORK, u("2026-11-01 06:20"), u("2026-11-01 07:00")),
    ("* * * * * *", LORD_HOWE, u("2026-04-04 15:10"), u("2026-04-04 15:30")),
    ("45 1 * * *", LORD_HOWE, u("2026-04-04 15:10"), u("2026-04-05 15:15")),
]
# fmt: on


@pytest.mark.parametrize(("expr", "zone", "after", "expected"), PLAIN + SPRING + FALL)
def test_slots(expr: str, zone: str, after: datetime, expected: list[datetime]) -> None:
    assert slots_of(expr, zone, after, len(expected)) == expected


@pytest.mark.parametrize(("expr", "zone", "after", "expected"), PLAIN + SPRING + FALL)
def test_next_slot_chains_like_slots(
    expr: str, zone: str, after: datetime, expected: list[datetime]
) -> None:
    sched = parse_schedule(expr, ZoneInfo(zone))
    got, cursor = [], ms(after)
    for _ in expected:
        cursor = sched.next_slot(cursor)
        got.append(cursor)
    assert got == [ms(e) for e in expected]


@pytest.mark.parametrize(("expr", "zone", "after", "expected"), SECOND_PASS)
def test_next_slot_from_second_pass(
    expr: str, zone: str, after: datetime, expected: datetime
) -> None:
    assert parse_schedule(expr, ZoneInfo(zone)).next_slot(ms(after)) == ms(expected)


@pytest.mark.parametrize(
    ("expr", "zone", "expected_ms"),
    [
        ("*/5 * * * *", "UTC", 300_000),
        ("0 * * * *", "UTC", 3_600_000),
        ("0 * * * *", BERLIN, 3_600_000),
        ("0 * * * *", LORD_HOWE, 1_800_000),  # 01:00 -> 02:00 (= 02:30 LHDT)
        ("0,40 * * * *", "UTC", 1_200_000),
        ("0,40 * * * *", LORD_HOWE, 600_000),  # 02:00 gap slot -> 02:40 LHDT
        ("30 2 * * *", "UTC", 86_400_000),
        ("30 2 * * *", BERLIN, 84_600_000),  # 03-28 01:30Z -> 03-29 01:00Z
        ("30 2 * * *", NEW_YORK, 84_600_000),  # 03-07 07:30Z -> 03-08 07:00Z
        ("30 2 * * *", LORD_HOWE, 84_600_000),  # 02:30 LHST -> 02:30 LHDT
        ("* * * * * *", BERLIN, 1_000),
        ("0 9 * * MON-FRI", "UTC", 86_400_000),
        ("0 0 1 1 *", "UTC", 365 * 86_400_000),
        ("0 0 29 2 *", "UTC", 1461 * 86_400_000),  # 2028-02-29 -> 2032-02-29
    ],
)
def test_min_interval_ms(expr: str, zone: str, expected_ms: int) -> None:
    assert parse_schedule(expr, ZoneInfo(zone)).min_interval_ms() == expected_ms


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("61 * * * *", "bad minute field '61'"),
        ("0 24 * * *", "bad hour field '24'"),
        ("60 * * * * *", "bad second field '60'"),
        ("*/0 * * * *", "bad minute field '*/0'"),
        ("0 0 * 13 *", "bad month field '13'"),
        ("0 0 * * FOO", "bad day-of-week field 'FOO'"),
        ("0 0 31 2 *", "bad day-of-month field '31'"),
        ("5-1 * * * *", "bad minute field '5-1'"),
        ("* * * *", "got 4"),
        ("* * * * * * *", "got 7"),
        ("0 0 0 1 1 * 2026", "got 7"),
        ("garbage", "got 1"),
        ("@daily", "cron macros are not supported"),
        ("", "got 0"),
        ("a b c d e", "bad minute field 'a'"),
        ("0 0 15W * *", "bad day-of-month field '15W'"),  # cronsim knows only LW
        ("0 0 ? * *", "bad day-of-month field '?'"),
    ],
)
def test_errors(expr: str, fragment: str) -> None:
    with pytest.raises(ScheduleError) as info:
        parse_schedule(expr, ZoneInfo("UTC"))
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("expr", "named"),
    [
        ("0 0 L * *", ["'L' (last)"]),
        ("0 0 LW * *", ["'L' (last)", "'W' (weekday)"]),
        ("0 0 * * 5L", ["'L' (last)"]),
        ("0 0 * * MON#2", ["'#' (nth weekday)"]),
        ("0 0 * JUL,APR SAT", []),  # names holding L and W are not the extensions
    ],
)
def test_quartz_extensions_are_allowed_and_named(expr: str, named: list[str]) -> None:
    parse_schedule(expr, ZoneInfo("UTC")).next_slot(0)
    assert schedule_module.unportable(expr) == named


def test_direct_construction_validates_too() -> None:
    with pytest.raises(ScheduleError):
        Schedule("61 * * * *", ZoneInfo("UTC"))


def test_an_expression_is_checked_once_and_a_bad_one_every_time() -> None:
    """A config parses a job's expressions more than once: only the first check costs."""
    expr = "17 3 * * 2"  # in no other test
    before = parse_schedule.cache_info()
    first = parse_schedule(expr, ZoneInfo("UTC"))
    assert parse_schedule(expr, ZoneInfo("UTC")) is first
    parse_schedule(expr, ZoneInfo("Asia/Kolkata"))
    after = parse_schedule.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (2, 1)
    for _ in range(2):  # an error is never remembered as a pass
        with pytest.raises(ScheduleError, match="bad hour field '25'"):
            parse_schedule("0 25 * * *", ZoneInfo("UTC"))


def test_the_check_leaves_the_next_slot_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job loop's first step (the next slot after now) costs no cron arithmetic:
    the check at parse time found it (with 1,000 jobs, a tenth of the time to ready)."""
    sched = Schedule("*/5 * * * *", ZoneInfo("Europe/Berlin"))
    walked: list[int] = []
    real = Schedule._iter_slots

    def counting(self: Schedule, after_ms: int) -> Iterator[int]:
        walked.append(after_ms)
        return real(self, after_ms)

    monkeypatch.setattr(Schedule, "_iter_slots", counting)
    now = time.time_ns() // 1_000_000
    slot = sched.next_slot(now)
    assert walked == [] or slot - now < 1000  # computed only if a slot passed meanwhile
    assert sched.next_slot(slot) > slot  # after the known slot: computed
    assert walked[-1] == slot


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(
    expr=st.sampled_from(["*/15 * * * *", "30 2 * * *", "*/7 * * * * *", "0 9 * * 1-5"]),
    zone=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
    first=st.integers(1_767_225_600_000, 1_830_297_600_000),
    delta_ms=st.integers(-2 * 86_400_000, 2 * 86_400_000),
)
def test_a_known_answer_is_the_computed_one(
    expr: str, zone: str, first: int, delta_ms: int
) -> None:
    """Whatever was asked before, next_slot answers what a fresh walk finds."""
    sched = Schedule(expr, ZoneInfo(zone))
    sched.next_slot(first)
    for after in (first + delta_ms, sched.next_slot(first) - 1, sched.next_slot(first)):
        assert sched.next_slot(after) == sched.slots(after, 1)[0]


def test_whitespace_is_normalised() -> None:
    sched = parse_schedule("  */5\t*  * * *\n", ZoneInfo("UTC"))
    assert sched.expr == "*/5 * * * *"
    assert sched == parse_schedule("*/5 * * * *", ZoneInfo("UTC"))


@pytest.fixture
def process_tz() -> Iterator[None]:
    """Restore the process TZ (and the C library's view of it) afterwards."""
    saved = os.environ.get("TZ")
    yield
    if saved is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = saved
    time.tzset()


@pytest.mark.parametrize(
    "process_zone", ["UTC", "Asia/Kolkata", "America/Los_Angeles", "Pacific/Chatham"]
)
@pytest.mark.usefixtures("process_tz")
def test_independent_of_process_tz(process_zone: str) -> None:
    os.environ["TZ"] = process_zone
    time.tzset()
    for expr, zone, after, expected in SPRING + FALL:
        assert slots_of(expr, zone, after, len(expected)) == expected
    assert parse_schedule("30 2 * * *", ZoneInfo(BERLIN)).min_interval_ms() == 84_600_000


TRANSITIONS = [
    (BERLIN, u("2026-03-29 01:00")),
    (BERLIN, u("2026-10-25 01:00")),
    (NEW_YORK, u("2026-03-08 07:00")),
    (NEW_YORK, u("2026-11-01 06:00")),
    (LORD_HOWE, u("2026-04-04 15:00")),
    (LORD_HOWE, u("2026-10-03 15:30")),
]


@pytest.mark.parametrize("expr", ["*/15 * * * *", "30 2 * * *", "*/7 * * * * *", "0 * * * *"])
@settings(max_examples=examples(150), deadline=None, derandomize=True)
@given(
    transition=st.sampled_from(TRANSITIONS),
    delta_ms=st.integers(-3 * 3_600_000, 3 * 3_600_000),
    frac=st.floats(0, 1, exclude_max=True),
)
def test_invariants_around_transitions(
    expr: str, transition: tuple[str, datetime], delta_ms: int, frac: float
) -> None:
    """Whole seconds, strictly after, and every after_ms in the interval agrees."""
    zone, instant = transition
    sched = parse_schedule(expr, ZoneInfo(zone))
    after = ms(instant) + delta_ms
    slot = sched.next_slot(after)
    assert slot > after
    assert slot % 1000 == 0
    inside = after + int((slot - after) * frac)
    assert sched.next_slot(inside) == slot
    assert sched.next_slot(slot - 1) == slot
    assert sched.slots(after, 2)[0] == slot


@pytest.mark.parametrize(("zone", "instant"), TRANSITIONS)
@pytest.mark.parametrize(
    ("expr", "matches"),
    [
        ("* * * * *", lambda c: True),
        ("*/15 * * * *", lambda c: c.minute % 15 == 0),
        ("0,40 * * * *", lambda c: c.minute in (0, 40)),
        ("45 1,2 * * *", lambda c: c.minute == 45 and c.hour in (1, 2)),
    ],
)
def test_matches_brute_force(
    zone: str, instant: datetime, expr: str, matches: Callable[[datetime], bool]
) -> None:
    """An independent statement of the rules: a local time c runs at the first
    instant whose local wall clock reads c or later (first pass; end of a gap)."""
    tz = ZoneInfo(zone)
    instants = [instant + timedelta(minutes=m) for m in range(-240, 241)]
    walls = [t.astimezone(tz).replace(tzinfo=None) for t in instants]
    candidates = [walls[0] + timedelta(minutes=m) for m in range(1, 600)]
    expected = sorted(
        {
            next(t for t, wall in zip(instants, walls, strict=True) if wall >= c)
            for c in candidates
            if c <= walls[-1] and matches(c)
        }
    )
    assert slots_of(expr, zone, instants[0], len(expected)) == expected


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        # after_ms in the second pass: start from the overlap's end
        (u("2026-10-25 01:00:00.5"), [u("2026-10-25 02:00:00"), u("2026-10-25 02:00:01")]),
        # across a gap: resume the naive walk at the gap's end
        (u("2026-03-29 00:59:59"), [u("2026-03-29 01:00:00"), u("2026-03-29 01:00:01")]),
    ],
)
def test_no_walk_through_an_hour_of_seconds(
    monkeypatch: pytest.MonkeyPatch, after: datetime, expected: list[datetime]
) -> None:
    seen = 0

    class CountingCronSim(CronSim):
        def __next__(self) -> datetime:
            nonlocal seen
            seen += 1
            return super().__next__()

    sched = parse_schedule("* * * * * *", ZoneInfo(BERLIN))
    monkeypatch.setattr(schedule_module, "CronSim", CountingCronSim)
    assert slots_of(sched.expr, BERLIN, after, 2) == expected
    assert seen <= 4


def test_a_thousand_jobs_start_fast() -> None:
    """1,000 jobs parse and compute their next slot quickly (about 50 ms here)."""
    exprs = ["*/5 * * * *", "30 2 * * *", "* * * * * *", "0 0 29 2 *", "0 9 * * MON-FRI"]
    tz = ZoneInfo(BERLIN)
    after = ms(u("2026-10-25 01:30"))  # in the second pass, the slowest start
    started = time.perf_counter()
    for i in range(1000):
        parse_schedule(exprs[i % len(exprs)], tz).next_slot(after + i)
    assert time.perf_counter() - started < 2.0
