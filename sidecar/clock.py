"""Time, injected: wall clock for slots, monotonic clock for waiting.

Tests (and `ANARCHON_CLOCK_OFFSET`, a diagnostics hook) shift one instance's
wall clock to prove that skewed instances still compete for the same slots.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class Clock:
    """Wall time in seconds since the epoch, shifted by `offset` seconds."""

    offset: float = 0.0

    def wall(self) -> float:
        return time.time() + self.offset

    def wall_ms(self) -> int:
        return int(self.wall() * 1000)

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()


def rfc3339(epoch_seconds: float) -> str:
    """UTC RFC 3339 with milliseconds, e.g. ``2026-12-02T15:04:05.123Z``."""
    dt = datetime.fromtimestamp(epoch_seconds, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def parse_rfc3339(text: str) -> float:
    """Epoch seconds of an RFC 3339 string (``Z`` or an offset)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
