"""A job's health across the fleet: consecutive failures, and the events they make.

``health.<job>`` in the state bucket holds ``failures`` (consecutive failed or
lost runs, fleet-wide), ``state`` (``ok`` or ``failing``), the run that wrote
it last (``run``: its token) and the events that run made (``events``). Each
run's outcome is applied once, by the one sidecar that records it (the
runner, or the sidecar whose ``lost`` record was stored), with a
compare-and-set on the key's revision: of two outcomes applied at once one
conflicts, reads again and applies on top of the other, so the count is the
fleet's and every transition (``failing``, ``recovered``, ``auto_paused``) is
decided by exactly one write. An outcome applied again (its write's answer
was lost) finds its own token there and gets the events it made the first
time. ``transition`` is the pure rule; ``apply`` the write. ``resume`` resets
the count (``reset``).

Before a notification goes out, its sender also creates ``event.<job>.<run
token>.<event>`` (with a TTL): of every sender of one event exactly one
succeeds (``claim_event``), so an event is sent once however it was reached.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from sidecar.core.backoff import Backoff
from sidecar.core.errors import CasConflict, KeyHeld
from sidecar.core.wire import (
    FAILED_STATUSES,
    LOST,
    SUCCEEDED,
    TRANSIENT,
    event_key,
    new_token,
)
from sidecar.core.wire import health_key as health_key  # re-exported
from sidecar.store.kv import Keys, create_or_update

log = logging.getLogger(__name__)

OK = "ok"
FAILING = "failing"
# An event key lives this long: far longer than any retry of its outcome.
EVENT_TTL = 3600.0
# More than a command's COMMAND_CAS_TRIES (sidecar/store/kv.py): nobody waits
# for it, and the runs of one job ending on several sidecars at once (retries,
# backfills, one-off runs) all write health.<job>, each on top of the others.
HEALTH_CAS_TRIES = 20
# Between two compare-and-set tries of apply (after a conflict or no answer),
# and the fixed pause of reset's after a conflict.
CAS_RETRY_START = 0.02
CAS_RETRY_CAP = 1.0


def transition(
    prev: dict[str, Any] | None, status: str, run: str, pause_after: int | None
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The job's next health value after a run ended with `status`, and its events.

    ``failing``: the first failed or lost run after a success or after start;
    ``lost`` for a lost run; ``auto_paused`` once the count reaches
    `pause_after` (the pause itself is made once: Aftermath creates the pause
    key); ``recovered``: the first success after failures.
    """
    prev = prev or {}
    failures = prev.get("failures", 0)
    if not isinstance(failures, int) or isinstance(failures, bool) or failures < 0:
        failures = 0
    state = prev.get("state")
    events: list[str] = []
    if status in FAILED_STATUSES:
        failures += 1
        if state != FAILING:
            events.append("failing")
        if status == LOST:
            events.append("lost")
        if pause_after is not None and failures >= pause_after:
            # Every failure from the N-th on asks for the pause: the pause key's
            # create (Aftermath) makes it once, and a pause that could not be
            # stored is tried again by the next failure instead of being lost.
            events.append("auto_paused")
        state = FAILING
    value: dict[str, Any] = {}
    if status == SUCCEEDED:
        if state == FAILING:
            events.append("recovered")
            value["recovered_after"] = failures
        failures = 0
        state = OK
    value.update({"failures": failures, "state": state, "run": run, "events": events})
    return value, tuple(events)


async def _cas(keys: Keys, key: str, value: dict[str, Any], expected: int) -> int:
    try:
        return await keys.update(key, value, expected)
    except CasConflict as exc:
        raise KeyHeld(key, {}) from exc


async def apply(
    keys: Keys, job: str, status: str, run: str, pause_after: int | None
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Apply one run's outcome to ``health.<job>``; the new value and the events made."""
    key = health_key(job)
    backoff = Backoff(CAS_RETRY_START, CAS_RETRY_CAP)
    for _ in range(HEALTH_CAS_TRIES):
        try:
            last = await keys.last(key)
            revision, prev = last if last is not None else (0, None)
            if prev is not None and prev.get("run") == run:
                made = prev.get("events")
                made = made if isinstance(made, list) else []
                events = tuple(e for e in made if isinstance(e, str))
                return prev, events  # applied already; its answer was lost
            value, events = transition(prev, status, run, pause_after)
            await _cas(keys, key, value, revision)
            return value, events
        except KeyHeld:
            pass  # another outcome was applied meanwhile: on top of it
        except TRANSIENT as exc:
            log.debug("%s: %r; asking again", key, exc)
        await backoff.sleep()
    raise TimeoutError(f"{key}: no compare-and-set succeeded in {HEALTH_CAS_TRIES} tries")


async def reset(keys: Keys, job: str) -> bool:
    """``resume``: the count back to 0, the state kept (a success then still reads as
    ``recovered``). False when the job had no health key."""
    key = health_key(job)
    backoff = Backoff(CAS_RETRY_START, CAS_RETRY_START)
    for _ in range(HEALTH_CAS_TRIES):
        last = await keys.last(key)
        if last is None or last[1] is None:
            return False
        revision, prev = last[0], last[1]
        value = {**prev, "failures": 0, "run": "", "events": []}
        try:
            await _cas(keys, key, value, revision)
            return True
        except KeyHeld:
            await backoff.sleep()
    raise TimeoutError(f"{key}: no compare-and-set succeeded in {HEALTH_CAS_TRIES} tries")


async def claim_event(keys: Keys, job: str, run: str, event: str, ttl: float | None) -> bool:
    """Create ``event.<job>.<run>.<event>``; True for the one sender that made it."""
    # A token of its own: Keys.create takes a conflict over the same owner for its
    # own earlier create answered late.
    value = {"job": job, "run": run, "event": event, "token": new_token()}
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", run)
    try:
        await keys.create(event_key(job, safe, event), value, ttl)
    except KeyHeld:
        return False
    return True


async def reset_kv(kv: Any, job: str) -> bool:
    """``reset`` through a nats-py ``KeyValue`` (the fleet page's resume)."""
    from nats.js.errors import KeyNotFoundError

    key = health_key(job)
    backoff = Backoff(CAS_RETRY_START, CAS_RETRY_START)
    for _ in range(HEALTH_CAS_TRIES):
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            return False
        try:
            prev = json.loads(entry.value or b"{}")
        except ValueError:
            prev = {}
        value = {**(prev if isinstance(prev, dict) else {}), "failures": 0, "run": "", "events": []}
        try:
            await create_or_update(kv, key, value, entry.revision)
            return True
        except CasConflict:
            await backoff.sleep()
    raise TimeoutError(f"{key}: no compare-and-set succeeded in {HEALTH_CAS_TRIES} tries")
