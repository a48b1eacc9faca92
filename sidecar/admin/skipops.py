"""One-shot writes of the calendar to the state bucket: timed pause, skip, unskip, backfill.

Each is a compare-and-set (create, or update with the revision read), so two
operators typing at once never lose each other's change silently. Every
running sidecar sees the key through its watch within about a second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from nats.js.errors import KeyNotFoundError

from sidecar.config.fields import parse_duration
from sidecar.config.load import Config, JobConfig, Secrets
from sidecar.core import failpoints
from sidecar.core.clock import INSTANT_RANGE, in_range, parse_instant, rfc3339
from sidecar.core.errors import CasConflict, ConfigError, KeptChanging, ScheduleError
from sidecar.core.wire import compact, skip_key
from sidecar.run.backfill import (
    MAX_SLOTS,
    backfill_key,
    backfilled_slots,
    done_of,
    running_of,
    slot_list,
)
from sidecar.run.since import RESUMED, schedule_hash
from sidecar.store.connection import connected
from sidecar.store.connection import one_shot_js as _js
from sidecar.store.kv import COMMAND_CAS_TRIES, create_or_update, delete_at
from sidecar.store.runs import read_job_messages
from sidecar.store.state import decode, ensure_bucket, state_spec
from sidecar.store.stream import stream_spec
from sidecar.when.pauses import MAX_SKIP, new_skip_value, pending, skip_slots

# backfill counts the slots of a range up to this many to name the count.
COUNT_LIMIT = 100_000
# ``skip`` leaves a slot this close alone: its claim may be out already.
SKIP_MARGIN_MS = 500
# A skipped slot stays in ``skip.<job>`` this long after its decision window.
SKIP_SETTLE = 5.0


def instant_of(text: str, now: float, back: bool = False) -> float:
    """An RFC 3339 time or a duration from now (``30m``, ``2h``), epoch s: ahead of
    `now`, or back from it when `back` (``backfill --from 2h``); a signed one
    (``-5m``, ``+1h``) says its way itself. Raises ValueError saying what it expected."""
    text = text.strip()
    sign = -1.0 if back else 1.0
    body = text
    if body[:1] in "+-" and _digit(body[1:2]):
        sign, body = (-1.0 if body[0] == "-" else 1.0), body[1:]
    at: float | None = None
    if _digit(body[:1]) and "T" not in body:
        try:
            at = now + sign * parse_duration(body, "")
        except ConfigError as exc:
            if exc.message.startswith("too long"):  # a duration, past the longest one
                raise ValueError(f"{text!r} is {exc.message}") from None
    if at is None:
        try:
            at = parse_instant(text)
        except ValueError as exc:
            if "out of range" in str(exc) or "no offset" in str(exc):
                raise
            way = "back from now" if back else "from now"
            raise ValueError(
                f"{text!r} is neither an RFC 3339 time (2026-12-24T08:00:00Z) "
                f"nor a duration {way} (30m, 2h)"
            ) from None
    if not in_range(at):
        raise ValueError(f"{text!r} is out of range: the sidecar names {INSTANT_RANGE}")
    return at


def _digit(char: str) -> bool:
    """An ASCII digit: str.isdigit() also takes other scripts' digits, which int() reads."""
    return char.isascii() and char.isdigit()


def until_of(text: str, now: float) -> float:
    """``--until``: an RFC 3339 time, or a duration from now (``30m``, ``2h``); epoch s.

    Raises ValueError saying what it expected; a time in the past, or one past
    the last instant the sidecar can name (9999-12-31T23:59:59.999Z), is refused.
    """
    at = instant_of(text, now)
    if at < now:
        raise ValueError(f"{text.strip()!r} is in the past ({rfc3339(at)})")
    if at == now:
        raise ValueError(f"{text.strip()!r} is not in the future ({rfc3339(at)})")
    return at


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
            old, revision = await _get(kv, key)
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
                await create_or_update(kv, key, _encode(value), revision)
            except CasConflict:
                continue  # someone else changed it meanwhile: read again
            return runs, pending(value, now_ms)
        raise KeptChanging(key, COMMAND_CAS_TRIES)


def undecided(old: dict[str, Any] | None, job: JobConfig, now_ms: int) -> list[int]:
    """The skipped slots a sidecar may still be deciding, or still ahead: those after
    now - (jitter + max_late + SKIP_SETTLE)."""
    since = now_ms - round((job.jitter + job.max_late + SKIP_SETTLE) * 1000)
    return sorted(s for s in skip_slots(old) if s > since)


