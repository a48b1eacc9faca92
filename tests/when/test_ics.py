"""The iCalendar reader (sidecar/when/ics.py) and shared calendars in a job's zone
(sidecar/when/shared.py): pure tables, no file, no clock."""

from __future__ import annotations

from datetime import date, datetime
from zoneinfo import ZoneInfo

import pytest

from sidecar.core.errors import IcsError
from sidecar.when.ics import Event, Yearly, parse_ics, unfold
from sidecar.when.shared import SharedCalendar
from sidecar.when.slots import parse_calendar

BERLIN = ZoneInfo("Europe/Berlin")
UTC = ZoneInfo("UTC")


def ics(*lines: str, eol: str = "\r\n") -> str:
    """A calendar of `lines` (the VEVENTs and what else), as producers write it."""
    return (
        eol.join(["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//test//EN", *lines, "END:VCALENDAR"])
        + eol
    )


def event(*props: str) -> list[str]:
    return ["BEGIN:VEVENT", "UID:1@test", "DTSTAMP:20260101T000000Z", *props, "END:VEVENT"]


def ms(text: str) -> int:
    return round(datetime.fromisoformat(text).timestamp() * 1000)


@pytest.mark.parametrize(
    ("props", "text"),
    [
        # all day: one day without DTEND, several with DTEND (exclusive) or DURATION
        (["DTSTART;VALUE=DATE:20261224"], "2026-12-24"),
        (["DTSTART;VALUE=DATE:20261225", "DTEND;VALUE=DATE:20261227"], "2026-12-25/2026-12-27"),
        (["DTSTART;VALUE=DATE:20261225", "DURATION:P2D"], "2026-12-25/2026-12-27"),
        (["DTSTART:20261224"], "2026-12-24"),  # a date without VALUE=DATE, as some write it
        # a UTC time, a time of an IANA zone, a floating time (the job's zone)
        (
            ["DTSTART:20261231T220000Z", "DTEND:20270101T060000Z"],
            "2026-12-31T22:00:00Z/2027-01-01T06:00:00Z",
        ),
        (
            [
                "DTSTART;TZID=Europe/Berlin:20261231T220000",
                "DTEND;TZID=Europe/Berlin:20270101T060000",
            ],
            "2026-12-31T22:00:00+01:00/2027-01-01T06:00:00+01:00",
        ),
        (
            ['DTSTART;TZID="/Europe/Berlin":20260701T180000', "DURATION:PT2H30M"],
            "2026-07-01T18:00:00+02:00/2026-07-01T20:30:00+02:00",
        ),
        (["DTSTART:20260701T180000", "DURATION:PT1H"], "2026-07-01T18:00:00/2026-07-01T19:00:00"),
        # DTEND in another zone than DTSTART: the span in DTSTART's
        (
            ["DTSTART;TZID=Europe/Berlin:20260701T180000", "DTEND:20260701T170000Z"],
            "2026-07-01T18:00:00+02:00/2026-07-01T19:00:00+02:00",
        ),
        # yearly on a fixed date, with its bounds
        (["DTSTART;VALUE=DATE:20260501", "RRULE:FREQ=YEARLY"], "2026-05-01 yearly"),
        (
            ["DTSTART;VALUE=DATE:20261003", "RRULE:FREQ=YEARLY;INTERVAL=2;COUNT=3"],
            "2026-10-03 every 2 years, 3 times",
        ),
        (
            [
                "DTSTART;VALUE=DATE:20261225",
                "RRULE:FREQ=YEARLY;BYMONTH=12;BYMONTHDAY=25;UNTIL=20301231",
            ],
            "2026-12-25 yearly, until 2030-12-31",
        ),
        (
            ["DTSTART;TZID=Europe/Berlin:20261231T180000", "DURATION:PT12H", "RRULE:FREQ=YEARLY"],
            "2026-12-31T18:00:00+01:00/2027-01-01T06:00:00+01:00 yearly (Europe/Berlin)",
        ),
    ],
)
def test_an_event_reads_as_exclude_writes_it(props: list[str], text: str) -> None:
    (found,) = parse_ics(ics(*event(*props)))
    assert found.text == text


