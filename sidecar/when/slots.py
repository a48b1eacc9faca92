"""Pure calendar of a job: several cron expressions, a stable spread, exclusions.

A job's ``schedule`` is one cron expression or a list of them (each a
:class:`~sidecar.when.schedule.Schedule` in the job's timezone). Its slots are:

1. the union of every expression's slots, an instant two expressions share
   being one slot (one claim id);
2. each moved later by the job's *spread offset*: a whole number of seconds in
   ``[0, spread)`` computed from the job name alone (``spread_offset_ms``),
   the same on every replica, restart and version;
3. of those, the ones inside an *exclusion* (a date, the whole day in the
   job's timezone, or an ISO 8601 interval ``start/end``, end excluded) are
   not run: the fleet records them ``skipped`` (reason ``excluded``);
4. none before ``start_at`` (those slots do not exist: nothing walks them), and
   none after ``end_at`` (``outside``: never claimed; ``runs`` and ``between``
   stop there). Both bound the moved slots, both ends included.

``next_slot`` walks every slot, excluded ones included (the job loop records
those), ``next_run`` only the ones that run. Nothing here does I/O or reads the
current time: the answers depend on the expressions, the timezone, the job
name, the spread and the exclusions only.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from sidecar.core.errors import ScheduleError
from sidecar.when.schedule import Interval, Schedule, parse_schedule, unportable

# Exclusions: a date, or an ISO 8601 interval start/end or start/duration.
# ASCII digits only (re.ASCII): \d and int() also take other scripts' digits.
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
_DURATION = re.compile(
    r"P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?", re.ASCII
)
# previous_slot looks back at most this far (a Feb 29 schedule needs 8 years).
_LOOK_BACK_MS = 9 * 366 * 86_400_000
# min_interval_ms of a union compares at most this many slots of the union.
_UNION_SAMPLE = 2000
_REFERENCE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, as in schedule.py
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


def spread_offset_ms(job: str, spread_s: float) -> int:
    """The job's spread offset: whole seconds in [0, spread), from the name alone.

    The first 8 bytes of SHA-256("anarchon-spread:" + name), big-endian, modulo
    the spread's whole seconds. A contract: any instance, in any language, must
    compute the same offset, or the job's slot ids would differ between them.
    """
    seconds = int(spread_s)
    if seconds <= 0:
        return 0
    digest = hashlib.sha256(f"anarchon-spread:{job}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") % seconds) * 1000


@dataclass(frozen=True, slots=True)
class Exclusion:
    """Slots in [start_ms, end_ms) do not run. ``text`` is as configured."""

    text: str
    start_ms: int
    end_ms: int

    def covers(self, slot_ms: int) -> bool:
        return self.start_ms <= slot_ms < self.end_ms


def parse_exclusion(text: str, tz: ZoneInfo) -> Exclusion:
    """``2026-12-24`` (that whole day in `tz`) or ``<start>/<end>`` (ISO 8601).

    A start or end without an offset is a wall time in `tz`; the end may also be
    a duration (``2026-12-24T18:00/PT12H``). Raises ValueError saying what is wrong.
    """
    text = text.strip()
    if _DATE.fullmatch(text):
        day = _date(text)
        start = datetime(day.year, day.month, day.day, tzinfo=tz)
        if day < date.max:
            end_ms = _ms((start.replace(tzinfo=None) + timedelta(days=1)).replace(tzinfo=tz))
        else:  # no day after 9999-12-31 for datetime: the end of its last millisecond
            end_ms = _ms(start.replace(hour=23, minute=59, second=59, microsecond=999_000)) + 1
        return Exclusion(text, _ms(start), end_ms)
    if text.count("/") != 1:
        raise ValueError(
            f"{text!r} is neither a date (2026-12-24) nor an ISO 8601 interval "
            "(2026-12-31T22:00:00+01:00/2027-01-01T06:00:00+01:00)"
        )
    first, second = text.split("/")
    start = _instant(first, tz)
    if second.startswith("P"):
        end_ms = _ms(start) + _duration_ms(second)
    else:
        end_ms = _ms(_instant(second, tz))
    if end_ms <= _ms(start):
        raise ValueError(f"{text!r}: the interval ends before it starts")
    return Exclusion(text, _ms(start), end_ms)


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a date: {exc}") from None


def _instant(text: str, tz: ZoneInfo) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 date and time") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=tz)


def _duration_ms(text: str) -> int:
    match = _DURATION.fullmatch(text)
    if match is None or text in ("P", "PT"):
        raise ValueError(f"{text!r} is not an ISO 8601 duration such as PT6H or P1DT2H")
    d, h, m, s = (int(match.group(k) or 0) for k in "dhms")
    return (((d * 24 + h) * 60 + m) * 60 + s) * 1000


def _ms(aware: datetime) -> int:
    # By subtraction: astimezone(UTC) overflows at both ends (0001-01-01 in +14:00).
    return round((aware - _EPOCH_UTC) / _ONE_MS)


class SharedExclusions(Protocol):
    """A shared calendar resolved in the job's zone (sidecar/when/shared.py)."""

    @property
    def name(self) -> str: ...

    @property
    def digest(self) -> str: ...

    def excluded(self, slot_ms: int) -> Exclusion | None: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Calendar:
    """The slots of one job. Build it with ``parse_calendar``."""

    schedules: tuple[Schedule | Interval, ...]
    tz: ZoneInfo
    spread: float = 0.0  # seconds
    offset_ms: int = 0  # this job's spread offset
    exclusions: tuple[Exclusion, ...] = field(default=())
    start_ms: int | None = None  # ``start_at``: no slot before it
    end_ms: int | None = None  # ``end_at``: no slot after it is claimed
    # ``exclude: [calendar:NAME]``: the shared calendars, in the order written.
    shared: tuple[SharedExclusions, ...] = field(default=())
    # ``identity`` once made: a calendar is shared by the jobs of equal schedules
    # (issue 49), and each job's hash and take-up read it.
    _identity: str = field(default="", init=False, repr=False, compare=False)
    # ``previous_slot``'s last answer, (slot, previous): the jobs of one schedule
    # share this calendar, and a burst of their first runs asks it for the same
    # slot (issue 49: 0.2 ms each, once per job before).
    _previous: tuple[int, int | None] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def exprs(self) -> tuple[str, ...]:
        return tuple(s.expr for s in self.schedules)

    @property
    def expr(self) -> str:
        """Every expression, ``" | "`` between them (one expression: itself)."""
        return " | ".join(self.exprs)

    @property
    def identity(self) -> str:
        """What decides the slots, as text: the expressions, then spread and
        exclusions only when set (a plain job reads as its expression alone)."""
        if self._identity:
            return self._identity
        text = self.expr
        if self.spread:
            text += f" spread={self.spread!r}"
        if self.exclusions:
            text += " exclude=" + ",".join(e.text for e in self.exclusions)
        if self.start_ms is not None:
            text += f" start_at={self.start_ms}"
        if self.end_ms is not None:
            text += f" end_at={self.end_ms}"
        if self.shared:
            # By content: a calendar that differs between replicas makes the job's
            # hash differ, shown as a config mismatch (docs/SCHEDULES.md).
            text += " calendars=" + ",".join(f"{s.name}:{s.digest}" for s in self.shared)
        object.__setattr__(self, "_identity", text)
        return text

    def outside(self, slot_ms: int) -> str | None:
        """Why ``slot_ms`` is not claimed by start_at/end_at (None: it is inside)."""
        if self.start_ms is not None and slot_ms < self.start_ms:
            return f"before start_at {utc_text(self.start_ms)}"
        if self.end_ms is not None and slot_ms > self.end_ms:
            return f"after end_at {utc_text(self.end_ms)}"
        return None

    def ended(self, now_ms: int) -> bool:
        """Whether no slot after ``now_ms`` is inside end_at: the job has no more runs."""
        return self.end_ms is not None and self.next_slot(now_ms) > self.end_ms

    def unportable(self) -> list[str]:
        """What a scheduler of the reference backend sharing the stream cannot run."""
        found = [what for expr in self.exprs for what in unportable(expr)]
        if self.offset_ms:
            found.append("spread (its slot ids are the moved instants)")
        return list(dict.fromkeys(found))

    # ------------------------------------------------------------------ slots

    def next_slot(self, after_ms: int) -> int:
        """The smallest slot (moved, excluded ones included) strictly after ``after_ms``."""
        # The first of _iter's merge, from each schedule's own (often known) answer.
        base = self._base(after_ms)
        return min(s.next_slot(base) for s in self.schedules) + self.offset_ms

    def slots(self, after_ms: int, count: int) -> list[int]:
        return list(itertools.islice(self._iter(after_ms), count))

    def excluded(self, slot_ms: int) -> Exclusion | None:
        """The exclusion that keeps ``slot_ms`` from running, if any."""
        for exclusion in self.exclusions:
            if exclusion.covers(slot_ms):
                return exclusion
        for calendar in self.shared:
            if (found := calendar.excluded(slot_ms)) is not None:
                return found
        return None

    def next_run(self, after_ms: int) -> int | None:
        """The smallest slot after ``after_ms`` that runs (None: none before end_at)."""
        return next(self._running(after_ms), None)

    def runs(self, after_ms: int, count: int) -> list[int]:
        """The next ``count`` slots that run (exclusions, start_at and end_at applied)."""
        return list(itertools.islice(self._running(after_ms), count))

    def _running(self, after_ms: int) -> Iterator[int]:
        for s in self._iter(after_ms):
            if self.end_ms is not None and s > self.end_ms:
                return
            if self.excluded(s) is None:
                yield s

    def previous_slot(self, slot_ms: int) -> int | None:
        """The schedule's slot just before ``slot_ms`` (excluded ones count), or None."""
        last = self._previous
        if last is not None and last[0] == slot_ms:
            return last[1]
        found = self._slot_before(slot_ms)
        object.__setattr__(self, "_previous", (slot_ms, found))
        return found

    def _slot_before(self, slot_ms: int) -> int | None:
        # Any start is right (the window doubles). Twice the gap to the next slot
        # finds a regular schedule's in one step; the shortest interval would walk
        # a year of slots per expression (7 s at the start of 1,000 jobs).
        window = 2 * self.interval_floor_ms()
        with contextlib.suppress(ScheduleError):
            window = max(window, 2 * (next(self._iter(slot_ms)) - slot_ms))
        while window <= _LOOK_BACK_MS:
            found = None
            for s in self._iter(slot_ms - window - 1):
                if s >= slot_ms:
                    break
                found = s
            if found is not None:
                return found
            window *= 2
        return None

    def between(self, from_ms: int, to_ms: int, limit: int) -> list[int]:
        """The slots that run in [from_ms, to_ms], at most ``limit + 1`` of them."""
        out: list[int] = []
        for s in self._running(from_ms - 1):
            if s > to_ms or len(out) > limit:
                break
            out.append(s)
        return out

    def min_interval_ms(self) -> int:
        """The shortest gap between two slots (spread moves them all alike)."""
        own = min(s.min_interval_ms() for s in self.schedules)
        if len(self.schedules) == 1:
            return own
        # Two expressions can fire close together: compare the union's slots too,
        # from where every interval with ``from`` has begun.
        begin = max(
            [_REFERENCE_MS]
            + [s.anchor_ms for s in self.schedules if isinstance(s, Interval) and s.first]
        )
        sample = list(itertools.islice(self._iter(begin - 1), _UNION_SAMPLE))
        return min([own, *(b - a for a, b in itertools.pairwise(sample))])

    def interval_floor_ms(self) -> int:
        """A lower bound of ``min_interval_ms()``, without computing it."""
        if len(self.schedules) > 1 and any(isinstance(s, Interval) for s in self.schedules):
            # An interval's grid need not fall on a cron's whole minutes: only whole
            # seconds are certain between the slots of a union.
            return 1000
        return min(s.interval_floor_ms() for s in self.schedules)

    def _base(self, after_ms: int) -> int:
        """``after_ms`` in the schedules' own time (before spread), start_at applied."""
        if self.start_ms is not None:
            after_ms = max(after_ms, self.start_ms - 1)
        return after_ms - self.offset_ms

    def _iter(self, after_ms: int) -> Iterator[int]:
        base = self._base(after_ms)
        if len(self.schedules) == 1:
            for s in self.schedules[0]._iter_slots(base):
                yield s + self.offset_ms
            return
        last = None
        for s in heapq.merge(*(sched._iter_slots(base) for sched in self.schedules)):
            if s != last:  # an instant two expressions share is one slot
                last = s
                yield s + self.offset_ms


def parse_calendar(
    exprs: str | list[str] | tuple[str, ...],
    tz: ZoneInfo,
    job: str = "",
    spread: float = 0.0,
    exclude: tuple[str, ...] | list[str] = (),
    start_ms: int | None = None,
    end_ms: int | None = None,
    shared: tuple[SharedExclusions, ...] = (),
) -> Calendar:
    """Validate the expressions and exclusions; ScheduleError/ValueError name the bad one."""
    texts = [exprs] if isinstance(exprs, str) else list(exprs)
    if not texts:
        raise ScheduleError("expected at least one cron expression")
    schedules: list[Schedule | Interval] = []
    for text in texts:
        sched = parse_schedule(text, tz)
        if sched not in schedules:
            schedules.append(sched)
    exclusions = tuple(parse_exclusion(text, tz) for text in exclude)
    offset = spread_offset_ms(job, spread)
    return Calendar(tuple(schedules), tz, spread, offset, exclusions, start_ms, end_ms, shared)


def utc_text(epoch_ms: int) -> str:
    """``2026-01-01T09:00:00Z``: a bound as people read it (whole seconds)."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
