"""Range checks for numbers read from NATS (state bucket values, keys, messages).

Anything in the stream or the state bucket may have been written by another
client of the account (SECURITY.md), so a number read there is checked before
it is formatted, compared or slept on: a slot of ``1e20`` ms crashed
``rfc3339`` (``OSError``) and with it the task that read it. A value out of
range is hostile input: the caller counts it (``hostile_input_total``) and
skips it.
"""

from __future__ import annotations

from typing import Any

# 9999-12-31T23:59:59.999Z: the last instant ``rfc3339`` and every cron can name.
MAX_SLOT_MS = 253_402_300_799_999
MAX_TIME_S = MAX_SLOT_MS / 1000
# JetStream sequences are unsigned 64-bit; beyond 2^63 nothing real is stored.
MAX_SEQ = 2**63 - 1
# retry.max is at most 10 (docs/CONFIG.md): attempt 11 is the last that can exist.
MAX_ATTEMPT = 11


def is_int(value: Any) -> bool:
    """A JSON integer (``true`` is not one, although Python says it is)."""
    return isinstance(value, int) and not isinstance(value, bool)


def slot_ms(value: Any) -> int | None:
    """`value` as a slot in epoch milliseconds, or None when it cannot be one."""
    return value if is_int(value) and 0 <= value <= MAX_SLOT_MS else None


def attempt_no(value: Any, default: int | None = None) -> int | None:
    """`value` as an attempt number (1 to MAX_ATTEMPT); `default` when absent (None)."""
    if value is None:
        return default
    return value if is_int(value) and 1 <= value <= MAX_ATTEMPT else None


def seq_no(value: Any) -> int | None:
    """`value` as a stream sequence (1 to 2^63-1), or None."""
    return value if is_int(value) and 1 <= value <= MAX_SEQ else None


def epoch_s(value: Any) -> float | None:
    """`value` as a time in epoch seconds (0 to year 9999), or None (NaN included)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    return seconds if 0.0 <= seconds <= MAX_TIME_S else None
