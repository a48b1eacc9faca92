"""A ``backfill.<job>`` value is acted on only when it is what the command writes.

Anyone allowed to write the state bucket can write the key (SECURITY.md), and
forged values made a fleet trigger a slot not on the schedule, a slot in
1969 and one an hour ahead (which then ran again at its time); a slot of
10**20 made the backfill task log a traceback every 5 s and ``status`` die
(``OSError: [Errno 75]``). Before a sidecar takes a slot of a backfill, the
whole value must be one that ``backfill`` / ``resume --catchup`` (and the
sidecars' own updates of it) can write:

- an object of exactly the command's fields: ``pending``, ``running``,
  ``tag`` (``b`` or ``b<seconds>``), ``trigger`` (``backfill`` or
  ``catchup``), ``by``, ``at`` (an RFC 3339 time not ahead of now), ``done``;
- at most MAX_SLOTS slots pending, sorted and each once, and each (and the
  running one) an instant of the job's own schedule that is not excluded, in
  range, and already past when the command wrote it (not later than its
  ``at``, nor than now plus CLOCK_SLACK).

The checks read only the job's config and the value: the command writes
nothing else anywhere a forger could not write as well. A value that fails is
hostile input: the caller counts it (``what="backfill_key"``), logs it once,
deletes it and triggers nothing of it. Its slots are not formatted before
they are checked: nothing in the value can crash the reader.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import TYPE_CHECKING, Any

from sidecar.core.bounds import is_int, slot_ms
from sidecar.core.clock import in_range, parse_rfc3339
from sidecar.core.errors import HostileBackfill
from sidecar.when.backfillrange import MAX_SLOTS

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig

# A command on a host whose clock runs this far ahead is still believed (NTP-kept
# fleets are within a second; one further ahead has its backfill refused, said in the log).
CLOCK_SLACK = 5.0
FIELDS = frozenset({"pending", "running", "tag", "trigger", "by", "at", "done"})
RUNNING_FIELDS = frozenset({"slot", "instance", "at"})
TAG = re.compile(r"b(?:[0-9]{1,12})?")
# The triggers a backfill run may carry (core/wire.py's TRIGGERS has every kind).
BACKFILL_TRIGGERS = ("backfill", "catchup")
MAX_TEXT = 256  # ``by``, ``instance``: a user@host, an instance id


def decode_backfill(raw: bytes | None) -> dict[str, Any]:
    """The JSON object of a ``backfill.<job>`` entry; HostileBackfill when it is none."""
    try:
        value = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise HostileBackfill("not JSON") from None
    if not isinstance(value, dict):
        raise HostileBackfill("not a JSON object")
    return value


def _time(value: Any, what: str) -> float:
    if not isinstance(value, str) or len(value) > 40:
        raise HostileBackfill(f"{what} is not an RFC 3339 time")
    try:
        at = parse_rfc3339(value)
    except (ValueError, OverflowError):
        raise HostileBackfill(f"{what} is not an RFC 3339 time") from None
    if not in_range(at):
        raise HostileBackfill(f"{what} is out of range")
    return at


def _text(value: Any, what: str) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT:
        raise HostileBackfill(f"{what} is not a name")


def _slot(job: JobConfig, value: Any, written: float, now: float) -> None:
    slot = slot_ms(value)
    if slot is None:
        raise HostileBackfill("a slot is not a time in range (1970 to 9999)")
    if slot / 1000 > min(written, now) + CLOCK_SLACK:
        raise HostileBackfill("a slot is in the future (a backfill runs past slots only)")
    if job.schedule.excluded(slot) is not None:
        raise HostileBackfill("a slot is excluded by the job's calendar")
    if job.schedule.next_slot(slot - 1) != slot:
        raise HostileBackfill("a slot is not an instant of the job's schedule")


def check_backfill(job: JobConfig, value: dict[str, Any], now: float) -> None:
    """HostileBackfill, saying why, unless `value` is one the command writes for `job`."""
    extra = set(value) - FIELDS
    if extra:
        raise HostileBackfill(f"unknown field {sorted(extra)[0][:40]!r}")
    if set(value) != FIELDS:
        raise HostileBackfill(f"field {sorted(FIELDS - set(value))[0]!r} missing")
    tag, trigger = value["tag"], value["trigger"]
    if not isinstance(tag, str) or not TAG.fullmatch(tag):
        raise HostileBackfill("tag is not b or b<seconds>")
    if trigger not in BACKFILL_TRIGGERS:
        raise HostileBackfill("trigger is not backfill or catchup")
    _text(value["by"], "by")
    written = _time(value["at"], "at")
    if written > now + CLOCK_SLACK:
        raise HostileBackfill("at is in the future")
    done = value["done"]
    if not is_int(done) or not 0 <= done <= 10**9:
        raise HostileBackfill("done is not a count")
    pending = value["pending"]
    if not isinstance(pending, list) or len(pending) > MAX_SLOTS:
        raise HostileBackfill(f"pending is not a list of at most {MAX_SLOTS} slots")
    slots = [s for s in map(slot_ms, pending) if s is not None]
    if len(slots) != len(pending):
        raise HostileBackfill("a slot is not a time in range (1970 to 9999)")
    if any(a >= b for a, b in itertools.pairwise(slots)):
        raise HostileBackfill("pending is not sorted, or names a slot twice")
    running = value["running"]
    if running is not None:
        if not isinstance(running, dict) or set(running) != RUNNING_FIELDS:
            raise HostileBackfill("running is not null or {slot, instance, at}")
        _text(running["instance"], "running.instance")
        _time(running["at"], "running.at")
        _slot(job, running["slot"], written, now)
    for slot in pending:
        _slot(job, slot, written, now)


__all__ = ["MAX_SLOTS", "HostileBackfill", "check_backfill", "decode_backfill"]
