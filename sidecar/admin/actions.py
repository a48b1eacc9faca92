"""What the fleet page and its API do to a job, and the record of each act.

Every act (run-now, pause, resume, skip) is written to the state bucket under
``actions.<job>``: a JSON object ``{"actions": [...]}``, newest last, each
``{"id", "at", "by", "action", "from", "via", "instance", "detail"}``. ``by``
is the token's name (never the token), ``from`` the address the request came
from. The key is updated by compare-and-set, so acts from two replicas at once
are both kept. A reference implementation sharing the stream never reads the
state bucket, and nothing of ours reads ``actions.*`` but the page: the claim
and result subjects stay exactly as they were. Every act is also logged at
info.

The trail cannot overflow: each field is cut to a bounded length (a skip of
1,000 runs is summed up as its count, first and last slot, not listed), and
the last ``ACTIONS_KEPT`` entries are kept only while the value stays under
``MAX_BYTES`` (older ones go first), whatever the key held before. Forty page
skips of 1,000 runs passed NATS's 1 MiB limit: the 41st took effect and was
answered 503 "cannot record the action", and an operator who tried again
skipped another 1,000.

An act is either done and recorded, or neither (sidecar/admin/api.py): it is
recorded first (``record_action``), then done; one that cannot be done is
taken out of the record again (``drop_action``), and the detail that only
the act knows (the slots skipped, the run id) is filled in after
(``complete_action``). The answer says ``done`` and ``recorded``.

A manual run from the page is claimed, triggered and recorded by the sidecar
that serves the page, like ``anarchon-sidecar run-now`` on that host; it runs
in the background (the answer carries its run id) and the drain on SIGTERM
waits for it like for any run.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from sidecar.admin.objects import ACTIONS_KEPT
from sidecar.after.health import reset_kv
from sidecar.config.load import Config, JobConfig
from sidecar.core.clock import Clock, rfc3339
from sidecar.core.errors import CasConflict, StreamError
from sidecar.core.wire import FAILED, SUCCEEDED, paused_key
from sidecar.run.claim import Claimer
from sidecar.run.record import Outcome, Recorder
from sidecar.run.trigger import Trigger
from sidecar.store.kv import COMMAND_CAS_TRIES, create_or_update, delete_at, store_pause
from sidecar.store.state import decode
from sidecar.store.stream import stream_spec

if TYPE_CHECKING:
    from sidecar.after.aftermath import Aftermath

log = logging.getLogger(__name__)

CLAIM_WAIT = 10.0
# The whole ``actions.<job>`` value stays under this (NATS refuses 1 MiB).
MAX_BYTES = 64 * 1024
# Each field of an entry is cut to this many characters (detail: DETAIL_CHARS).
FIELD_CHARS = 128
DETAIL_CHARS = 400
FIELDS = ("id", "at", "by", "action", "from", "via", "instance", "detail")


def actions_key(job: str) -> str:
    return f"actions.{job}"


def actions_of(value: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of an ``actions.<job>`` value, newest first; anything odd dropped."""
    items = value.get("actions")
    if not isinstance(items, list):
        return []
    return [item for item in reversed(items) if isinstance(item, dict)]


def bounded_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """`entry` with only the known fields, each text cut to its bound."""
    out: dict[str, Any] = {}
    for name in FIELDS:
        value = entry.get(name)
        if value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value)[:FIELD_CHARS]
        limit = DETAIL_CHARS if name == "detail" else FIELD_CHARS
        out[name] = text if len(text) <= limit else text[: limit - 3] + "..."
    return out


def bounded_actions(items: list[Any]) -> list[dict[str, Any]]:
    """The newest ACTIONS_KEPT entries of `items` (oldest first), bounded each, as
    many as fit in MAX_BYTES."""
    kept = [bounded_entry(i) for i in items[-ACTIONS_KEPT:] if isinstance(i, dict)]
    size = len(json.dumps({"actions": kept}, separators=(",", ":")).encode())
    while kept and size > MAX_BYTES:
        size -= len(json.dumps(kept.pop(0), separators=(",", ":")).encode()) + 1
    return kept


def skip_detail(added: list[int], reason: str) -> str:
    """A skip in a line, whatever its count: the slots when a few, else the range."""
    if len(added) <= 3:
        said = ", ".join(rfc3339(s / 1000) for s in added)
    else:
        said = f"{len(added)} runs, {rfc3339(added[0] / 1000)} to {rfc3339(added[-1] / 1000)}"
    return f"skip {said}" + (f": {reason}" if reason else "")


