"""``job.<name>`` written by compare-and-set: a job of the state bucket added, updated, removed.

The acts ``job add/update/remove`` (sidecar/ops/jobops.py), ``job import``
(sidecar/ops/jobimport.py) and the API's ``POST /api/v1/bucket-jobs/...``
(sidecar/admin/api.py) share: the job checked as the daemon will check it
(sidecar/admin/jobcheck.py), a name of the file refused, idempotent by id,
at most ``bucket_jobs.max_jobs``; each takes a KeyValue of the state bucket
(the commands' own connection, the page's). A daemon takes the written key
up (sidecar/admin/bucket_jobs.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from nats.js.errors import KeyNotFoundError

from sidecar.admin.jobcheck import (
    PREFIX,
    BucketJob,
    canonical,
    external_id,
    job_key,
    parse_bucket_job,
)
from sidecar.config.bucketrules import check_value_size
from sidecar.config.fields import short
from sidecar.config.model import Config
from sidecar.core import failpoints
from sidecar.core.clock import rfc3339
from sidecar.core.errors import BucketJobRefused, CasConflict, ConfigError, KeptChanging
from sidecar.core.natspy import read_initial
from sidecar.run.since import schedule_hash, since_key
from sidecar.run.since import value_object as since_object
from sidecar.store.kv import create_or_update, delete_at, put_json
from sidecar.store.state import READ_TIMEOUT, decode

log = logging.getLogger(__name__)

# ``since.<job>``'s why when `job add` bounds the new job's catch-up.
ADDED = "added"


def prepare(
    config: Config,
    data: object,
    ident: str | None,
    by: str,
    file_names: tuple[str, ...] | frozenset[str] | None = None,
) -> tuple[BucketJob, dict[str, Any]]:
    """Check `data` as the daemon will (exit 2 naming the key), refuse a name the file
    has; the job and the value to store (with id, by, at)."""
    if isinstance(data, dict) and ident is not None:
        data = {**data, "id": ident}
    spec = parse_bucket_job(config, data, "job")
    assert isinstance(data, dict)
    if spec.job.name in (config.job_names if file_names is None else file_names):
        raise ConfigError(
            "job.name",
            f"the config file has a job {spec.job.name!r}: it wins over a job of the state "
            "bucket of the same name, which would never run",
        )
    value = {**data, "id": spec.id, "by": by, "at": rfc3339(time.time())}
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError("job", f"not representable as JSON: {exc}") from None
    check_value_size(config.bucket_jobs, value, "job")  # with by and at, as stored
    return spec, value


@dataclass(frozen=True)
class Written:
    """What `job add/update/remove` did: ``created``, ``updated``, ``unchanged``, ``removed``."""

    name: str
    id: str
    what: str
    revision: int = 0


async def stored_job(kv: Any, key: str) -> tuple[dict[str, Any], int] | None:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    if entry.value is None or entry.operation is not None:
        return None
    return decode(entry.value), int(entry.revision)


async def count_jobs(kv: Any) -> int:
    """How many ``job.<name>`` keys the bucket holds (their values not fetched)."""
    live: list[bool] = []
    # Deletes are read and not counted: a watcher that skips them cannot tell
    # nats-py's early end marker from the end (sidecar/core/natspy.py read_initial).
    watcher = await kv.watch(f"{PREFIX}>", meta_only=True)
    try:
        await read_initial(
            watcher, lambda entry: live.append(entry.operation is None), READ_TIMEOUT
        )
    finally:
        await watcher.stop()
    return sum(live)


async def create_job(kv: Any, spec: BucketJob, value: dict[str, Any]) -> int:
    """Create ``job.<name>`` (CasConflict when it was written meanwhile); its revision.

    First the catch-up bound (sidecar/run/since.py): a job that is new, or removed
    and added again, never catches up a slot from before now. `job add` and
    `job import` both create through here."""
    name = spec.job.name
    now_ms = round(time.time() * 1000)
    await put_json(kv, since_key(name), since_object(now_ms, ADDED, schedule_hash(spec.job)))
    if failpoints.ENABLED:
        await failpoints.hit("cas.before_write")
    return await create_or_update(kv, job_key(name), value, None)


async def add_in(kv: Any, spec: BucketJob, value: dict[str, Any], max_jobs: int) -> Written:
    """Store ``job.<name>`` when absent; the same job with the same id again: unchanged.
    A new job when the bucket already holds `max_jobs`: ConfigError naming the limit."""
    name = spec.job.name
    key = job_key(name)
    for _ in range(3):
        now = await stored_job(kv, key)
        if now is not None:
            stored, revision = now
            if str(stored.get("id", name)) != spec.id:
                raise BucketJobRefused(
                    f"{name}: the state bucket has this job with id "
                    f"{short(stored.get('id'))}, not {short(spec.id)}: not added"
                )
            if canonical(stored) == spec.canon:
                return Written(name, spec.id, "unchanged", revision)
            raise BucketJobRefused(
                f"{name}: the state bucket has this job (id {short(spec.id)}) with other "
                "settings: `job update` changes it"
            )
        held = await count_jobs(kv)
        if held >= max_jobs:
            raise ConfigError(
                "bucket_jobs.max_jobs",
                f"the state bucket holds {held} jobs, the most the config file allows "
                f"({max_jobs}): {name} not added (`job remove` one, or raise the limit)",
            )
        try:
            revision = await create_job(kv, spec, value)
        except CasConflict:
            continue  # written meanwhile: read again
        return Written(name, spec.id, "created", revision)
    raise KeptChanging(key, 3)


async def update_in(kv: Any, spec: BucketJob, value: dict[str, Any], id_given: bool) -> Written:
    """Replace ``job.<name>`` by compare-and-set; BucketJobRefused when absent, or held
    by another id when one was given."""
    name = spec.job.name
    key = job_key(name)
    if kv is None:
        raise BucketJobRefused(
            f"{name}: no such job in the state bucket (`job add` adds it)", missing=True
        )
    for _ in range(3):
        now = await stored_job(kv, key)
        if now is None:
            raise BucketJobRefused(
                f"{name}: no such job in the state bucket (`job add` adds it)", missing=True
            )
        stored, revision = now
        stored_id = str(stored.get("id", name))
        if id_given and stored_id != spec.id:
            raise BucketJobRefused(
                f"{name}: the state bucket has this job with id {short(stored_id)}, "
                f"not {short(spec.id)}: not updated"
            )
        if not id_given:  # the id stays the stored one
            value = {**value, "id": stored_id}
            spec = dataclasses.replace(spec, id=stored_id, canon=canonical(value))
        if canonical(stored) == spec.canon:
            return Written(name, spec.id, "unchanged", revision)
        if failpoints.ENABLED:
            await failpoints.hit("cas.before_write")
        try:
            revision = await create_or_update(kv, key, value, revision)
        except CasConflict:
            continue
        return Written(name, spec.id, "updated", revision)
    raise KeptChanging(key, 3)


async def remove_in(kv: Any, name: str, ident: str | None) -> Written:
    """Delete ``job.<name>`` (only if its id is `ident`, when given)."""
    key = job_key(name)
    now = await stored_job(kv, key) if kv is not None else None
    if now is None:
        raise BucketJobRefused(f"{name}: no such job in the state bucket", missing=True)
    stored, revision = now
    stored_id = str(stored.get("id", name))
    if ident is not None and stored_id != ident:
        raise BucketJobRefused(
            f"{name}: the state bucket has this job with id {short(stored_id)}, "
            f"not {short(ident)}: not removed"
        )
    try:
        await delete_at(kv, key, revision)
    except CasConflict:
        raise BucketJobRefused(f"{name}: changed meanwhile; not removed") from None
    return Written(name, stored_id, "removed", revision)


API_ACTIONS = ("add", "update", "remove")


async def api_action(
    config: Config,
    file_names: frozenset[str],
    kv: Any,
    name: str,
    action: str,
    body: bytes,
    who: str,
) -> tuple[int, dict[str, Any]]:
    """``POST /api/v1/bucket-jobs/<name>/{add,update,remove}`` (admin token): the body is
    the job as JSON (``id`` included) for add and update, ``{"id": ...}`` or nothing
    for remove; the same checks and answers as the commands'."""
    try:
        data = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        return 400, {"error": "the body must be a JSON object"}
    if not isinstance(data, dict):
        return 400, {"error": "the body must be a JSON object"}
    try:
        if action == "remove":
            ident = data.get("id")
            if ident is not None:
                try:
                    ident = external_id(ident, "id")
                except ConfigError as exc:
                    return 400, {"error": f"config error: {exc}", "key": exc.key}
            done = await remove_in(kv, name, ident)
        else:
            if data.get("name", name) != name:
                return 400, {"error": f"job.name: must be {name!r}, the job of the URL"}
            data = {**data, "name": name}
            try:
                spec, value = prepare(config, data, None, who, file_names)
            except ConfigError as exc:
                return 400, {"error": f"config error: {exc}", "key": exc.key}
            if action == "add":
                try:
                    done = await add_in(kv, spec, value, config.bucket_jobs.max_jobs)
                except ConfigError as exc:
                    return 400, {"error": f"config error: {exc}", "key": exc.key}
            else:
                done = await update_in(kv, spec, value, data.get("id") is not None)
    except BucketJobRefused as exc:
        return (404 if exc.missing else 409), {"error": str(exc)}
    log.info("fleet page: job %s of the state bucket: %s by %s", name, done.what, who)
    return 200, {"name": done.name, "id": done.id, "result": done.what}
