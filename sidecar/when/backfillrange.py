"""The slots of a time range a backfill runs: the job's calendar, at most MAX_SLOTS.

Pure: the ``backfill`` command (sidecar/cli/calendar_commands.py) asks for them, then
sidecar/ops/skipops.py writes them to ``backfill.<job>``; the sidecars refuse
a value holding more (sidecar/run/backfillcheck.py).
"""

from __future__ import annotations

from sidecar.when.slots import Calendar

# The command refuses more; a value holding more was not written by it.
MAX_SLOTS = 1000
# backfill counts the slots of a range up to this many to name the count.
COUNT_LIMIT = 100_000


def backfill_slots(schedule: Calendar, from_ms: int, to_ms: int) -> list[int]:
    """The calendar's slots in [from, to] (exclusions applied); ValueError above MAX_SLOTS."""
    found = schedule.between(from_ms, to_ms, MAX_SLOTS)
    if len(found) > MAX_SLOTS:
        count = len(schedule.between(from_ms, to_ms, COUNT_LIMIT))
        said = f"{count}" if count <= COUNT_LIMIT else f"more than {COUNT_LIMIT}"
        raise ValueError(
            f"{said} slots in that range; a backfill runs at most {MAX_SLOTS}: split it"
        )
    return found
