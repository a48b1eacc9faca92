"""One-off runs at a set time (``anarchon-sidecar at``): the key and its checks, pure.

``at JOB TIME`` stores the instant in the state bucket key ``at.<job>``::

    {"runs": [{"slot": <epoch ms>, "by": "...", "queued_at": "<RFC 3339>",
               "reason": "..."}, ...]}

one entry per instant (the same instant twice is one run), at most
``MAX_PENDING`` a job, none more than ``MAX_AHEAD`` ahead. Every sidecar
watches it (sidecar/run/atruns.py) and competes for each entry at its instant
plus a random jitter, like for a slot, with the claim id ``<job>:<ms>:at``
(never a scheduled slot's, a backfill's or a retry's) and trigger ``at``,
within ``max_late`` of the instant, hence inside the duplicate window. An
entry leaves the key when its run was claimed, skipped, missed or cancelled.

Whoever may write the state bucket may write this key: an entry that is not
one the CLI would have written (a slot out of range or too far ahead, a
value that is not an object, a key ``at.<job>.<more>``, an instant of the job's
own schedule, which runs then anyway: a second run of that slot) is hostile input,
counted in ``hostile_input_total{what="at_key"}``, said once, dropped, and
never run. Nothing here does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.core.bounds import slot_ms
from sidecar.core.clock import rfc3339
from sidecar.core.errors import ScheduleError

if TYPE_CHECKING:
    from sidecar.when.slots import Calendar

KIND = "at"
# A one-off further ahead than this is refused (the CLI: exit 2; a key: hostile).
MAX_AHEAD = 366 * 86400.0
# Pending one-offs of one job at most.
MAX_PENDING = 100
# The longest `by` and `reason` kept.
MAX_TEXT = 200


def at_key(job: str) -> str:
    return f"{KIND}.{job}"


def at_msg_id(job: str, slot: int) -> str:
    """The claim id of the one-off run of `job` at `slot`: ``<job>:<ms>:at``."""
    return f"{job}:{slot}:{KIND}"


def job_of_key(key: str) -> str | None:
    """The job of an ``at.*`` key (also of a malformed ``at.<job>.<more>``); None otherwise."""
    kind, _, rest = key.partition(".")
    if kind != KIND or not rest:
        return None
    return rest.split(".", 1)[0] or None


@dataclass(frozen=True)
class AtRun:
    """One pending one-off run."""

    slot: int  # epoch ms
    by: str
    queued_at: str
    reason: str = ""
    # The instance that started claiming it (set by compare-and-set before its
    # claim): from then on a cancel is too late.
    claiming: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "at": rfc3339(self.slot / 1000),
            "by": self.by,
            "queued_at": self.queued_at,
            "reason": self.reason,
            "claiming": self.claiming,
        }

    def entry(self) -> dict[str, Any]:
        """As stored in ``at.<job>``."""
        out: dict[str, Any] = {"slot": self.slot, "by": self.by, "queued_at": self.queued_at}
        if self.reason:
            out["reason"] = self.reason
        if self.claiming:
            out["claiming"] = self.claiming
        return out


@dataclass(frozen=True)
class Parsed:
    """The entries of an ``at.<job>`` value: the good ones (by slot) and why others are not."""

    runs: dict[int, AtRun]
    hostile: list[str]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and len(value) <= MAX_TEXT else None


def parse_entry(item: Any, now: float) -> AtRun | str:
    """One entry as an AtRun, or why it is hostile."""
    if not isinstance(item, dict):
        return "an entry is not an object"
    slot = slot_ms(item.get("slot"))
    if slot is None:
        return f"slot {str(item.get('slot'))[:40]!r} is not an instant in epoch ms"
    if slot / 1000 > now + MAX_AHEAD + 86400:
        return f"slot {slot} is more than {MAX_AHEAD / 86400:.0f} days ahead"
    by, queued = _text(item.get("by")), _text(item.get("queued_at"))
    reason = _text(item.get("reason", ""))
    claiming = _text(item.get("claiming", ""))
    if by is None or queued is None or reason is None or claiming is None:
        return f"slot {slot}: by, queued_at, reason or claiming missing, not text or too long"
    return AtRun(slot, by, queued, reason, claiming)


#: ``scheduled(slot)``: whether `slot` (epoch ms) is an instant of the job's schedule.
Scheduled = Callable[[int], bool]


def instants_of(calendar: Calendar) -> Scheduled:
    """`scheduled` for `calendar`: the CLI's test (``next_slot(slot - 1) == slot``)."""

    def scheduled(slot: int) -> bool:
        try:
            return calendar.next_slot(slot - 1) == slot
        except (ValueError, OverflowError):  # beyond what the calendar reaches: not one
            return False

    return scheduled


