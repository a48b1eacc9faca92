"""Pure schedule maths: cron expression + IANA timezone -> slots (epoch ms, UTC).

An expression has 5 fields (minute hour day-of-month month day-of-week) or 6
with seconds first: numbers, month and day names, ``*``, ``,``, ``-`` and ``/``
and the Quartz extensions ``L`` (last), ``W`` (nearest weekday) and ``#``
(nth weekday), which other cron implementations sharing the stream may lack
(``unportable`` names them, for ``check``).
Day-of-month and day-of-week combine as in Debian cron: AND when either field
starts with ``*``, else OR. ``cronsim`` walks the naive local wall clock only; this
module maps every naive local candidate to a UTC instant by the product's DST
contract, which every instance (in any language) must apply identically:

* A local time that does not exist (spring-forward gap) runs once, at the
  transition instant (the first instant after the gap). All candidates inside
  one gap, and one exactly at its end, collapse into that single slot.
* A local time that occurs twice (fall-back overlap) runs once, at its first
  occurrence (``fold=0``). The second pass through the overlap has no slots.

The map naive -> UTC is therefore monotonic non-decreasing, and the slots are
its distinct values. They depend only on (expression, timezone, ``after_ms``):
never on the process ``TZ`` or the current time, and always whole seconds.

An interval, ``@every <duration>`` (``90m``, ``1h30m``, ``1d``; whole seconds,
1s to 365d), is absolute time (no DST rule applies): its slots are the instants
``anchor + n * every``, the anchor being the Unix epoch plus ``offset <duration>``
(Temporal's interval with offset; ``@every 1h offset 15m`` runs at :15 each
hour), or ``from <instant>`` (ISO 8601; without an offset a wall time in the
job's timezone), the first slot then being the instant itself. Every replica
computes the same slots whenever it started (never counted from process start).
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from sidecar.core.bounds import MAX_SLOT_MS
from sidecar.core.clock import INSTANT_RANGE, epoch_of, in_range
from sidecar.core.errors import ScheduleError

_FIELDS_5 = ("minute", "hour", "day-of-month", "month", "day-of-week")
_FIELDS_6 = ("second", *_FIELDS_5)
# Quartz extensions cronsim accepts but other cron implementations (the
# JavaScript scheduler of the reference backend) may not: allowed, and named by
# ``unportable`` so that ``check`` can say so.
_UNPORTABLE = {"L": "'L' (last)", "W": "'W' (weekday)", "#": "'#' (nth weekday)"}
_EPOCH = datetime(1970, 1, 1)  # naive UTC
_EPOCH_UTC = _EPOCH.replace(tzinfo=UTC)
_DAY_S = 86_400
_SECOND = timedelta(seconds=1)
# min_interval_ms() samples from here, so its answer never depends on "now".
_REFERENCE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
_YEAR_MS = 366 * 86_400_000
_MAX_SAMPLES = 1000
# The macros of Vixie cron, refused with the expression to write instead
# (docs/CONFIG.md: "Macros like `@daily` are refused").
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# ``@every <duration> [offset <duration> | from <instant>]``
# ASCII only (re.ASCII): \d and int() also take other scripts' digits (U+0663 U+0660 for 30m).
_EVERY = re.compile(
    r"@every\s+(?P<every>\S+)(?:\s+(?P<how>offset|from)\s+(?P<anchor>\S+))?", re.ASCII
)
_EVERY_DURATION = re.compile(
    r"(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?", re.ASCII
)
_EVERY_UNITS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000}
# An interval's longest period: a year (the previous slot, X-Anarchon-Previous-
# Scheduled-At, is looked for at most 9 years back, from twice the period).
_EVERY_MAX_MS = 365 * 86_400_000


@dataclass(frozen=True)
class Schedule:
    """A validated cron expression in a timezone. Build it with ``parse_schedule``.

    It is checked by finding its next slot from now, the work its job's loop
    does first anyway: the answer is kept (``next_slot``), so the loop finds it
    known (with 1,000 jobs the two computations took a tenth of the time to
    ready). Only the speed depends on "now", never a slot.
    """

    expr: str
    tz: ZoneInfo
    # (after_ms, slot): `slot` is the first slot after `after_ms`, hence also
    # the first after any instant in [after_ms, slot).
    _known: tuple[int, int] = field(default=(0, 0), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = self.expr.split()
        if len(parts) not in (5, 6):
            raise ScheduleError(
                f"expected 5 fields (minute first) or 6 (seconds first), got {len(parts)}: "
                f"'{self.expr}'"
            )
        try:
            self.next_slot(time.time_ns() // 1_000_000)
        except CronSimError as exc:
            # cronsim says e.g. "Bad minute"; name the field and quote its text.
            names = _FIELDS_5 if len(parts) == 5 else _FIELDS_6
            bad = str(exc).removeprefix("Bad ")
            part = parts[names.index(bad)] if bad in names else self.expr
            raise ScheduleError(f"bad {bad} field '{part}'") from exc
        except ScheduleError:
            raise ScheduleError(f"schedule '{self.expr}' never fires") from None

    def next_slot(self, after_ms: int) -> int:
        """Return the smallest slot (epoch ms, UTC) strictly greater than ``after_ms``."""
        start, slot = self._known
        if start <= after_ms < slot:
            return slot
        slot = next(self._iter_slots(after_ms))
        object.__setattr__(self, "_known", (after_ms, slot))
        return slot

    def slots(self, after_ms: int, count: int) -> list[int]:
        """Return the next ``count`` slots strictly after ``after_ms``, ascending."""
        it = self._iter_slots(after_ms)
        return [next(it) for _ in range(count)]

    def min_interval_ms(self) -> int:
        """Return the shortest gap between consecutive slots, in ms.

        Deterministic: it samples slots from 2026-01-01T00:00Z for a year (at most
        1000 of them) plus the slots around each UTC-offset change of that year,
        so shorter days are seen even for frequent schedules.
        """
        return _min_interval_ms(self.expr, self.tz)

    def interval_floor_ms(self) -> int:
        """A lower bound of ``min_interval_ms()``, without computing it.

        Slots are whole local seconds (6 fields) or minutes (5), and every UTC
        offset and offset change is a whole minute, so two distinct slots are
        at least that far apart.
        """
        return _interval_floor_ms(self.expr)

    def _iter_slots(self, after_ms: int) -> Iterator[int]:
        """Yield the distinct slots after ``after_ms`` in order (endless).

        ScheduleError when the walk leaves the range of datetime (years 1 to
        9999): ``skip --count`` near the end, or an instant out of range, is
        then a usage error, not an OverflowError.
        """
        try:
            yield from self._walk(after_ms)
        except OverflowError:
            raise ScheduleError(
                f"schedule '{self.expr}' has no more slots before 10000-01-01"
            ) from None

    def _walk(self, after_ms: int) -> Iterator[int]:
        local = (_EPOCH_UTC + timedelta(milliseconds=after_ms)).astimezone(self.tz)
        start = local.replace(tzinfo=None, fold=0)
        if local.fold:
            # Second pass of an overlap: every naive candidate until the overlap
            # ends maps to its first pass (<= after_ms), so start from its end.
            first = _offset(local.replace(fold=0))
            after_s = after_ms // 1000
            trans = self._transition(after_s - (first - _offset(local)) // _SECOND, after_s)
            start = _naive(trans) + first - _SECOND
        last = after_ms
        cron = CronSim(self.expr, start)
        while (naive := next(cron, None)) is not None:
            slot_s, gap_end = self._to_utc_s(naive)
            if gap_end is not None:  # the rest of the gap maps to the same slot
                cron = CronSim(self.expr, gap_end)
            if slot_s * 1000 > last:
                last = slot_s * 1000
                yield last
        raise ScheduleError(f"schedule '{self.expr}' has no slot within 50 years")

    def _to_utc_s(self, naive: datetime) -> tuple[int, datetime | None]:
        """Map a naive local time to epoch seconds by the DST rules above.

        The second item is the gap's end (naive local) when ``naive`` is in a gap.
        """
        off0 = _offset(naive.replace(tzinfo=self.tz))
        off1 = _offset(naive.replace(tzinfo=self.tz, fold=1))
        if off1 > off0:  # gap: the transition lies in (naive - off1, naive - off0]
            trans = self._transition(_seconds(naive - off1), _seconds(naive - off0))
            return trans, _naive(trans) + off1
        return _seconds(naive - off0), None  # normal time, or first pass of an overlap

    def _transition(self, lo: int, hi: int) -> int:
        """Return the first second in (lo, hi] whose UTC offset is the one at ``hi``."""
        target = self._offset_at(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._offset_at(mid) == target:
                hi = mid
            else:
                lo = mid
        return hi

    def _offset_at(self, epoch_s: int) -> timedelta:
        return _offset((_EPOCH_UTC + epoch_s * _SECOND).astimezone(self.tz))


@dataclass(frozen=True)
class Interval:
    """``@every <duration>``: the slots ``anchor_ms + n * every_ms``. Build it with
    ``parse_schedule``. With ``from`` (``first``) there is no slot before the anchor."""

    expr: str
    tz: ZoneInfo
    every_ms: int
    anchor_ms: int = 0
    first: bool = False  # ``from <instant>``: the anchor is the first slot

    def next_slot(self, after_ms: int) -> int:
        """The smallest slot (epoch ms, UTC) strictly greater than ``after_ms``."""
        if self.first and after_ms < self.anchor_ms:
            return self.anchor_ms
        n = (after_ms - self.anchor_ms) // self.every_ms + 1
        return self._named(self.anchor_ms + n * self.every_ms)

    def _named(self, slot: int) -> int:
        """`slot`, or ScheduleError past the last instant the sidecar names, as a cron
        schedule's walk says it (no slot of year 10000 reaches a datetime)."""
        if slot > MAX_SLOT_MS:
            raise ScheduleError(f"schedule '{self.expr}' has no more slots before 10000-01-01")
        return slot

    def slots(self, after_ms: int, count: int) -> list[int]:
        first = self.next_slot(after_ms)
        return [first + i * self.every_ms for i in range(count)]

    def min_interval_ms(self) -> int:
        return self.every_ms

    def interval_floor_ms(self) -> int:
        return self.every_ms

    def _iter_slots(self, after_ms: int) -> Iterator[int]:
        slot = self.next_slot(after_ms)
        while True:
            yield slot
            slot = self._named(slot + self.every_ms)