def test_folded_lines_lf_and_crlf_read_alike() -> None:
    lines = [
        "BEGIN:VEVENT",
        "SUMMARY:Erster Weih",
        " nachtstag",  # a continuation: one space, then the text
        "DTSTART;VALUE=DA",
        "\tTE:20261225",  # a tab continues too, even inside the name and params
        "END:VEVENT",
    ]
    crlf, lf = parse_ics(ics(*lines)), parse_ics(ics(*lines, eol="\n"))
    assert crlf == lf
    assert [e.start for e in crlf] == [date(2026, 12, 25)]
    assert unfold("A:1\r\n B\r\nC:2") == [(1, "A:1B"), (3, "C:2")]


def test_what_excludes_nothing_is_left_out() -> None:
    text = ics(
        *event("DTSTART;VALUE=DATE:20261224", "STATUS:CANCELLED"),
        *event("DTSTART:20261224T100000Z"),  # an instant: no slot lies in [t, t)
        "BEGIN:VTIMEZONE",  # its DTSTART and RRULE are no events
        "TZID:Europe/Berlin",
        "BEGIN:STANDARD",
        "DTSTART:19701025T030000",
        "RRULE:FREQ=YEARLY;BYDAY=-1SU;BYMONTH=10",
        "END:STANDARD",
        "END:VTIMEZONE",
        *event(
            "DTSTART;VALUE=DATE:20261231",
            "BEGIN:VALARM",  # nor are an alarm's
            "TRIGGER:-PT15M",
            "DURATION:PT5M",
            "END:VALARM",
        ),
    )
    assert [e.text for e in parse_ics(text)] == ["2026-12-31"]
    assert parse_ics(ics()) == []  # an empty calendar excludes nothing


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("", 1, "not an iCalendar file"),
        ("BEGIN:VEVENT\r\nEND:VEVENT\r\n", 1, "not an iCalendar file"),
        (ics(*event("DTSTART;VALUE=DATE:20261324")), 7, "month must be in 1..12"),
        (ics(*event("DTSTART:2026-12-24")), 7, "not a date-time"),
        (ics(*event("DTSTART;VALUE=PERIOD:20261224")), 7, "neither DATE nor DATE-TIME"),
        (ics(*event("SUMMARY:no start")), 4, "VEVENT without DTSTART"),
        (ics(*event("DTSTART:20261224", "DTSTART:20261225")), 8, "DTSTART given twice"),
        (ics(*event("DTSTART;TZID=W. Europe Standard Time:20261224T100000")), 7, "IANA"),
        (
            ics(*event("DTSTART;VALUE=DATE:20261224", "DTEND:20261225T100000Z")),
            8,
            "DTEND is a date",
        ),
        (ics(*event("DTSTART;VALUE=DATE:20261224", "DTEND;VALUE=DATE:20261223")), 8, "ends before"),
        (ics(*event("DTSTART;VALUE=DATE:20261224", "DURATION:PT2H")), 8, "whole days"),
        (ics(*event("DTSTART:20261224T100000Z", "DURATION:-PT1H")), 8, "not a DURATION"),
        (
            ics(*event("DTSTART:20261224T100000Z", "DTEND:20261224T110000Z", "DURATION:PT1H")),
            9,
            "give one",
        ),
        (ics(*event("DTSTART:20261224", "RRULE:FREQ=WEEKLY")), 8, "only FREQ=YEARLY"),
        (
            ics(*event("DTSTART:20261126", "RRULE:FREQ=YEARLY;BYMONTH=11;BYDAY=4TH")),
            8,
            "RRULE BYDAY",
        ),
        (ics(*event("DTSTART:20261224", "RRULE:FREQ=YEARLY;BYMONTHDAY=1")), 8, "start's own date"),
        (
            ics(*event("DTSTART:20261224", "RRULE:FREQ=YEARLY;COUNT=2;UNTIL=20301224")),
            8,
            "COUNT and UNTIL",
        ),
        (ics(*event("DTSTART:20261224", "RRULE:FREQ=YEARLY;INTERVAL=0")), 8, "INTERVAL"),
        (ics(*event("DTSTART:20261224", "RRULE:FREQ=YEARLY", "EXDATE:20271224")), 9, "EXDATE"),
        (ics(*event("DTSTART:20261224", "RDATE:20271224")), 8, "RDATE"),
        (ics(*event("DTSTART:20261224", "RECURRENCE-ID:20261224")), 8, "RECURRENCE-ID"),
        (ics(*event("DTSTART:20260101", "DURATION:P301D", "RRULE:FREQ=YEARLY")), 9, "300 days"),
        (ics(*event("DTSTART:20261224", "no colon here")), 8, "not a content line"),
        (ics("BEGIN:VEVENT", "DTSTART:20261224"), 6, "does not end BEGIN:VEVENT of line 4"),
        ("BEGIN:VCALENDAR\r\nBEGIN:VEVENT\r\nDTSTART:20261224\r\n", 2, "is never ended"),
        (ics("END:VEVENT"), 4, "does not end"),
        ("BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\nDTSTART:20261224\r\n", 3, "outside BEGIN:VCALENDAR"),
    ],
)
def test_a_bad_calendar_is_refused_by_its_line(text: str, line: int, says: str) -> None:
    with pytest.raises(IcsError) as caught:
        parse_ics(text)
    assert caught.value.line == line
    assert says in str(caught.value)
    assert str(caught.value).startswith(f"line {line}: ")


