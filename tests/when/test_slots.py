"""Tables for sidecar/when/slots.py: unions, spread, exclusions, L/W/# (words: test_describe.py).

DST instants as in test_schedule.py: Europe/Berlin springs forward on
2026-03-29 at 01:00Z (local 02:00-03:00 missing, a 23-hour day) and falls
back on 2026-10-25 at 01:00Z (local 02:00-03:00 twice, a 25-hour day).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from sidecar.core.errors import ScheduleError
from sidecar.when.slots import parse_calendar, parse_exclusion, spread_offset_ms

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")
UTC_Z = ZoneInfo("UTC")


def u(text: str) -> int:
    """Epoch ms of a UTC "YYYY-MM-DD HH:MM[:SS]"."""
    return (datetime.fromisoformat(text).replace(tzinfo=UTC) - EPOCH) // timedelta(milliseconds=1)


# fmt: off
UNIONS = [
    # two expressions, the instants they share are one slot
    (["*/2 * * * * *", "*/3 * * * * *"], UTC_Z, "2026-01-01 00:00:00",
        ["2026-01-01 00:00:02", "2026-01-01 00:00:03", "2026-01-01 00:00:04",
         "2026-01-01 00:00:06", "2026-01-01 00:00:08", "2026-01-01 00:00:09"]),
    # the same expression twice is one
    (["0 * * * *", "0 * * * *"], UTC_Z, "2026-01-01 00:00",
        ["2026-01-01 01:00", "2026-01-01 02:00"]),
    # spring forward: 02:30 does not exist and runs at the transition, 03:00 CEST is
    # the same instant: one slot, not two
    (["30 2 * * *", "0 3 * * *"], BERLIN, "2026-03-28 12:00",
        ["2026-03-29 01:00", "2026-03-30 00:30", "2026-03-30 01:00"]),
    # fall back: 02:30 runs once (first pass, CEST), 01:30 and 02:30 stay apart
    (["30 1 * * *", "30 2 * * *"], BERLIN, "2026-10-24 12:00",
        ["2026-10-24 23:30", "2026-10-25 00:30", "2026-10-26 00:30"]),
    # last day of the month and second Monday, in Berlin (CET)
    (["0 0 L * *", "0 9 * * 1#2"], BERLIN, "2026-01-01 00:00",
        ["2026-01-12 08:00", "2026-01-30 23:00", "2026-02-09 08:00", "2026-02-27 23:00"]),
]
# fmt: on


@pytest.mark.parametrize(("exprs", "tz", "after", "expected"), UNIONS)
def test_union_slots(exprs: list[str], tz: ZoneInfo, after: str, expected: list[str]) -> None:
    cal = parse_calendar(exprs, tz)
    assert cal.slots(u(after), len(expected)) == [u(e) for e in expected]


# fmt: off
QUARTZ = [
    ("0 0 L * *", BERLIN, "2026-02-01 00:00", ["2026-02-27 23:00", "2026-03-30 22:00"]),
    ("0 0 LW * *", UTC_Z, "2026-01-01 00:00", ["2026-01-30 00:00", "2026-02-27 00:00"]),
    ("0 12 * * 5L", UTC_Z, "2026-01-01 00:00", ["2026-01-30 12:00", "2026-02-27 12:00"]),
    # the second Sunday of March 2026 is the 8th; Berlin is still CET then
    ("0 2 * * 0#2", BERLIN, "2026-03-01 00:00", ["2026-03-08 01:00", "2026-04-12 00:00"]),
    # the last Sunday of March is the spring-forward day: 02:30 runs at the transition
    ("30 2 * * 0L", BERLIN, "2026-03-01 00:00", ["2026-03-29 01:00", "2026-04-26 00:30"]),
    # and of October, the fall-back day: once, at the first 02:30 (CEST)
    ("30 2 * * 0L", BERLIN, "2026-10-01 00:00", ["2026-10-25 00:30", "2026-11-29 01:30"]),
]
# fmt: on


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), QUARTZ)
def test_last_weekday_and_nth_are_allowed(
    expr: str, tz: ZoneInfo, after: str, expected: list[str]
) -> None:
    cal = parse_calendar(expr, tz)
    assert cal.slots(u(after), len(expected)) == [u(e) for e in expected]
    assert cal.unportable()  # check says the reference backend cannot run it


def test_portable_expressions_say_nothing() -> None:
    assert parse_calendar(["*/5 * * * *", "0 0 1 JUL MON"], UTC_Z).unportable() == []


def test_spread_offset_is_a_stable_contract() -> None:
    # Pinned: any change here changes every spread job's slot ids.
    assert spread_offset_ms("nightly-report", 3600) == 3_264_000
    assert spread_offset_ms("sync", 300) == 264_000
    assert spread_offset_ms("sync", 0) == 0
    offsets = {spread_offset_ms(f"job-{i}", 3600) for i in range(100)}
    assert all(0 <= o < 3_600_000 and o % 1000 == 0 for o in offsets)
    assert len(offsets) > 95  # a hundred jobs at :00 spread over the hour


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [
        ("0 * * * *", UTC_Z, "2026-01-01 00:00", ["2026-01-01 00:54:24", "2026-01-01 01:54:24"]),
        # moved by the same offset across the 23-hour day
        ("30 2 * * *", BERLIN, "2026-03-28 12:00", ["2026-03-29 01:54:24", "2026-03-30 01:24:24"]),
    ],
)
def test_spread_moves_every_slot_by_the_job_offset(
    expr: str, tz: ZoneInfo, after: str, expected: list[str]
) -> None:
    cal = parse_calendar(expr, tz, "nightly-report", 3600)
    assert cal.offset_ms == 3_264_000
    assert cal.slots(u(after), 2) == [u(e) for e in expected]
    # A slot is strictly after `after`, also when `after` is a moved slot itself.
    assert cal.next_slot(u(expected[0])) == u(expected[1])


@pytest.mark.parametrize(
    ("text", "tz", "start", "end"),
    [
        ("2026-12-24", BERLIN, "2026-12-23 23:00", "2026-12-24 23:00"),
        ("2026-03-29", BERLIN, "2026-03-28 23:00", "2026-03-29 22:00"),  # 23 hours
        ("2026-10-25", BERLIN, "2026-10-24 22:00", "2026-10-25 23:00"),  # 25 hours
        ("2026-12-31T22:00:00+01:00/2027-01-01T06:00:00+01:00", BERLIN,
            "2026-12-31 21:00", "2027-01-01 05:00"),
        ("2026-12-24T18:00/PT12H", BERLIN, "2026-12-24 17:00", "2026-12-25 05:00"),
        ("2026-07-01T00:00Z/P1DT2H", BERLIN, "2026-07-01 00:00", "2026-07-02 02:00"),
        # a wall-time interval over the fall-back hour: its start is the first 02:00
        ("2026-10-25T02:00/2026-10-25T03:00", BERLIN, "2026-10-25 00:00", "2026-10-25 02:00"),
    ],
)  # fmt: skip
def test_exclusions_in_the_job_timezone(text: str, tz: ZoneInfo, start: str, end: str) -> None:
    excl = parse_exclusion(text, tz)
    assert (excl.start_ms, excl.end_ms) == (u(start), u(end))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("2026-13-01", "not a date"),
        ("tomorrow", "neither a date"),
        ("2026-12-24T10:00Z/2026-12-24T09:00Z", "ends before it starts"),
        ("2026-12-24T10:00Z/PX", "not an ISO 8601 duration"),
        ("2026-12-24T25:00Z/PT1H", "not an ISO 8601 date and time"),
    ],
)
def test_bad_exclusions_say_why(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_exclusion(text, UTC_Z)


def test_excluded_slots_are_walked_but_do_not_run() -> None:
    cal = parse_calendar("0 9 * * *", BERLIN, exclude=["2026-12-24", "2026-12-25"])
    after = u("2026-12-23 12:00")
    assert cal.slots(after, 3) == [
        u("2026-12-24 08:00"),
        u("2026-12-25 08:00"),
        u("2026-12-26 08:00"),
    ]
    assert cal.runs(after, 2) == [u("2026-12-26 08:00"), u("2026-12-27 08:00")]
    assert cal.next_run(after) == u("2026-12-26 08:00")
    excl = cal.excluded(u("2026-12-25 08:00"))
    assert excl is not None and excl.text == "2026-12-25"
    assert cal.excluded(u("2026-12-26 08:00")) is None


@pytest.mark.parametrize(
    ("exprs", "tz", "slot", "previous"),
    [
        ("* * * * *", UTC_Z, "2026-01-01 00:10", "2026-01-01 00:09"),
        ("0 9 * * 1#2", BERLIN, "2026-02-09 08:00", "2026-01-12 08:00"),
        ("30 2 * * *", BERLIN, "2026-03-30 00:30", "2026-03-29 01:00"),  # over the 23-hour day
        ("30 2 * * *", BERLIN, "2026-10-26 01:30", "2026-10-25 00:30"),  # over the 25-hour day
        (["*/2 * * * * *", "*/3 * * * * *"], UTC_Z, "2026-01-01 00:00:06", "2026-01-01 00:00:04"),
        ("0 0 29 2 *", UTC_Z, "2028-02-29 00:00", "2024-02-29 00:00"),
    ],
)
def test_previous_slot(exprs: str | list[str], tz: ZoneInfo, slot: str, previous: str) -> None:
    assert parse_calendar(exprs, tz).previous_slot(u(slot)) == u(previous)


def test_previous_slot_counts_the_spread() -> None:
    cal = parse_calendar("0 * * * *", UTC_Z, "nightly-report", 3600)
    assert cal.previous_slot(u("2026-01-01 01:54:24")) == u("2026-01-01 00:54:24")


def test_previous_slot_is_worked_out_once_for_the_jobs_sharing_a_calendar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A burst of first runs of one schedule's jobs (issue 49) asks the shared
    # calendar for the same slot's previous: worked out once, and a memo that
    # never answers for another slot.
    from sidecar.when.slots import Calendar

    worked: list[int] = []
    before = Calendar._slot_before

    def counted(cal: Calendar, slot_ms: int) -> int | None:
        worked.append(slot_ms)
        return before(cal, slot_ms)

    monkeypatch.setattr(Calendar, "_slot_before", counted)
    cal = parse_calendar("7 13 14 * * *", UTC_Z)
    fresh = parse_calendar("7 13 14 * * *", UTC_Z)
    slot, later = u("2026-03-02 14:13:07"), u("2026-03-03 14:13:07")
    answers = [cal.previous_slot(s) for s in (slot, slot, slot, later, slot)]
    assert answers == [u("2026-03-01 14:13:07")] * 3 + [slot, u("2026-03-01 14:13:07")]
    assert worked == [slot, later, slot]
    assert fresh.previous_slot(later) == slot and cal == fresh


def test_min_interval_of_a_union_sees_close_expressions() -> None:
    cal = parse_calendar(["0 * * * *", "5 * * * *"], UTC_Z)
    assert cal.min_interval_ms() == 5 * 60_000
    assert parse_calendar("*/10 * * * *", UTC_Z).min_interval_ms() == 600_000


def test_between_lists_runs_in_a_closed_range_bounded() -> None:
    cal = parse_calendar("0 * * * *", UTC_Z, exclude=["2026-01-01T02:00Z/PT1H"])
    got = cal.between(u("2026-01-01 00:00"), u("2026-01-01 04:00"), 100)
    assert got == [u(f"2026-01-01 0{h}:00") for h in (0, 1, 3, 4)]
    assert len(cal.between(u("2026-01-01 00:00"), u("2026-02-01 00:00"), 10)) == 11


def test_identity_of_a_plain_job_is_its_expression() -> None:
    assert parse_calendar("*/5 * * * *", UTC_Z).identity == "*/5 * * * *"
    cal = parse_calendar(["0 * * * *", "30 * * * *"], UTC_Z, "x", 60, ["2026-01-01"])
    assert cal.identity == "0 * * * * | 30 * * * * spread=60 exclude=2026-01-01"


def test_bad_expression_in_a_list_is_named() -> None:
    with pytest.raises(ScheduleError, match="bad minute field '61'"):
        parse_calendar(["* * * * *", "61 * * * *"], UTC_Z)


# ---------------------------------------------------------------- the state bucket's values


def test_pause_skip_and_since_values() -> None:
    from sidecar.run.since import floor_ms
    from sidecar.when.pauses import new_skip_value, pause_active, pending, skip_slots

    now = 1_000_000
    assert pause_active({"by": "x"}, now)  # no end: until resumed
    assert pause_active({"until": "1970-01-01T00:16:41Z"}, now)  # 1,001,000 ms
    assert not pause_active({"until": "1970-01-01T00:16:40Z"}, now)  # ended exactly now
    assert pause_active({"until": "garbage"}, now)  # unreadable end: stays paused, safe side
    assert not pause_active(None, now)
    assert skip_slots({"slots": [3, True, "4", 5.0, 6]}) == {3, 6}
    assert pending({"slots": [now - 1, now, now + 1, now + 2]}, now) == 2
    value = new_skip_value({"slots": [5]}, [7, 5], "me@h", "t", "why")
    assert value == {"slots": [5, 7], "by": "me@h", "at": "t", "reason": "why"}
    assert floor_ms(None, None, now) == 0
    assert floor_ms({"at": 500}, None, now) == 500
    assert floor_ms({"at": 500}, {"until": "1970-01-01T00:00:01Z"}, now) == 1000
    assert floor_ms({"at": 500}, {"until": "1970-01-01T01:00:00Z"}, now) == 500  # not ended
    assert floor_ms({"at": True}, None, now) == 0
