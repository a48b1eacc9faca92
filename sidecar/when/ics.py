"""An iCalendar file (RFC 5545) read as the events a shared calendar excludes.

Only what a calendar of holidays or freeze windows needs, without a
dependency (docs/SCHEDULES.md, "Shared calendars"): lines unfolded (CRLF or
LF, a continuation starts with a space or a tab), each ``VEVENT``'s
``DTSTART`` with ``DTEND`` or ``DURATION``, as a date (``VALUE=DATE``: whole
days in the job's timezone, as ``exclude: [2026-12-24]``), a UTC time
(``...Z``), a time in an IANA zone (``TZID=Europe/Berlin``) or a floating time
(a wall time in the job's timezone), and ``RRULE`` ``FREQ=YEARLY`` on the
start's own date (``INTERVAL``, ``COUNT``, ``UNTIL``). Everything else that
would change which instants an event covers (another ``FREQ``, ``BYDAY``,
``RDATE``, ``EXDATE``, ``RECURRENCE-ID``) is refused by its line, never
guessed; other properties (``SUMMARY``, ``UID``...) and other components
(``VTIMEZONE``, ``VALARM``) are ignored. A cancelled event
(``STATUS:CANCELLED``) excludes nothing. Pure: text in, :class:`Event` out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sidecar.core.errors import IcsError

# At most this many events in one calendar (each slot is checked against them).
MAX_EVENTS = 10_000
_DATE = re.compile(r"(\d{4})(\d{2})(\d{2})", re.ASCII)
_DATE_TIME = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})(Z?)", re.ASCII)
_DURATION = re.compile(
    r"\+?P(?:(?P<w>\d+)W|(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?)",
    re.ASCII,
)
_NAME = re.compile(r"[A-Za-z0-9-]+", re.ASCII)
# RRULE parts that do not change a fixed-date yearly rule's instants (WKST: weekly only).
_RRULE_PARTS = ("FREQ", "INTERVAL", "COUNT", "UNTIL", "BYMONTH", "BYMONTHDAY", "WKST")
_REFUSED = {
    "RDATE": "RDATE (extra occurrences) is not supported: list each as its own VEVENT",
    "EXDATE": "EXDATE (removed occurrences) is not supported: end the RRULE with UNTIL "
    "and start a new VEVENT",
    "RECURRENCE-ID": "RECURRENCE-ID (a changed occurrence) is not supported",
    "EXRULE": "EXRULE is not supported",
}
# A yearly event longer than this would overlap its next year's occurrence.
_MAX_YEARLY = timedelta(days=300)


@dataclass(frozen=True)
class Yearly:
    """``RRULE:FREQ=YEARLY``: every ``interval`` years from the start, bounded by
    ``count`` occurrences or by ``until`` (a start after it does not occur)."""

    interval: int = 1
    count: int | None = None
    until: date | datetime | None = None


@dataclass(frozen=True)
class Event:
    """One VEVENT: [start, end). Dates are whole days; a ``datetime`` is naive with
    ``zone`` its IANA zone (``UTC`` for ``Z``), or None: a wall time of the job's zone."""

    start: date | datetime
    end: date | datetime
    zone: str | None
    yearly: Yearly | None
    line: int  # the line of its BEGIN:VEVENT

    @property
    def all_day(self) -> bool:
        return not isinstance(self.start, datetime)

    @property
    def text(self) -> str:
        """The event as ``exclude`` writes it (plus how it repeats): what a skipped
        slot's record says and what the calendar's hash covers."""
        if not isinstance(self.start, datetime):
            days = (self.end - self.start).days  # type: ignore[operator]
            text = str(self.start) if days == 1 else f"{self.start}/{self.end}"
        else:
            text = f"{_stamp(self.start, self.zone)}/{_stamp(self.end, self.zone)}"  # type: ignore[arg-type]
        if self.yearly is not None:
            every = "yearly" if self.yearly.interval == 1 else f"every {self.yearly.interval} years"
            text += f" {every}"
            if self.yearly.count is not None:
                count = self.yearly.count
                text += ", once" if count == 1 else f", {count} times"
            if self.yearly.until is not None:
                text += f", until {self.yearly.until.isoformat()}"
            if self.zone not in (None, "UTC"):
                text += f" ({self.zone})"
        return text


def _stamp(wall: datetime, zone: str | None) -> str:
    """A wall time as ``exclude`` reads it: with its offset, ``Z``, or none (floating)."""
    if zone is None:
        return wall.isoformat()
    if zone == "UTC":
        return wall.isoformat() + "Z"
    return wall.replace(tzinfo=ZoneInfo(zone)).isoformat()


def unfold(text: str) -> list[tuple[int, str]]:
    """The logical lines of `text` with the number of the physical line each starts on."""
    out: list[tuple[int, str]] = []
    for number, line in enumerate(re.split(r"\r\n|\n|\r", text), 1):
        if line[:1] in (" ", "\t") and out:
            out[-1] = (out[-1][0], out[-1][1] + line[1:])
        elif line.strip():
            out.append((number, line))
    return out