def parse_value(value: Any, now: float, scheduled: Scheduled | None = None) -> Parsed:
    """The entries of a decoded ``at.<job>`` value (``{}`` for a key that did not decode).

    With `scheduled`, an entry on an instant of the job's schedule is hostile: the
    CLI refuses it (``instant_problem``), and run it would be the slot run twice
    (``scheduled`` and ``at``, one ``X-Anarchon-Slot``)."""
    if not isinstance(value, dict) or not isinstance(value.get("runs"), list):
        return Parsed({}, ['the value is not {"runs": [...]}'])
    items = value["runs"]
    runs: dict[int, AtRun] = {}
    hostile: list[str] = []
    if len(items) > MAX_PENDING:
        hostile.append(f"{len(items)} entries, more than {MAX_PENDING}")
        items = items[:MAX_PENDING]
    for item in items:
        got = parse_entry(item, now)
        if isinstance(got, str):
            hostile.append(got)
        elif scheduled is not None and scheduled(got.slot):
            hostile.append(f"slot {got.slot} is an instant of the job's schedule")
        else:
            runs.setdefault(got.slot, got)
    return Parsed(runs, hostile)


def encode(runs: list[AtRun]) -> bytes:
    return json.dumps(
        {"runs": [r.entry() for r in sorted(runs, key=lambda r: r.slot)]}, separators=(",", ":")
    ).encode()


def pending_of(value: Any, now: float, scheduled: Scheduled | None = None) -> list[AtRun]:
    """The good entries of a value, soonest first (status, the page, ``at --list``)."""
    if value is None:
        return []
    return sorted(parse_value(value, now, scheduled).runs.values(), key=lambda r: r.slot)


def on_schedule(next_slot: Callable[[int], int], slot: int) -> bool:
    """Whether `slot` is an instant of the schedule whose ``next_slot`` is given. A
    schedule with no slot left before the year 10000 has none there: the instant
    is then refused as too far ahead (instant_problem), never a ScheduleError."""
    try:
        return next_slot(slot - 1) == slot
    except ScheduleError:
        return False


def instant_problem(slot: int, now: float, on_schedule: bool) -> str | None:
    """Why the CLI or the API refuses a one-off at `slot` (epoch ms); None when it may."""
    if slot <= round(now * 1000):
        return f"{rfc3339(slot / 1000)} is not in the future"
    if slot / 1000 > now + MAX_AHEAD:
        return f"{rfc3339(slot / 1000)} is more than {MAX_AHEAD / 86400:.0f} days ahead"
    if on_schedule:
        return (
            f"{rfc3339(slot / 1000)} is an instant of the job's schedule, which runs then "
            "anyway; pick another instant (a second later, say)"
        )
    return None


def status_lines(name: str, pending: list[dict[str, Any]]) -> list[str]:
    """``status``'s lines for a job's pending one-offs (from ``at_pending``)."""
    lines = []
    for run in pending:
        why = f": {run['reason']}" if run.get("reason") else ""
        lines.append(f"{name}: one-off run at {run.get('at')} (by {run.get('by')}){why}")
    return lines
