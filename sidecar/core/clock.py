"""Time, injected: wall clock for slots, a suspend-aware clock for deadlines.

Tests (and `ANARCHON_CLOCK_OFFSET`, a diagnostics hook) shift one instance's
wall clock to prove that skewed instances still compete for the same slots.

Deadlines that guard the duplicate window (a claim's retries, the last
instant a request may go out) are on CLOCK_BOOTTIME where there is one
(Linux): a monotonic clock that also counts the time the machine was
suspended (live migration, a laptop lid). CLOCK_MONOTONIC stops then, and a
claim retried after the resume would still think it is inside its window,
minutes after the stream forgot the slot's msg id: a slot run twice.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import date as date_type

from sidecar.core.bounds import MAX_TIME_S

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)
# Seconds of simulated suspend (failpoint ``suspend``): added to both clocks
# that count suspended time, never to time.monotonic. Always 0 in production.
_suspended = 0.0


def simulate_suspend(seconds: float) -> None:
    """Jump as a machine suspended for `seconds` does: wall and boot time ahead."""
    global _suspended
    _suspended += seconds


def _since_boot() -> float:
    """Seconds on a clock that never goes back and counts suspended time."""
    if _BOOTTIME is None:  # not Linux: the best there is
        return time.monotonic() + _suspended
    return time.clock_gettime(_BOOTTIME) + _suspended


@dataclass(frozen=True)
class Clock:
    """Wall time in seconds since the epoch, shifted by `offset` seconds."""

    offset: float = 0.0

    def wall(self) -> float:
        return time.time() + self.offset + _suspended

    def wall_ms(self) -> int:
        return int(self.wall() * 1000)

    @staticmethod
    def monotonic() -> float:
        """For deadlines: never goes back, and counts time spent suspended."""
        return _since_boot()


# Epoch seconds of 10000-01-01T00:00:00Z: from there on datetime refuses the year.
_YEAR_10000 = 253_402_300_800
_EPOCH_ORDINAL = date_type(1970, 1, 1).toordinal()
# The last minute formatted: (minutes since the epoch, "YYYY-MM-DDTHH:MM:").
_last_minute: tuple[int, str] = (-1, "")


def rfc3339(epoch_seconds: float) -> str:
    """UTC RFC 3339 with milliseconds, e.g. ``2026-12-02T15:04:05.123Z``.

    Equal to ``datetime.fromtimestamp(epoch_seconds, UTC)`` formatted with
    ``%Y-%m-%dT%H:%M:%S.`` and the truncated milliseconds (microseconds rounded
    half to even first, as datetime does), but plain arithmetic with the
    minute's text cached: it runs twice on every claim's path, where datetime
    and strftime took a tenth of the claim's publish round trip.
    """
    global _last_minute
    if not 0 <= epoch_seconds < _YEAR_10000:
        return _rfc3339_datetime(epoch_seconds)
    frac, whole = math.modf(epoch_seconds)
    micros = round(frac * 1e6)
    seconds = int(whole)
    if micros >= 1_000_000:
        micros -= 1_000_000
        seconds += 1
    minute, second = divmod(seconds, 60)
    cached, prefix = _last_minute
    if minute != cached:
        day, rest = divmod(minute, 1440)
        hour, mins = divmod(rest, 60)
        date = date_type.fromordinal(_EPOCH_ORDINAL + day).isoformat()
        prefix = f"{date}T{hour:02d}:{mins:02d}:"
        _last_minute = (minute, prefix)
    return f"{prefix}{second:02d}.{micros // 1000:03d}Z"


def _rfc3339_datetime(epoch_seconds: float) -> str:
    dt = datetime.fromtimestamp(epoch_seconds, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def parse_rfc3339(text: str) -> float:
    """Epoch seconds of an RFC 3339 string (``Z`` or an offset)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_SECOND = timedelta(seconds=1)
# What a person is told the sidecar can name: the epoch to the end of year 9999.
INSTANT_RANGE = "1970-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z"


# A year of five digits or more (10000-01-01T00:00:00Z), past datetime's range.
_LONG_YEAR = re.compile(r"[0-9]{5,}-")


def epoch_of(value: datetime) -> float:
    """Epoch seconds of an aware datetime, any datetime can hold: no conversion to
    UTC (``astimezone``), which overflows at both ends of the range
    (``9999-12-31T23:59:59-14:00`` is in year 10000 in UTC)."""
    return (value - _EPOCH_UTC) / _ONE_SECOND


def in_range(epoch_seconds: float) -> bool:
    """Whether `epoch_seconds` is an instant the sidecar can name (INSTANT_RANGE)."""
    return 0.0 <= epoch_seconds <= MAX_TIME_S


def parse_instant(text: str) -> float:
    """Epoch seconds of an RFC 3339 time a person gave (an option, a form field).

    ValueError, saying why, when it is not one, has no offset, or is outside
    INSTANT_RANGE: every string is either an instant or a usage error, never
    an OverflowError.
    """
    text = text.strip()
    if _LONG_YEAR.match(text):  # fromisoformat cannot read it: say why, not "not a time"
        raise ValueError(f"{text!r} is out of range: the sidecar names {INSTANT_RANGE}")
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an RFC 3339 time (2026-12-24T08:00:00Z)") from None
    if value.tzinfo is None:
        raise ValueError(f"{text!r} has no offset: add Z or +01:00")
    at = epoch_of(value)
    if not in_range(at):
        raise ValueError(f"{text!r} is out of range: the sidecar names {INSTANT_RANGE}")
    return at