def every_duration_ms(text: str) -> int:
    """``90m``, ``1h30m``, ``1d``, ``45s`` as whole milliseconds; ScheduleError otherwise."""
    match = _EVERY_DURATION.fullmatch(text)
    if not text or match is None:
        raise ScheduleError(
            f"'{text}' is not an interval: whole days, hours, minutes and seconds "
            "such as 90m, 1h30m, 1d or 45s"
        )
    return sum(int(n) * _EVERY_UNITS[u] for u, n in match.groupdict().items() if n)


def _parse_interval(expr: str, tz: ZoneInfo) -> Interval:
    match = _EVERY.fullmatch(expr)
    if match is None:
        raise ScheduleError(
            f"expected '@every <interval>', optionally followed by 'offset <interval>' or "
            f"'from <ISO 8601 instant>', got '{expr}'"
        )
    every = every_duration_ms(match["every"])
    if every < 1000:
        raise ScheduleError(f"@every {match['every']}: the interval must be at least 1s")
    if every > _EVERY_MAX_MS:
        raise ScheduleError(f"@every {match['every']}: the interval must be at most 365d")
    if match["how"] == "offset":
        offset = every_duration_ms(match["anchor"])
        if offset >= every:
            raise ScheduleError(
                f"offset {match['anchor']} must be shorter than the interval {match['every']}"
            )
        return Interval(expr, tz, every, offset)
    if match["how"] == "from":
        text = match["anchor"]
        try:
            value = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ScheduleError(f"from '{text}' is not an ISO 8601 date and time") from None
        if value.tzinfo is None:
            value = value.replace(tzinfo=tz)  # a wall time in the job's timezone
        # By subtraction: astimezone(UTC) overflows at both ends of the range.
        at = epoch_of(value)
        if not in_range(at):
            raise ScheduleError(f"from '{text}' is out of range: the sidecar names {INSTANT_RANGE}")
        anchor = round(at * 1000)
        if anchor % 1000:
            raise ScheduleError(f"from '{text}': slots are whole seconds")
        return Interval(expr, tz, every, anchor, first=True)
    return Interval(expr, tz, every)


