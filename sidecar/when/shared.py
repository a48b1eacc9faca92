"""Shared calendars (``calendars:``): named sets of excluded days and intervals.

A :class:`SharedCalendar` is what the config names: the texts of ``dates:``
(as ``exclude`` takes them) or the events of an iCalendar ``file:``
(sidecar/when/ics.py). A date or a floating time means a wall time of the
job's timezone, as in ``exclude``, so a job resolves the calendar in its own
zone (``resolve``) into a :class:`Resolved`, which ``Calendar.excluded``
(sidecar/when/slots.py) asks about each slot. ``digest`` is a hash of the
entries (not of the file's bytes: CRLF or LF, comments and ``SUMMARY`` do not
change it); a job's ``identity`` carries it, so two replicas with different
contents show the job's settings differing (docs/SCHEDULES.md). Pure.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from sidecar.when.slots import Exclusion, parse_exclusion

if TYPE_CHECKING:  # loaded with the first calendar file (sidecar/config/calendars.py)
    from sidecar.when.ics import Event

PREFIX = "calendar:"


@dataclass(frozen=True)
class SharedCalendar:
    """One entry of ``calendars:``: ``entries`` are exclude texts or ICS events."""

    name: str
    entries: tuple[str | Event, ...]
    source: str  # "file holidays.ics" or "dates"

    @property
    def digest(self) -> str:
        texts = "\n".join(e if isinstance(e, str) else e.text for e in self.entries)
        return hashlib.sha256(texts.encode()).hexdigest()[:12]

    def resolve(self, tz: ZoneInfo) -> Resolved:
        """The calendar in the job's zone `tz`; ValueError names a bad entry."""
        fixed: list[Exclusion] = []
        yearly: list[_Yearly] = []
        for entry in self.entries:
            if not isinstance(entry, str) and entry.yearly is not None:  # an Event
                zone = ZoneInfo(entry.zone) if entry.zone is not None else tz
                yearly.append(_Yearly(self.name, entry, zone))
                continue
            text = entry if isinstance(entry, str) else entry.text
            found = parse_exclusion(text, tz)
            fixed.append(
                Exclusion(f"{PREFIX}{self.name} {found.text}", found.start_ms, found.end_ms)
            )
        fixed.sort(key=lambda e: (e.start_ms, e.end_ms))
        reach: list[int] = []
        for exclusion in fixed:
            reach.append(max(reach[-1], exclusion.end_ms) if reach else exclusion.end_ms)
        return Resolved(
            self.name,
            self.digest,
            tuple(fixed),
            tuple(e.start_ms for e in fixed),
            tuple(reach),
            tuple(yearly),
        )


@dataclass(frozen=True)
class Resolved:
    """A shared calendar in one job's zone: which exclusion covers a slot."""

    name: str
    digest: str
    fixed: tuple[Exclusion, ...]  # sorted by start
    starts: tuple[int, ...]
    reach: tuple[int, ...]  # the latest end among fixed[: i + 1]
    yearly: tuple[_Yearly, ...]

    def excluded(self, slot_ms: int) -> Exclusion | None:
        # The last exclusion starting at or before the slot, then back while an
        # earlier one can still reach it: a few steps, not every holiday of 30 years.
        i = bisect.bisect_right(self.starts, slot_ms) - 1
        while i >= 0 and self.reach[i] > slot_ms:
            if self.fixed[i].covers(slot_ms):
                return self.fixed[i]
            i -= 1
        for rule in self.yearly:
            if (found := rule.covers(slot_ms)) is not None:
                return found
        return None

    def __len__(self) -> int:
        return len(self.fixed) + len(self.yearly)


@dataclass(frozen=True)
class _Yearly:
    """An event of ``RRULE:FREQ=YEARLY`` in `zone`: its occurrence of a slot's year."""

    calendar: str
    event: Event
    zone: ZoneInfo

    def covers(self, slot_ms: int) -> Exclusion | None:
        local = datetime.fromtimestamp(slot_ms / 1000, self.zone)
        for year in (local.year, local.year - 1):  # an event may run into the next year
            found = self._occurrence(year)
            if found is not None and found.covers(slot_ms):
                return found
        return None

    def _occurrence(self, year: int) -> Exclusion | None:
        event, rule = self.event, self.event.yearly
        assert rule is not None
        step = year - event.start.year
        if step < 0 or step % rule.interval:
            return None
        if rule.count is not None and step // rule.interval >= rule.count:
            return None
        try:  # Feb 29 occurs in leap years only (RFC 5545 3.3.10)
            start = event.start.replace(year=year)
            end = start + (event.end - event.start)  # type: ignore[operator]
        except (ValueError, OverflowError):
            return None
        if rule.until is not None and _after(start, rule.until):
            return None
        return Exclusion(
            f"{PREFIX}{self.calendar} {_day(start)} ({event.text})",
            _ms(start, self.zone),
            _ms(end, self.zone),
        )


def _after(start: date | datetime, until: date | datetime) -> bool:
    if isinstance(start, datetime) and isinstance(until, datetime):
        return start > until
    first = start.date() if isinstance(start, datetime) else start
    last = until.date() if isinstance(until, datetime) else until
    return first > last


def _day(value: date | datetime) -> str:
    return value.isoformat() if not isinstance(value, datetime) else value.isoformat(" ")


def _ms(value: date | datetime, zone: ZoneInfo) -> int:
    wall = value if isinstance(value, datetime) else datetime(value.year, value.month, value.day)
    aware = wall.replace(tzinfo=zone)
    return round((aware - datetime(1970, 1, 1, tzinfo=ZoneInfo("UTC"))) / timedelta(milliseconds=1))
