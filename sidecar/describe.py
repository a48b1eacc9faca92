"""Pure: a cron expression in words, for people (``status``, the fleet page).

5 fields (minute first) or 6 (seconds first), as sidecar/schedule.py accepts
them. The words come from cronsim's ``explain()`` (already a run-time
dependency; it knows names, ranges, steps and lists); an expression it cannot
put in words is shown as it is, never an error: describing is for display.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache

from cronsim import CronSim

# Any instant: explain() reads the expression, not the time.
_ANCHOR = datetime(2026, 1, 1)


@lru_cache(maxsize=4096)
def describe(expr: str, timezone: str = "UTC") -> str:
    """``"0 3 * * 1-5"`` -> ``"At 03:00 on Monday through Friday (UTC)"``."""
    text = " ".join(expr.split())
    try:
        words = str(CronSim(text, _ANCHOR).explain())
    except Exception:  # cronsim raises its own errors and, on odd input, others
        return text
    return f"{words} ({timezone})" if timezone else words
