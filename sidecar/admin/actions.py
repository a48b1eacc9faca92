"""What the fleet page and its API do to a job, and the record of each act.

Every act (run-now, pause, resume, skip) is written to the state bucket under
``actions.<job>``: a JSON object ``{"actions": [...]}``, newest last, the last
``ACTIONS_KEPT`` kept, each ``{"at", "by", "action", "from", "via",
"instance", "detail"}``. ``by`` is the token's name (never the token), ``from``
the address the request came from. The key is updated by compare-and-set, so
acts from two replicas at once are both kept. A reference implementation
sharing the stream never reads the state bucket, and nothing of ours reads
``actions.*`` but the page: the claim and result subjects stay exactly as they
were. Every act is also logged at info.

A manual run from the page is claimed, triggered and recorded by the sidecar
that serves the page, like ``anarchon-sidecar run-now`` on that host; it runs
in the background (the answer carries its run id) and the drain on SIGTERM
waits for it like for any run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from sidecar.admin.board import ACTIONS_KEPT
from sidecar.after.health import reset_kv
from sidecar.config.load import Config
from sidecar.core.clock import Clock, rfc3339
from sidecar.core.errors import CasConflict, StreamError
from sidecar.core.wire import FAILED, SUCCEEDED, paused_key
from sidecar.run.claim import Claimer
from sidecar.run.record import Outcome, Recorder
from sidecar.run.trigger import Trigger
from sidecar.store.kv import create_or_update, delete_at, store_pause
from sidecar.store.state import decode
from sidecar.store.stream import stream_spec

if TYPE_CHECKING:
    from sidecar.after.aftermath import Aftermath

log = logging.getLogger("sidecar.actions")

CAS_TRIES = 8
CLAIM_WAIT = 10.0


def actions_key(job: str) -> str:
    return f"actions.{job}"


def actions_of(value: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of an ``actions.<job>`` value, newest first; anything odd dropped."""
    items = value.get("actions")
    if not isinstance(items, list):
        return []
    return [item for item in reversed(items) if isinstance(item, dict)]


async def record_action(kv: KeyValue, job: str, entry: dict[str, Any]) -> None:
    """Append `entry` to ``actions.<job>`` by compare-and-set; StreamError when it cannot."""
    key = actions_key(job)
    for _ in range(CAS_TRIES):
        try:
            try:
                current = await kv.get(key)
                items = decode(current.value).get("actions")
                revision: int | None = int(current.revision or 0)
            except KeyNotFoundError:
                items, revision = [], None
            items = [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []
            items = [*items, entry][-ACTIONS_KEPT:]
            await create_or_update(kv, key, {"actions": items}, revision)
            return
        except CasConflict:  # another replica wrote at the same moment: read again
            continue
        except Exception as exc:
            raise StreamError(f"cannot record the action on {job}: {exc!r}") from exc
    raise StreamError(f"cannot record the action on {job}: {CAS_TRIES} conflicting writes")


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
        config: Config,
        js: JetStreamContext,
        claimer: Claimer,
        trigger: Trigger,
        clock: Clock,
        track: Callable[[asyncio.Task[None]], None],
    ) -> None:
        self.config = config
        self.js = js
        self.claimer = claimer
        self.trigger = trigger
        self.clock = clock
        self.track = track
        self.spec = stream_spec(config)
        # Pings, notifications, anomalies, spans of these runs (set by the daemon).
        self.aftermath: Aftermath | None = None

    async def start(self, job_name: str) -> str:
        """Claim a manual run and start it; its run id (the claim's token)."""
        job = self.config.job(job_name)
        slot = self.clock.wall_ms()
        claim = await self.claimer.claim(
            job.name, slot, self.clock.monotonic() + CLAIM_WAIT, manual=True
        )
        if not claim.won:  # a manual msg id is unique: only a broken stream gets here
            raise StreamError(f"manual claim {claim.token} was not stored as ours")
        task = asyncio.create_task(self._run(job_name, slot, claim.token, claim.seq))
        self.track(task)
        return claim.token

    async def _run(self, job_name: str, slot: int, token: str, seq: int) -> None:
        job = self.config.job(job_name)
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
        )
        # Not counted (a manual run is no slot's run), said, told (sidecar/run/record.py).
        recorder = Recorder(
            self.js, self.spec.name, self.spec.prefix, self.config.instance_id, None, after
        )
        await recorder.record(job, outcome)