async def _change(kv: KeyValue, job: str, change: Callable[[list[Any]], list[Any] | None]) -> None:
    """Apply `change` to the entries of ``actions.<job>`` by compare-and-set (None: no
    write); StreamError when it cannot."""
    key = actions_key(job)
    for _ in range(COMMAND_CAS_TRIES):
        try:
            try:
                current = await kv.get(key)
                items = decode(current.value).get("actions")
                revision: int | None = int(current.revision or 0)
            except KeyNotFoundError:
                items, revision = [], None
            items = items if isinstance(items, list) else []
            changed = change(items)
            if changed is None:
                return
            await create_or_update(kv, key, {"actions": bounded_actions(changed)}, revision)
            return
        except CasConflict:  # another replica wrote at the same moment: read again
            continue
        except Exception as exc:
            raise StreamError(f"cannot record the action on {job}: {exc!r}") from exc
    raise StreamError(f"cannot record the action on {job}: {COMMAND_CAS_TRIES} conflicting writes")


async def record_action(kv: KeyValue, job: str, entry: dict[str, Any]) -> None:
    """Append `entry` to ``actions.<job>``; StreamError when it cannot."""
    await _change(kv, job, lambda items: [*items, entry])


async def drop_action(kv: KeyValue, job: str, entry_id: str) -> None:
    """Take the entry `entry_id` out again (its act was not done); StreamError."""

    def without(items: list[Any]) -> list[Any] | None:
        kept = [i for i in items if not (isinstance(i, dict) and i.get("id") == entry_id)]
        return kept if len(kept) != len(items) else None

    await _change(kv, job, without)


async def complete_action(kv: KeyValue, job: str, entry_id: str, detail: str) -> None:
    """Set the detail of entry `entry_id` to what the act found; StreamError."""

    def with_detail(items: list[Any]) -> list[Any] | None:
        if not any(isinstance(i, dict) and i.get("id") == entry_id for i in items):
            return None
        return [
            {**i, "detail": detail} if isinstance(i, dict) and i.get("id") == entry_id else i
            for i in items
        ]

    await _change(kv, job, with_detail)


async def pause(kv: KeyValue, job: str, by: str, reason: str, until: str | None) -> dict[str, Any]:
    value: dict[str, Any] = {"by": by, "at": rfc3339(time.time()), "reason": reason}
    if until:
        value["until"] = until
    return (await store_pause(kv, job, value, "overwrite")).value


async def resume(kv: KeyValue, job: str) -> dict[str, Any] | None:
    """Delete ``paused.<job>``; the pause removed, None when it was not paused."""
    try:
        entry = await kv.get(paused_key(job))
    except KeyNotFoundError:
        return None
    await delete_at(kv, paused_key(job), entry.revision)
    try:  # a resumed job starts counting its failures (pause_after) from 0
        await reset_kv(kv, job)
    except Exception as exc:
        log.warning("job %s resumed; its failure count not reset: %r", job, exc)
    return decode(entry.value)


class ManualRuns:
    """Run-now from the page: claim here, trigger here, record, in the background."""

    def __init__(
        self,
        *,
        config: Config,
        jobs: Mapping[str, JobConfig],
        js: JetStreamContext,
        claimer: Claimer,
        trigger: Trigger,
        clock: Clock,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        aftermath: Aftermath | None = None,
    ) -> None:
        self.config = config
        # The job set (sidecar/config/jobset.py): a job of the state bucket runs too.
        self.jobs = jobs
        self.js = js
        self.claimer = claimer
        self.trigger = trigger
        self.clock = clock
        self.spawn = spawn  # the task set of the runs: the drain waits for them
        self.spec = stream_spec(config)
        # Pings, notifications, anomalies, spans of these runs.
        self.aftermath = aftermath

    async def start(self, job_name: str) -> str:
        """Claim a manual run and start it; its run id (the claim's token)."""
        job = self.jobs[job_name]
        slot = self.clock.wall_ms()
        claim = await self.claimer.claim(
            job.name, slot, self.clock.monotonic() + CLAIM_WAIT, manual=True
        )
        if not claim.won:  # a manual msg id is unique: only a broken stream gets here
            raise StreamError(f"manual claim {claim.token} was not stored as ours")
        self.spawn(self._run(job_name, slot, claim.token, claim.seq))
        return claim.token

    async def _run(self, job_name: str, slot: int, token: str, seq: int) -> None:
        job = self.jobs[job_name]
        deadline = self.clock.monotonic() + job.max_late
        after = self.aftermath
        if after is not None:
            after.started(job, token, self.clock.wall())
        result = await self.trigger.fire(job, slot, token, deadline, fence=seq)
        outcome = Outcome(
            kind=SUCCEEDED if result.ok else FAILED,
            job=job.name,
            slot=slot,
            token=token,
            started_at=result.started_at,
            finished_at=result.finished_at,
            trigger=None,  # no X-Anarchon-Trigger was sent; the aftermath infers manual
            sent=True,
            manual=True,
            error=result.error,
            http_status=result.http_status,
            duration=result.duration,
            answer=result.answer,
            content_type=result.content_type,
        )
        # Not counted (a manual run is no slot's run), said, told (sidecar/run/record.py).
        recorder = Recorder(
            self.js, self.spec.name, self.spec.prefix, self.config.instance_id, None, after
        )
        await recorder.record(job, outcome)