def content_line(line: str, number: int) -> tuple[str, dict[str, str], str]:
    """``NAME;PARAM=value;...:VALUE`` -> (NAME upper-cased, params, value)."""
    quoted = False
    cut = -1
    for i, char in enumerate(line):
        if char == '"':
            quoted = not quoted
        elif char == ":" and not quoted:
            cut = i
            break
    if cut < 0:
        raise IcsError(number, f"not a content line NAME:VALUE: {line[:60]!r}")
    head, value = line[:cut], line[cut + 1 :]
    name, *raw_params = _split_params(head)
    if not _NAME.fullmatch(name):
        raise IcsError(number, f"not a property name: {name[:60]!r}")
    params: dict[str, str] = {}
    for param in raw_params:
        key, sep, val = param.partition("=")
        if not sep:
            raise IcsError(number, f"parameter without a value: {param[:60]!r}")
        params[key.upper()] = val.strip('"')
    return name.upper(), params, value


def _split_params(head: str) -> list[str]:
    parts, current, quoted = [], "", False
    for char in head:
        if char == '"':
            quoted = not quoted
        if char == ";" and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def parse_ics(text: str) -> list[Event]:
    """The events of an iCalendar text; :class:`IcsError` names the first bad line."""
    lines = unfold(text.removeprefix("\ufeff"))
    if not lines or lines[0][1].strip().upper() != "BEGIN:VCALENDAR":
        raise IcsError(lines[0][0] if lines else 1, "not an iCalendar file: no BEGIN:VCALENDAR")
    stack: list[tuple[str, int]] = []
    events: list[Event] = []
    props: dict[str, tuple[int, dict[str, str], str]] = {}
    for number, line in lines:
        name, params, value = content_line(line, number)
        if name in ("BEGIN", "END"):
            kind = value.strip().upper()
            if name == "BEGIN":
                stack.append((kind, number))
                if kind == "VEVENT":
                    props = {}
                continue
            if not stack or stack[-1][0] != kind:
                open_ = f"BEGIN:{stack[-1][0]} of line {stack[-1][1]}" if stack else "nothing"
                raise IcsError(number, f"END:{kind} does not end {open_}")
            begun = stack.pop()[1]
            if kind == "VEVENT" and stack and stack[-1][0] == "VCALENDAR":
                event = _event(props, begun)
                if event is not None:
                    events.append(event)
                    if len(events) > MAX_EVENTS:
                        raise IcsError(number, f"more than {MAX_EVENTS} events")
            continue
        if not stack:
            raise IcsError(number, f"{name} outside BEGIN:VCALENDAR ... END:VCALENDAR")
        if stack[-1][0] != "VEVENT":
            continue  # VCALENDAR's own, VTIMEZONE's, VALARM's: nothing to exclude
        if name in _REFUSED:
            raise IcsError(number, _REFUSED[name])
        if name in ("DTSTART", "DTEND", "DURATION", "RRULE", "STATUS"):
            if name in props:
                raise IcsError(number, f"{name} given twice in one VEVENT")
            props[name] = (number, params, value.strip())
    if stack:
        kind, begun = stack[-1]
        raise IcsError(begun, f"BEGIN:{kind} is never ended")
    return events


def _event(props: dict[str, tuple[int, dict[str, str], str]], begun: int) -> Event | None:
    """The VEVENT of these properties; None when it excludes nothing."""
    if "DTSTART" not in props:
        raise IcsError(begun, "VEVENT without DTSTART")
    status = props.get("STATUS")
    if status is not None and status[2].upper() == "CANCELLED":
        return None
    start, zone = _when(*props["DTSTART"])
    if "DTEND" in props and "DURATION" in props:
        raise IcsError(props["DURATION"][0], "DTEND and DURATION: give one of them")
    if "DTEND" in props:
        number = props["DTEND"][0]
        end, end_zone = _when(*props["DTEND"])
        if isinstance(end, datetime) != isinstance(start, datetime):
            raise IcsError(number, "DTEND is a date and DTSTART a time, or the other way")
        if isinstance(start, datetime) and end_zone != zone:
            # Both in one zone, so the wall span is the span (and yearly repeats it).
            end = _convert(end, end_zone, zone, number)  # type: ignore[arg-type]
    elif "DURATION" in props:
        number, _, text = props["DURATION"]
        span = _duration(text, number)
        if not isinstance(start, datetime) and span % timedelta(days=1):
            raise IcsError(number, "an all-day event's DURATION is whole days (P1D, P2W)")
        end = start + span
    else:  # RFC 5545 3.6.1: a date lasts one day, a time no time at all
        end = start + timedelta(days=1) if not isinstance(start, datetime) else start
    if end < start:
        raise IcsError(
            props.get("DTEND", props.get("DURATION", (begun,)))[0], "ends before it starts"
        )
    yearly = _rrule(*props["RRULE"], start, zone) if "RRULE" in props else None
    if yearly is not None and end - start > _MAX_YEARLY:  # type: ignore[operator]
        raise IcsError(props["RRULE"][0], "a yearly event lasts at most 300 days")
    if end == start:
        return None  # an instant: no slot lies in [start, start)
    return Event(start, end, zone, yearly, begun)


