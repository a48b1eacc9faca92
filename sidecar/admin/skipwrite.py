"""``skip.<job>`` written by compare-and-set: ``skip`` and the page's and API's skip.

The slots are chosen here, from the config's schedule, and stored by id, so
every replica skips exactly these. A compare-and-set (create, or update with
the revision read), so two operators at once never lose each other's change
silently; every running sidecar sees the key through its watch within about
a second. ``unskip`` and ``backfill`` (sidecar/ops/skipops.py) read and write
their keys with ``read_value`` and ``encode``.
"""

from __future__ import annotations

import time
from typing import Any

from nats.js.errors import KeyNotFoundError

from sidecar.config.load import Config, JobConfig, Secrets
from sidecar.core import failpoints
from sidecar.core.clock import rfc3339
from sidecar.core.errors import CasConflict, KeptChanging, ScheduleError
from sidecar.core.wire import compact, skip_key
from sidecar.store.connection import connected
from sidecar.store.connection import one_shot_js as _js
from sidecar.store.kv import COMMAND_CAS_TRIES, create_or_update
from sidecar.store.state import decode, ensure_bucket, state_spec
from sidecar.when.pauses import MAX_SKIP, new_skip_value, pending, skip_slots

# ``skip`` leaves a slot this close alone: its claim may be out already.
SKIP_MARGIN_MS = 500
# A skipped slot stays in ``skip.<job>`` this long after its decision window.
SKIP_SETTLE = 5.0


async def skip(
    config: Config, secrets: Secrets, job: JobConfig, count: int, by: str, reason: str
) -> tuple[list[int], int]:
    """Add the job's next `count` runs to ``skip.<job>``; (the slots added, now pending).

    The slots are chosen here, from the config's schedule (exclusions applied,
    after the last slot already skipped, and more than SKIP_MARGIN_MS ahead),
    and stored by id, so every replica skips exactly these.
    """
    if not 1 <= count <= MAX_SKIP:
        raise ValueError(f"--count must be 1 to {MAX_SKIP}, got {count}")
    key = skip_key(job.name)
    async with connected(config, secrets) as conn:
        bucket = await ensure_bucket(_js(conn), state_spec(config))
        kv = bucket.kv
        for _ in range(COMMAND_CAS_TRIES):
            now_ms = round(time.time() * 1000)
            old, revision = await read_value(kv, key)
            ahead = [s for s in skip_slots(old) if s > now_ms]
            start = max([now_ms + SKIP_MARGIN_MS, *ahead])
            try:
                runs = job.schedule.runs(start, count)
            except ScheduleError:
                raise ValueError(
                    f"the schedule has fewer than {count} runs left to skip before "
                    "10000-01-01 (the sidecar names 9999-12-31T23:59:59.999Z at most)"
                ) from None
            # A past slot is dropped only once no sidecar can still be deciding it
            # (its instant + jitter + max_late gone by): never one whose fate is pending.
            kept = {"slots": undecided(old, job, now_ms)} if old is not None else None
            value = new_skip_value(kept, runs, by, rfc3339(now_ms / 1000), reason)
            if failpoints.ENABLED:
                await failpoints.hit("cas.before_write")
            try:
                await create_or_update(kv, key, encode(value), revision)
            except CasConflict:
                continue  # someone else changed it meanwhile: read again
            return runs, pending(value, now_ms)
        raise KeptChanging(key, COMMAND_CAS_TRIES)


def undecided(old: dict[str, Any] | None, job: JobConfig, now_ms: int) -> list[int]:
    """The skipped slots a sidecar may still be deciding, or still ahead: those after
    now - (jitter + max_late + SKIP_SETTLE)."""
    since = now_ms - round((job.jitter + job.max_late + SKIP_SETTLE) * 1000)
    return sorted(s for s in skip_slots(old) if s > since)


async def read_value(kv: Any, key: str) -> tuple[dict[str, Any] | None, int | None]:
    """A key's value (decoded) and revision; (None, None) when there is none."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None, None
    return decode(entry.value), int(entry.revision)


def encode(value: dict[str, Any]) -> bytes:
    """A value as the sidecars read it: compact JSON."""
    return compact(value)
