"""One-shot commands on the calendar: unskip, backfill (and its cancel), resume's bound.

Each connects once, does its compare-and-set (create, or update with the
revision read, so two operators typing at once never lose each other's
change silently) and closes; every running sidecar sees the key through its
watch within about a second. ``skip`` is sidecar/admin/skipwrite.py's (the
page skips too), the slots of a backfill's range sidecar/when/backfillrange.py's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sidecar.admin.skipwrite import encode, read_value
from sidecar.config.load import Config, JobConfig, Secrets
from sidecar.core import failpoints
from sidecar.core.clock import rfc3339
from sidecar.core.errors import CasConflict, KeptChanging
from sidecar.core.wire import skip_key
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
from sidecar.store.state import ensure_bucket, state_spec
from sidecar.store.stream import stream_spec
from sidecar.when.pauses import pending


async def unskip(config: Config, secrets: Secrets, job: str) -> int:
    """Delete ``skip.<job>``; how many skipped slots were still ahead (0: nothing to cancel)."""
    key = skip_key(job)
    async with connected(config, secrets) as conn:
        bucket = await ensure_bucket(_js(conn), state_spec(config))
        for _ in range(COMMAND_CAS_TRIES):
            old, revision = await read_value(bucket.kv, key)
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


# ---------------------------------------------------------------------- backfill


@dataclass(frozen=True)
class BackfillPlan:
    """What ``backfill`` found: the slots to run, and those a backfill already ran."""

    slots: list[int]
    already: list[int]
    queued: int = 0  # pending in the key after this request (0: dry run)


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
            old, revision = await read_value(kv, key)
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
                await create_or_update(kv, key, encode(value), revision)
            except CasConflict:
                continue
            return BackfillPlan(todo, done, len(pending))
        raise KeptChanging(key, COMMAND_CAS_TRIES)


async def cancel_backfill(config: Config, secrets: Secrets, job: str) -> int:
    """Delete ``backfill.<job>``: how many slots were left (the running one finishes)."""
    key = backfill_key(job)
    async with connected(config, secrets) as conn:
        bucket = await ensure_bucket(_js(conn), state_spec(config))
        old, revision = await read_value(bucket.kv, key)
        if old is None:
            return 0
        await delete_at(bucket.kv, key, revision)
        return len(slot_list(old))


# ---------------------------------------------------------------------- resume


def resume_bound(job: JobConfig) -> dict[str, Any]:
    """``since.<job>`` as ``resume`` stores it: catch-up never reaches before now."""
    return {"at": round(time.time() * 1000), "why": RESUMED, "hash": schedule_hash(job)}