def _when(number: int, params: dict[str, str], value: str) -> tuple[date | datetime, str | None]:
    """A DTSTART/DTEND value and its zone (None: floating or a date)."""
    kind = params.get("VALUE", "").upper()
    if kind == "DATE" or (not kind and _DATE.fullmatch(value)):
        match = _DATE.fullmatch(value)
        if match is None:
            raise IcsError(number, f"{value[:40]!r} is not a date such as 20261224")
        try:
            return date(*map(int, match.groups())), None
        except ValueError as exc:
            raise IcsError(number, f"{value!r} is not a date: {exc}") from None
    if kind not in ("", "DATE-TIME"):
        raise IcsError(number, f"VALUE={kind} is neither DATE nor DATE-TIME")
    match = _DATE_TIME.fullmatch(value)
    if match is None:
        raise IcsError(number, f"{value[:40]!r} is not a date-time such as 20261224T180000 or ...Z")
    try:
        y, mo, d, h, mi, s = (int(g) for g in match.groups()[:6])
        wall = datetime(y, mo, d, h, mi, s)
    except ValueError as exc:
        raise IcsError(number, f"{value!r} is not a date-time: {exc}") from None
    if match.group(7):
        return wall, "UTC"
    tzid = params.get("TZID")
    if tzid is None:
        return wall, None
    zone = tzid.lstrip("/")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise IcsError(
            number, f"TZID {tzid[:60]!r} is not an IANA time zone (such as Europe/Berlin)"
        ) from None
    return wall, zone


def _convert(wall: datetime, source: str | None, target: str | None, number: int) -> datetime:
    """A wall time of one zone as a wall time of another (both must be known)."""
    if source is None or target is None:
        raise IcsError(number, "DTSTART and DTEND mix a floating time with a zoned one")
    aware = wall.replace(tzinfo=ZoneInfo(source)).astimezone(ZoneInfo(target))
    return aware.replace(tzinfo=None)


def _duration(text: str, number: int) -> timedelta:
    match = _DURATION.fullmatch(text)
    if match is None or text.lstrip("+") in ("P", "PT"):
        raise IcsError(number, f"{text[:40]!r} is not a DURATION such as P1D or PT2H")
    w, d, h, m, s = (int(match.group(k) or 0) for k in "wdhms")
    return timedelta(weeks=w, days=d, hours=h, minutes=m, seconds=s)


def _rrule(
    number: int, params: dict[str, str], value: str, start: date | datetime, zone: str | None
) -> Yearly:
    parts: dict[str, str] = {}
    for item in value.split(";"):
        key, sep, val = item.partition("=")
        key = key.strip().upper()
        if not sep or key in parts:
            raise IcsError(number, f"RRULE part {item[:40]!r} is not NAME=value (once each)")
        if key not in _RRULE_PARTS:
            raise IcsError(
                number, f"RRULE {key}: only fixed-date yearly rules (FREQ=YEARLY) are supported"
            )
        parts[key] = val.strip()
    if parts.get("FREQ", "").upper() != "YEARLY":
        raise IcsError(number, f"RRULE FREQ={parts.get('FREQ', '')}: only FREQ=YEARLY is supported")
    if parts.get("BYMONTH", str(start.month)).lstrip("0") != str(start.month) or parts.get(
        "BYMONTHDAY", str(start.day)
    ).lstrip("0") != str(start.day):
        raise IcsError(number, "RRULE BYMONTH/BYMONTHDAY: only the start's own date is supported")
    if "COUNT" in parts and "UNTIL" in parts:
        raise IcsError(number, "RRULE has COUNT and UNTIL: give one of them")
    interval = _positive(parts.get("INTERVAL", "1"), "INTERVAL", number)
    count = _positive(parts["COUNT"], "COUNT", number) if "COUNT" in parts else None
    until = None
    if "UNTIL" in parts:
        until, until_zone = _when(number, {}, parts["UNTIL"])
        if isinstance(until, datetime) and until_zone is not None and zone is not None:
            until = _convert(until, until_zone, zone, number)  # compared in the event's zone
    return Yearly(interval, count, until)


def _positive(text: str, part: str, number: int) -> int:
    if not re.fullmatch(r"[1-9]\d{0,5}", text, re.ASCII):
        raise IcsError(number, f"RRULE {part}={text[:20]!r} is not a whole number from 1")
    return int(text)
