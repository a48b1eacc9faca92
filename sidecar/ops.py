"""One-shot writes of the schedule features to the state bucket: timed pause, skip, unskip.

Each is a compare-and-set (create, or update with the revision read), so two
operators typing at once never lose each other's change silently. Every
running sidecar sees the key through its watch within about a second.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from sidecar.clock import rfc3339
from sidecar.config import Config, JobConfig, Secrets
from sidecar.errors import ConfigError
from sidecar.oneshot import _js, connected
from sidecar.skips import MAX_SKIP, new_skip_value, pending, skip_slots
from sidecar.state import decode, ensure_bucket, put_json, state_spec
from sidecar.values import parse_duration

CAS_TRIES = 5
# ``skip`` leaves a slot this close alone: its claim may be out already.
SKIP_MARGIN_MS = 500


def until_of(text: str, now: float) -> float:
    """``--until``: an RFC 3339 time, or a duration from now (``30m``, ``2h``); epoch s.

    Raises ValueError saying what it expected; a time in the past is refused.
    """
    text = text.strip()
    try:
        at = (
            now + parse_duration(text, "--until")
            if text[:1].isdigit() and "T" not in text
            else None
        )
    except ConfigError:
        at = None
    if at is None:
        try:
            value = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"{text!r} is neither an RFC 3339 time (2026-12-24T08:00:00Z) "
                "nor a duration (30m, 2h)"
            ) from None
        if value.tzinfo is None:
            raise ValueError(f"{text!r} has no offset: add Z or +01:00")
        at = value.astimezone(UTC).timestamp()
    if at <= now:
        raise ValueError(f"{text!r} is not in the future ({rfc3339(at)})")
    return at


async def pause(
    config: Config, secrets: Secrets, job: str, reason: str, by: str, until: float | None
) -> dict[str, str]:
    """Store ``paused.<job>``, with ``until`` when given; return the value."""
    async with connected(config, secrets) as conn:
        bucket = await ensure_bucket(_js(conn), state_spec(config))
        value = {"by": by, "at": rfc3339(time.time()), "reason": reason}
        if until is not None:
            value["until"] = rfc3339(until)
        await put_json(bucket.kv, f"paused.{job}", value)
        return value


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
    key = f"skip.{job.name}"
    async with connected(config, secrets) as conn:
        bucket = await ensure_bucket(_js(conn), state_spec(config))
        kv = bucket.kv
        for _ in range(CAS_TRIES):
            now_ms = round(time.time() * 1000)
            old, revision = await _get(kv, key)
            ahead = [s for s in skip_slots(old) if s > now_ms]
            start = max([now_ms + SKIP_MARGIN_MS, *ahead])
            runs = job.schedule.runs(start, count)
            # Slots already in the past are of no use to anyone.
            kept = {"slots": ahead} if old is not None else None
            value = new_skip_value(kept, runs, by, rfc3339(now_ms / 1000), reason)
            data = _encode(value)
            try:
                if revision is None:
                    await kv.create(key, data)
                else:
                    await kv.update(key, data, last=revision)
            except KeyWrongLastSequenceError:
                continue  # someone else changed it meanwhile: read again
            return runs, pending(value, now_ms)
        raise RuntimeError(f"{key} kept changing under {CAS_TRIES} tries; try again")


async def unskip(config: Config, secrets: Secrets, job: str) -> int:
    """Delete ``skip.<job>``; how many skipped slots were still ahead (0: nothing to cancel)."""
    key = f"skip.{job}"
    async with connected(config, secrets) as conn:
        bucket = await ensure_bucket(_js(conn), state_spec(config))
        old, revision = await _get(bucket.kv, key)
        if old is None:
            return 0
        await bucket.kv.delete(key, last=revision)
        return pending(old, round(time.time() * 1000))


async def _get(kv: Any, key: str) -> tuple[dict[str, Any] | None, int | None]:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None, None
    return decode(entry.value), int(entry.revision)


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