def resolved(*lines: str, tz: ZoneInfo = BERLIN) -> SharedCalendar:
    return SharedCalendar("hol", tuple(parse_ics(ics(*lines))), "file hol.ics")


@pytest.mark.parametrize(
    ("slot", "covered"),
    [
        # all day: the job's zone decides the day (Berlin's midnight, not UTC's)
        ("2026-12-24T23:30:00+00:00", "calendar:hol 2026-12-25/2026-12-27"),
        ("2026-12-24T22:59:59+00:00", None),
        ("2026-12-26T22:59:59+00:00", "calendar:hol 2026-12-25/2026-12-27"),
        ("2026-12-26T23:00:00+00:00", None),  # DTEND excluded
        # a TZID time is the same instant whatever the job's zone
        (
            "2026-07-01T16:00:00+00:00",
            "calendar:hol 2026-07-01T18:00:00+02:00/2026-07-01T20:00:00+02:00",
        ),
        ("2026-07-01T18:00:00+00:00", None),
        # yearly, every year from 2026, Berlin's day; Feb 29 only in leap years
        ("2031-04-30T22:00:00+00:00", "calendar:hol 2031-05-01 (2026-05-01 yearly)"),
        ("2025-05-01T12:00:00+00:00", None),  # before the first
        ("2028-02-29T12:00:00+01:00", "calendar:hol 2028-02-29 (2028-02-29 yearly)"),
        ("2029-02-28T12:00:00+01:00", None),
        ("2029-03-01T12:00:00+01:00", None),
        # a yearly night over New Year, in Europe/Berlin
        (
            "2040-01-01T04:00:00+01:00",
            "calendar:hol 2039-12-31 22:00:00 "
            "(2039-12-31T22:00:00/2040-01-01T06:00:00 yearly, once)",
        ),
    ],
)
def test_a_shared_calendar_in_a_jobs_zone(slot: str, covered: str | None) -> None:
    cal = resolved(
        *event("DTSTART;VALUE=DATE:20261225", "DTEND;VALUE=DATE:20261227"),
        *event("DTSTART;TZID=Europe/Berlin:20260701T180000", "DURATION:PT2H"),
        *event("DTSTART;VALUE=DATE:20260501", "RRULE:FREQ=YEARLY"),
        *event("DTSTART;VALUE=DATE:20280229", "RRULE:FREQ=YEARLY"),
        *event("DTSTART:20391231T220000", "DURATION:PT8H", "RRULE:FREQ=YEARLY;COUNT=1"),
    ).resolve(BERLIN)
    found = cal.excluded(ms(slot))
    assert (found.text if found else None) == covered