def is_interval(expr: str) -> bool:
    return expr.split()[:1] == ["@every"]


@lru_cache(maxsize=4096)
def parse_schedule(expr: str, tz: ZoneInfo) -> Schedule | Interval:
    """Validate ``expr`` (5 fields, or 6 with seconds first, or ``@every ...``) and
    return its Schedule (or Interval).

    Raises ScheduleError with a message naming the bad field. A config parses
    each job's expressions more than once, and jobs share them: the same
    Schedule comes back, checked once (an error is never remembered).
    """
    text = " ".join(expr.split())
    if is_interval(text):
        return _parse_interval(text, tz)
    if text in _MACROS:
        raise ScheduleError(
            f"'{text}': cron macros are not supported; write '{_MACROS[text]}' "
            "(in the job's timezone) or an interval such as '@every 1d' (counted from the "
            "Unix epoch, in UTC)"
        )
    return Schedule(text, tz)


def unportable(expr: str) -> list[str]:
    """The Quartz extensions ``expr`` uses (``'L' (last)`` ...), in field order, once each."""
    if is_interval(expr):
        return ["'@every' (an interval)"]
    found: list[str] = []
    for part in expr.split():
        letters = re.sub("[A-Z]{3}", "", part.upper())  # month and day names may hold L, W
        found += [what for char, what in _UNPORTABLE.items() if char in letters]
    return list(dict.fromkeys(found))


