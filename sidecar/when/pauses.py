"""Pure: what the state bucket's pause and skip values say, at a given time.

``paused.<job>`` may carry ``until`` (RFC 3339): the pause ends by itself
then, on every sidecar, with no CLI running (``pause_active``).
``skip.<job>`` holds the explicit slot ids ``skip`` chose (``{"slots": [...],
"by", "at", "reason"}``), so every replica skips exactly the same ones
(``skip_slots``). The records of skipped slots are written by
sidecar/run/skips.py.
"""

from __future__ import annotations

from typing import Any

from sidecar.core.clock import parse_rfc3339

SKIP = "skip"
PAUSED = "paused"
# ``skip --count`` at most this many slots at once.
MAX_SKIP = 1000


def until_ms(value: dict[str, Any]) -> int | None:
    """A pause's end (epoch ms), None when it has none (or it does not parse)."""
    until = value.get("until")
    if not isinstance(until, str):
        return None
    try:
        return round(parse_rfc3339(until) * 1000)
    except ValueError:
        return None


def pause_active(value: dict[str, Any] | None, now_ms: int) -> bool:
    """Whether a ``paused.<job>`` value pauses the job at ``now_ms``."""
    if value is None:
        return False
    end = until_ms(value)
    return end is None or now_ms < end


def skip_slots(value: dict[str, Any] | None) -> frozenset[int]:
    """The slot ids a ``skip.<job>`` value names (anything else is ignored)."""
    slots = (value or {}).get("slots")
    if not isinstance(slots, list):
        return frozenset()
    return frozenset(s for s in slots if isinstance(s, int) and not isinstance(s, bool))


def pending(value: dict[str, Any] | None, now_ms: int) -> int:
    """How many of the skipped slots are still ahead."""
    return sum(1 for s in skip_slots(value) if s > now_ms)


def new_skip_value(
    old: dict[str, Any] | None, runs: list[int], by: str, at: str, reason: str
) -> dict[str, Any]:
    """``skip.<job>`` after adding `runs` (the next slots that run) to what is pending."""
    slots = sorted(skip_slots(old) | set(runs))
    return {"slots": slots, "by": by, "at": at, "reason": reason}