def test_yearly_bounds_count_until_interval() -> None:
    def years(rule: str) -> list[int]:
        cal = resolved(*event("DTSTART;VALUE=DATE:20260501", rule)).resolve(UTC)
        return [y for y in range(2024, 2036) if cal.excluded(ms(f"{y}-05-01T12:00:00+00:00"))]

    assert years("RRULE:FREQ=YEARLY;COUNT=3") == [2026, 2027, 2028]
    assert years("RRULE:FREQ=YEARLY;UNTIL=20290501") == [2026, 2027, 2028, 2029]
    assert years("RRULE:FREQ=YEARLY;INTERVAL=4;UNTIL=20350101T000000Z") == [2026, 2030, 2034]


def test_the_content_hash_is_of_the_entries_not_the_bytes() -> None:
    lines = [*event("DTSTART;VALUE=DATE:20261224", "SUMMARY:Heiligabend")]
    one = resolved(*lines).digest
    assert resolved(*lines).digest == one
    assert SharedCalendar("x", tuple(parse_ics(ics(*lines, eol="\n"))), "").digest == one
    other = [*event("DTSTART;VALUE=DATE:20261224", "SUMMARY:Christmas Eve")]
    assert resolved(*other).digest == one  # a summary decides nothing
    assert resolved(*event("DTSTART;VALUE=DATE:20261225")).digest != one


def test_a_jobs_calendar_applies_it_and_its_identity_carries_the_hash() -> None:
    shared = resolved(*event("DTSTART;VALUE=DATE:20261225", "DTEND;VALUE=DATE:20261227"))
    cal = parse_calendar(
        "0 9 * * *", BERLIN, "j", exclude=["2026-12-28"], shared=(shared.resolve(BERLIN),)
    )
    runs = cal.runs(ms("2026-12-24T00:00:00+01:00"), 3)
    assert [datetime.fromtimestamp(r / 1000, BERLIN).day for r in runs] == [24, 27, 29]
    assert cal.identity.endswith(f"exclude=2026-12-28 calendars=hol:{shared.digest}")
    assert parse_calendar("0 9 * * *", BERLIN, "j").identity == "0 9 * * *"  # unchanged


def test_many_entries_are_looked_up_not_walked() -> None:
    days = tuple(
        f"{y}-{m:02d}-{d:02d}" for y in range(2026, 2036) for m in range(1, 13) for d in (1, 15)
    )
    cal = SharedCalendar("many", days, "dates").resolve(UTC)
    assert len(cal) == 240
    assert cal.excluded(ms("2031-07-15T12:00:00+00:00")) is not None
    assert cal.excluded(ms("2031-07-16T12:00:00+00:00")) is None
    # overlapping intervals: a long one found behind shorter ones that start later
    cal = SharedCalendar(
        "o", ("2026-01-01/2026-03-01", "2026-01-10", "2026-02-01"), "dates"
    ).resolve(UTC)
    assert cal.excluded(ms("2026-02-20T00:00:00+00:00")).text == "calendar:o 2026-01-01/2026-03-01"  # type: ignore[union-attr]


def test_event_fields() -> None:
    (found,) = parse_ics(ics(*event("DTSTART;VALUE=DATE:20260501", "RRULE:FREQ=YEARLY;COUNT=2")))
    assert found == Event(date(2026, 5, 1), date(2026, 5, 2), None, Yearly(1, 2, None), 4)
    assert found.all_day