@lru_cache(maxsize=4096)
def _min_interval_ms(expr: str, tz: ZoneInfo) -> int:
    sched = parse_schedule(expr, tz)  # checked already: no second walk from now
    if isinstance(sched, Interval):
        return sched.every_ms
    floor = _interval_floor_ms(expr)  # no gap can be shorter
    sample: list[int] = []
    for slot in sched._iter_slots(_REFERENCE_MS - 1):
        sample.append(slot)
        if len(sample) > 1 and (
            len(sample) >= _MAX_SAMPLES
            or slot > _REFERENCE_MS + _YEAR_MS
            or slot - sample[-2] <= floor
        ):
            break
    runs = [sample]
    # Around each offset change of that year, three slots from the last naive
    # candidate before T + old offset (the gap's start, or the overlap's end).
    t = _REFERENCE_MS // 1000
    while t < (_REFERENCE_MS + _YEAR_MS) // 1000:
        if sched._offset_at(t) != sched._offset_at(t + _DAY_S):
            trans = sched._transition(t, t + _DAY_S)
            anchor = _naive(trans) + sched._offset_at(trans - 1)
            prev = next(CronSim(expr, anchor, reverse=True), None)
            if prev is not None:
                runs.append(sched.slots(sched._to_utc_s(prev)[0] * 1000 - 1, 3))
        t += _DAY_S
    return min(b - a for run in runs for a, b in itertools.pairwise(run))


def _interval_floor_ms(expr: str) -> int:
    return 1000 if len(expr.split()) == 6 else 60_000


def _offset(aware: datetime) -> timedelta:
    offset = aware.utcoffset()
    assert offset is not None, "tz-aware datetime expected"
    return offset


def _naive(epoch_s: int) -> datetime:
    return _EPOCH + epoch_s * _SECOND


def _seconds(naive_utc: datetime) -> int:
    return (naive_utc - _EPOCH) // _SECOND
