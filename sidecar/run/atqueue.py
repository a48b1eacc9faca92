"""Queue, cancel and list one-off runs in ``at.<job>`` (sidecar/when/atkey.py), by CAS.

Each write is a compare-and-set of ``at.<job>``, so two operators, or an
operator and the sidecar dropping an entry it ran, never lose each other's
change. The command calls these through sidecar/ops/atops.py, the page and
the API through sidecar/admin/atacts.py; the fleet's part (sidecar/run/atruns.py) drops what it ran.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from sidecar.config.load import JobConfig
from sidecar.core import failpoints
from sidecar.core.clock import rfc3339
from sidecar.core.errors import CasConflict, KeptChanging
from sidecar.store.kv import COMMAND_CAS_TRIES, create_or_update, delete_at
from sidecar.store.state import decode
from sidecar.when.atkey import (
    MAX_PENDING,
    MAX_TEXT,
    AtRun,
    Scheduled,
    at_key,
    encode,
    instants_of,
    pending_of,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Queued:
    """What ``at`` did: the run, whether it was new, and how many are pending now."""

    run: AtRun
    new: bool
    pending: list[AtRun]


async def _read(
    kv: KeyValue, key: str, scheduled: Scheduled | None = None
) -> tuple[list[AtRun], int | None]:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return [], None
    return pending_of(decode(entry.value), time.time(), scheduled), int(entry.revision or 0)


async def _write(kv: KeyValue, key: str, runs: list[AtRun], revision: int | None) -> None:
    if failpoints.ENABLED:
        await failpoints.hit("cas.before_write")
    if runs:
        await create_or_update(kv, key, encode(runs), revision)
    elif revision is not None:
        await delete_at(kv, key, revision)


async def queue(kv: KeyValue, job: JobConfig, slot: int, by: str, reason: str) -> Queued:
    """Add the one-off at `slot` (checked by the caller) to ``at.<job>``."""
    key = at_key(job.name)
    run = AtRun(slot, by[:MAX_TEXT], rfc3339(time.time()), reason[:MAX_TEXT])
    for _ in range(COMMAND_CAS_TRIES):
        runs, revision = await _read(kv, key)
        held = next((r for r in runs if r.slot == slot), None)
        if held is not None:
            return Queued(held, False, runs)
        if len(runs) >= MAX_PENDING:
            raise ValueError(
                f"{job.name} has {len(runs)} one-off runs pending already (at most "
                f"{MAX_PENDING}); cancel some first"
            )
        try:
            await _write(kv, key, [*runs, run], revision)
        except CasConflict:
            continue
        return Queued(run, True, sorted([*runs, run], key=lambda r: r.slot))
    raise KeptChanging(key, COMMAND_CAS_TRIES)


async def drop(kv: KeyValue, job: str, slots: set[int] | None) -> list[AtRun]:
    """Remove the entries at `slots` (all when None) from ``at.<job>``; those removed."""
    key = at_key(job)
    for _ in range(COMMAND_CAS_TRIES):
        runs, revision = await _read(kv, key)
        if revision is None:
            return []
        gone = [r for r in runs if slots is None or r.slot in slots]
        if not gone and runs:
            return []
        try:  # an empty or wholly hostile value goes too
            await _write(kv, key, [r for r in runs if r not in gone], revision)
        except CasConflict:
            continue
        return gone
    raise KeptChanging(key, COMMAND_CAS_TRIES)


async def mark(kv: KeyValue, job: str, slot: int, instance: str) -> AtRun | None:
    """Mark the entry at `slot` as being claimed by `instance`, by compare-and-set:
    from then on a cancel is too late (``cancel``). The entry as marked (by this or
    another sidecar), or None when it is gone (cancelled, or claimed and dropped)."""
    key = at_key(job)
    for _ in range(COMMAND_CAS_TRIES):
        runs, revision = await _read(kv, key)
        held = next((r for r in runs if r.slot == slot), None)
        if held is None or held.claiming:
            return held
        marked = dataclasses.replace(held, claiming=instance[:MAX_TEXT] or "?")
        try:
            await _write(kv, key, [marked if r is held else r for r in runs], revision)
        except CasConflict:
            continue
        return marked
    raise KeptChanging(key, COMMAND_CAS_TRIES)


async def cancel(kv: KeyValue, job: str, slots: set[int] | None) -> tuple[list[AtRun], list[AtRun]]:
    """Cancel the entries at `slots` (all when None) that no sidecar started claiming:
    (those removed, those too late: marked ``claiming``, left in the key)."""
    key = at_key(job)
    for _ in range(COMMAND_CAS_TRIES):
        runs, revision = await _read(kv, key)
        if revision is None:
            return [], []
        asked = [r for r in runs if slots is None or r.slot in slots]
        late = [r for r in asked if r.claiming]
        gone = [r for r in asked if not r.claiming]
        if not gone and runs:
            return [], late
        try:  # an empty or wholly hostile value goes too
            await _write(kv, key, [r for r in runs if r not in gone], revision)
        except CasConflict:
            continue
        return gone, late
    raise KeptChanging(key, COMMAND_CAS_TRIES)


async def rewrite(kv: KeyValue, job: JobConfig) -> None:
    """Write ``at.<job>`` again with its good entries only (hostile ones dropped, an
    entry on an instant of the job's schedule too)."""
    key = at_key(job.name)
    for _ in range(COMMAND_CAS_TRIES):
        runs, revision = await _read(kv, key, instants_of(job.schedule))
        if revision is None:
            return
        try:
            await _write(kv, key, runs, revision)
        except CasConflict:
            continue
        return


async def listing(kv: KeyValue, job: str) -> list[AtRun]:
    return (await _read(kv, at_key(job)))[0]