async def unskip(config: Config, secrets: Secrets, job: str) -> int:
    """Delete ``skip.<job>``; how many skipped slots were still ahead (0: nothing to cancel)."""
    key = skip_key(job)
    async with connected(config, secrets) as conn:
        bucket = await ensure_bucket(_js(conn), state_spec(config))
        for _ in range(COMMAND_CAS_TRIES):
            old, revision = await _get(bucket.kv, key)
            if old is None:
                return 0
            if failpoints.ENABLED:
                await failpoints.hit("cas.before_write")
            try:
                await delete_at(bucket.kv, key, revision)
            except CasConflict:
                continue  # changed meanwhile (another skip): read again
            return pending(old, round(time.time() * 1000))
        raise KeptChanging(key, COMMAND_CAS_TRIES)


async def _get(kv: Any, key: str) -> tuple[dict[str, Any] | None, int | None]:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None, None
    return decode(entry.value), int(entry.revision)


def _encode(value: dict[str, Any]) -> bytes:
    return compact(value)


# ---------------------------------------------------------------------- backfill


@dataclass(frozen=True)
class BackfillPlan:
    """What ``backfill`` found: the slots to run, and those a backfill already ran."""

    slots: list[int]
    already: list[int]
    queued: int = 0  # pending in the key after this request (0: dry run)


def backfill_slots(job: JobConfig, from_ms: int, to_ms: int) -> list[int]:
    """The job's slots in [from, to] (exclusions applied); ValueError above MAX_SLOTS."""
    found = job.schedule.between(from_ms, to_ms, MAX_SLOTS)
    if len(found) > MAX_SLOTS:
        count = len(job.schedule.between(from_ms, to_ms, COUNT_LIMIT))
        said = f"{count}" if count <= COUNT_LIMIT else f"more than {COUNT_LIMIT}"
        raise ValueError(
            f"{said} slots in that range; a backfill runs at most {MAX_SLOTS}: split it"
        )
    return found


async def backfill(
    config: Config,
    secrets: Secrets,
    job: JobConfig,
    slots: list[int],
    by: str,
    dry_run: bool,
    again: bool,
    trigger: str = "backfill",
) -> BackfillPlan:
    """Queue `slots` in ``backfill.<job>`` for the fleet; without `again`, not those a
    backfill already ran (their claims are in the stream)."""
    spec = stream_spec(config)
    async with connected(config, secrets) as conn:
        js = _js(conn)
        already: set[int] = set()
        if not again:
            try:
                messages = await read_job_messages(js, spec.name, spec.prefix, job.name)
            except Exception as exc:  # no stream yet: nothing ran
                if "not found" not in str(exc).lower():
                    raise
                messages = []
            already = backfilled_slots(messages, spec.prefix, job.name)
        todo = [s for s in slots if s not in already]
        done = sorted(already & set(slots))
        if dry_run or not todo:
            return BackfillPlan(todo, done)
        bucket = await ensure_bucket(js, state_spec(config))
        kv = bucket.kv
        key = backfill_key(job.name)
        tag = f"b{int(time.time())}" if again else "b"
        for _ in range(COMMAND_CAS_TRIES):
            old, revision = await _get(kv, key)
            if old is not None and (old.get("tag"), old.get("trigger")) != (tag, trigger):
                left = len(slot_list(old)) + (1 if running_of(old) else 0)
                raise ValueError(
                    f"another backfill of {job.name} is under way ({left} slot(s) left); "
                    f"wait for it, or cancel it with `backfill {job.name} --cancel`"
                )
            pending = sorted(set(slot_list(old)) | set(todo))
            if len(pending) > MAX_SLOTS:  # the sidecars refuse a key holding more
                raise ValueError(
                    f"the backfill of {job.name} would then hold {len(pending)} slots; at "
                    f"most {MAX_SLOTS} wait at once: wait for it, or ask for fewer"
                )
            value = {
                "pending": pending,
                "running": running_of(old),
                "tag": tag,
                "trigger": trigger,
                "by": by,
                "at": rfc3339(time.time()),
                "done": done_of(old),
            }
            if failpoints.ENABLED:
                await failpoints.hit("cas.before_write")
            try:
                await create_or_update(kv, key, _encode(value), revision)
            except CasConflict:
                continue
            return BackfillPlan(todo, done, len(pending))
        raise KeptChanging(key, COMMAND_CAS_TRIES)


async def cancel_backfill(config: Config, secrets: Secrets, job: str) -> int:
    """Delete ``backfill.<job>``: how many slots were left (the running one finishes)."""
    key = backfill_key(job)
    async with connected(config, secrets) as conn:
        bucket = await ensure_bucket(_js(conn), state_spec(config))
        old, revision = await _get(bucket.kv, key)
        if old is None:
            return 0
        await delete_at(bucket.kv, key, revision)
        return len(slot_list(old))


# ---------------------------------------------------------------------- resume


def resume_bound(job: JobConfig) -> dict[str, Any]:
    """``since.<job>`` as ``resume`` stores it: catch-up never reaches before now."""
    return {"at": round(time.time() * 1000), "why": RESUMED, "hash": schedule_hash(job)}
