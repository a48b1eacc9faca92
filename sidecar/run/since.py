"""How far back catch-up may reach: ``since.<job>`` in the state bucket (no surprise burst).

``catchup`` claims slots of the last ``max_late`` that nobody claimed. Two
things must bound that look-back, whatever ``catchup`` says:

* a **pause**: the slots that fell during it are not run when it ends. A
  sidecar that was down during the whole pause and starts after ``resume``
  must not catch them up either, so ``resume`` writes ``since.<job>`` with
  the resume time; a pause that ended by itself (``--until``) bounds it by
  its ``until`` while its key is still there;
* a **schedule change**: after a job's slots change (expressions, timezone,
  spread, exclusions), no slot of the old schedule and none of the new one
  dated before the change is caught up. Each sidecar compares the hash of its
  schedule with the one in ``since.<job>`` when it first looks back for the
  job; the first to see a different one stores its hash with the time
  (compare-and-set, so the fleet agrees on one time).

The value is ``{"at": <epoch ms>, "why": ..., "hash": <schedule hash>}``.
A job never seen before gets ``at`` 0 (no bound: nothing changed that we know of).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any

from sidecar.core.errors import CasConflict
from sidecar.core.wire import compact
from sidecar.core.wire import since_key as since_key  # re-exported
from sidecar.store.kv import create_or_update
from sidecar.when.pauses import until_ms

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from sidecar.config.load import JobConfig

log = logging.getLogger(__name__)

RESUMED = "resumed"
CHANGED = "schedule changed"


def schedule_hash(job: JobConfig) -> str:
    """What decides the job's slots, hashed: expressions, timezone, spread, exclusions."""
    text = f"{job.schedule.identity}\x1f{job.timezone.key}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def floor_ms(since: dict[str, Any] | None, paused: dict[str, Any] | None, now_ms: int) -> int:
    """The earliest slot catch-up may claim, from ``since.<job>`` and a timed pause's end."""
    floor = 0
    at = (since or {}).get("at")
    if isinstance(at, int) and not isinstance(at, bool):
        floor = at
    if paused is not None:
        end = until_ms(paused)
        # A pause is bounded by its end; an open one blocks every claim anyway.
        if end is not None and end <= now_ms:
            floor = max(floor, end)
    return floor


def value_object(at_ms: int, why: str, digest: str) -> dict[str, Any]:
    """``since.<job>``'s value: from when catch-up may reach back, and why."""
    return {"at": at_ms, "why": why, "hash": digest}


def value(at_ms: int, why: str, digest: str) -> bytes:
    return compact(value_object(at_ms, why, digest))


async def settle(
    kv: KeyValue, job: JobConfig, seen: dict[str, Any] | None, revision: int | None, now_ms: int
) -> dict[str, Any]:
    """``since.<job>`` with this sidecar's schedule: stored when it changed; the value in force.

    `seen`/`revision`: the key as the view holds it (None: absent).
    """
    digest = schedule_hash(job)
    for _ in range(5):
        if seen is not None and seen.get("hash") == digest:
            return seen
        first = seen is None
        data = value(0 if first else now_ms, "first seen" if first else CHANGED, digest)
        try:
            await create_or_update(kv, since_key(job.name), data, revision)
        except CasConflict:
            entry = await kv.get(since_key(job.name))  # another sidecar was first: read it
            seen, revision = json.loads(entry.value or b"{}"), int(entry.revision or 0)
            continue
        if not first:
            log.warning(
                "job %s: its schedule changed; catch-up never reaches back before now", job.name
            )
        return {"at": 0 if first else now_ms, "hash": digest}
    return seen or {}
