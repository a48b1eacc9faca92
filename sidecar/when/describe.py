"""Pure: a cron expression in words, for people (``check``, ``status``, the fleet page).

5 fields (minute first) or 6 (seconds first), as sidecar/when/schedule.py accepts
them. The words come from cronsim's ``explain()`` (already a run-time
dependency; it knows names, ranges, steps and lists), with one correction:
a step that divides its unit evenly reads as a period ("*/2" seconds:
"Every 2 seconds", not cronsim's "Every second second of every minute").
An expression it cannot put in words is shown as it is, never an error:
describing is for display.
"""

from __future__ import annotations

import re
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING

from cronsim import CronSim

from sidecar.when.slots import utc_text

if TYPE_CHECKING:
    from sidecar.when.slots import Calendar

# Any instant: explain() reads the expression, not the time.
_ANCHOR = datetime(2026, 1, 1)
# "*/N" alone in a field, with every field after it "*", reads as a period
# when N divides the field's range (the count restarts at each unit, so
# "*/7" minutes is not "every 7 minutes": it is left to cronsim's words).
_UNITS = {0: ("second", 60), 1: ("minute", 60), 2: ("hour", 24)}
_STEP = re.compile(r"\*/(\d+)", re.ASCII)


def _period(fields: list[str]) -> str | None:
    offset = 0 if len(fields) == 6 else 1  # 5 fields start at the minute
    for index, field in enumerate(fields):
        unit = _UNITS.get(index + offset)
        if unit is None:
            return None
        found = _STEP.fullmatch(field)
        rest = fields[index + 1 :]
        if found and all(f == "*" for f in rest):
            step = int(found.group(1))
            name, span = unit
            if 1 < step < span and span % step == 0:
                return f"Every {step} {name}s"
            return None
        if field != "0":
            return None
    return None


@lru_cache(maxsize=4096)
def describe(expr: str, timezone: str = "UTC") -> str:
    """``"0 3 * * 1-5"`` -> ``"At 03:00 on Monday through Friday (UTC)"``."""
    fields = expr.split()
    text = " ".join(fields)
    if text.startswith("@every "):
        # Absolute time: the timezone does not move an interval's slots.
        return _interval_words(fields)
    words = _period(fields) if len(fields) in (5, 6) else None
    if words is None:
        try:
            words = str(CronSim(text, _ANCHOR).explain())
        except Exception:  # cronsim raises its own errors and, on odd input, others
            return text
    return f"{words} ({timezone})" if timezone else words


def _interval_words(fields: list[str]) -> str:
    """``@every 90m offset 15m`` -> ``Every 90m, counted from the Unix epoch + 15m``."""
    every = f"Every {fields[1]}" if len(fields) > 1 else " ".join(fields)
    if len(fields) == 4 and fields[2] == "offset":
        return f"{every}, counted from the Unix epoch + {fields[3]}"
    if len(fields) == 4 and fields[2] == "from":
        return f"{every} from {fields[3]}"
    return f"{every}, counted from the Unix epoch"


def schedule_lines(calendar: Calendar) -> list[str]:
    """``check``'s and ``status``'s lines for a job's calendar: each expression in
    words, the spread offset, the exclusions, what the reference backend cannot run."""
    lines = [f"schedule {expr!r}: {describe(expr, '')}" for expr in calendar.exprs]
    if calendar.spread:
        lines.append(
            f"spread {calendar.spread:g}s: every slot {calendar.offset_ms // 1000}s later "
            "(from the job name)"
        )
    lines += [f"excluded: {e.text}" for e in calendar.exclusions]
    lines += [
        f"excluded: calendar:{s.name} ({len(s)} entries, content hash {s.digest})"
        for s in calendar.shared
    ]
    if calendar.start_ms is not None:
        lines.append(f"start_at {utc_text(calendar.start_ms)}: no slot before it")
    if calendar.end_ms is not None:
        lines.append(f"end_at {utc_text(calendar.end_ms)}: no slot after it is claimed")
    if found := calendar.unportable():
        lines.append(
            f"uses {', '.join(found)}: the reference backend (the NatsBackend of anarchon's "
            "JavaScript scheduler) cannot run this job if it shares the stream; sidecars can"
        )
    return lines
