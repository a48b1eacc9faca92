"""Backfill: past slots of a job run once by the fleet, one at a time (``backfill.<job>``).

``anarchon-sidecar backfill JOB --from T --to T`` (and ``resume --catchup``)
stores the slots to run in the state bucket key ``backfill.<job>``::

    {"pending": [<slot ms>, ...], "running": null | {"slot", "instance", "at"},
     "tag": "b" | "b<n>", "trigger": "backfill" | "catchup", "by", "at", "done": N}

Every sidecar watches it. While nothing is running, any of them takes the
lowest pending slot by a compare-and-set that moves it to ``running`` (so
exactly one takes it), claims it with ``Nats-Msg-Id: <job>:<slot>:<tag>``
(``<job>:<slot>:b`` for a plain backfill: never the scheduled claim's id)
and runs it like any won slot (lease, trigger ``backfill``, result), then
clears ``running``. So the fleet, not the CLI, runs them; one at a time per
job; and a sidecar that dies while running one leaves it to be noticed: its
``instance.<id>`` key expires, another sidecar clears ``running`` (the run
is lost, as any run of a dead runner, not repeated) and goes on; a taker that
died between its claim and its lease is judged as a slot's winner and its run
recorded lost once (sidecar/run/backfilllost.py).

A catch-up slot (``resume --catchup``) is run only when its fate allows it,
settled first if a late skip record may still come (sidecar/run/catchupfate.py).

The CLI leaves out slots that already have a backfill claim in the stream
(the same backfill asked again runs nothing again); ``--again`` uses a new
tag, hence new claim ids, and runs them anew.

The key is input like any other (SECURITY.md): before a slot is taken the
whole value is checked (sidecar/run/backfillcheck.py); one the command would not
write is counted (``anarchon_hostile_input_total{what="backfill_key"}``),
logged once, deleted, and nothing of it is run.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from sidecar.core import failpoints
from sidecar.core.backoff import Backoff
from sidecar.core.bounds import slot_ms
from sidecar.core.clock import parse_rfc3339, rfc3339
from sidecar.core.errors import CasConflict
from sidecar.core.wire import instance_key
from sidecar.run.backfillcheck import MAX_SLOTS, HostileBackfill, check_backfill, decode_backfill
from sidecar.run.catchupfate import CatchUpFate, claims_of, fate_verdict
from sidecar.store.kv import create_or_update, delete_at

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from sidecar.config.load import JobConfig
    from sidecar.run.claim import Claim
    from sidecar.run.context import Context
    from sidecar.run.skips import SkipRecorder

log = logging.getLogger(__name__)

# A running entry whose instance has left the fleet is cleared after this long.
STALE_AFTER = 20.0
RECHECK_EVERY = 5.0
# The wait before reading the key again after losing a compare-and-set (mean, s).
CONTENDED_WAIT = 0.125


def backfill_key(job: str) -> str:
    return f"backfill.{job}"


def claim_id(job: str, slot: int, tag: str) -> str:
    """``<job>:<slot>:b`` (a plain backfill), ``<job>:<slot>:b<n>`` (``--again``)."""
    return f"{job}:{slot}:{tag}"


def backfilled_slots(messages: list[tuple[int, str, bytes]], prefix: str, job: str) -> set[int]:
    """Slots with a backfill claim of the plain tag in the job's stored messages."""
    return {slot for slot, data in claims_of(messages, prefix, job) if data.get("backfill") == "b"}


def slot_list(value: dict[str, Any] | None, name: str = "pending") -> list[int]:
    """The slots of `value` (a ``backfill.<job>``), in range only: whatever else the
    key holds, what is shown or counted of it can be formatted."""
    items = value.get(name) if isinstance(value, dict) else None
    if not isinstance(items, list):
        return []
    return sorted({s for s in items if slot_ms(s) is not None})


def running_of(value: dict[str, Any] | None) -> dict[str, Any] | None:
    run = value.get("running") if isinstance(value, dict) else None
    return run if isinstance(run, dict) and slot_ms(run.get("slot")) is not None else None


def done_of(value: dict[str, Any] | None) -> int:
    """How many slots the backfill ran (0 for anything but a count)."""
    done = value.get("done") if isinstance(value, dict) else None
    return done if isinstance(done, int) and not isinstance(done, bool) and done >= 0 else 0


def encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class Backfills:
    """One sidecar's part in the fleet's backfills."""

    def __init__(
        self,
        ctx: Context,
        run: Callable[[JobConfig, Claim, float], Coroutine[Any, Any, None]],
        lost: Callable[[JobConfig, Claim], None] | None = None,
        skips: SkipRecorder | None = None,
    ) -> None:
        self.config = ctx.config
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.claimer = ctx.claimer
        self.fleet = ctx.fleet
        self.run = run
        # The claim-window judge (claimwindow.py lost_claim): a stale taker's claim.
        self.lost = lost
        # resume --catchup: whether a slot may be caught up (sidecar/run/catchupfate.py);
        # `skips` publishes the skip record that settles a slot's fate first.
        self.fate = CatchUpFate(ctx, skips)
        self.spawn = ctx.tasks.spawn
        self.stopping = ctx.stopping
        self._jobs = ctx.jobs
        self._busy: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # Hostile values said already, by (key, revision): said once, however often seen.
        self._refused: set[tuple[str, int]] = set()

    def changed(self, key: str) -> None:
        """A key the watch delivered ("" after a re-sync: look at every job)."""
        if key == "":
            names = [
                k[len("backfill.") :] for k in self.fleet.view.keys if k.startswith("backfill.")
            ]
        elif key.startswith("backfill."):
            names = [key[len("backfill.") :]]
        else:
            return
        for name in names:
            job = self._jobs.get(name)
            if job is not None:
                self._gauge(name)
                self.poke(job)

    def poke(self, job: JobConfig) -> None:
        if job.name not in self._busy and not self.stopping.is_set():
            self._busy.add(job.name)
            self.spawn(self._step(job))

    def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()

    def _gauge(self, name: str) -> None:
        entry = self.fleet.view.keys.get(backfill_key(name))
        value = entry.value if entry is not None else None
        left = len(slot_list(value)) + (1 if running_of(value) else 0)
        self.metrics.job_backfill_pending.labels(job=name).set(left)

    def _later(self, job: JobConfig) -> None:
        old = self._timers.pop(job.name, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[job.name] = loop.call_later(RECHECK_EVERY, self.poke, job)

    async def _step(self, job: JobConfig) -> None:
        try:
            await self._work(job)
        except Exception:  # a bug must not stop the watch; the next change retries
            log.exception("job %s: backfill step failed", job.name)
            self._later(job)
        finally:
            self._busy.discard(job.name)

    async def _work(self, job: JobConfig) -> None:
        bucket = self.fleet.bucket
        if bucket is None:
            return
        kv = bucket.kv
        key = backfill_key(job.name)
        me = self.config.instance_id
        # Another sidecar changed the key between our read and our write: read again
        # after a short random wait (0.05 to 0.2 s), so that the racers spread out.
        contended = Backoff(start=CONTENDED_WAIT, cap=CONTENDED_WAIT, jitter=0.6)
        while not self.stopping.is_set():
            try:  # read, not the view: it may not show our own last write yet
                entry = await kv.get(key)
            except Exception:  # gone (done or cancelled), or NATS away: the watch tells
                return
            revision = int(entry.revision or 0)
            try:
                value = decode_backfill(entry.value)
                check_backfill(job, value, self.clock.wall())
            except HostileBackfill as exc:
                await self._hostile(kv, key, revision, str(exc))
                return
            pending = slot_list(value)
            running = running_of(value)
            if running is not None:
                if not self._stale(running, me):
                    self._later(job)  # someone runs one; look again if it never ends
                    return
                log.warning(
                    "job %s: backfill of slot %s was taken by %s, which left the fleet or "
                    "restarted; that slot is not run again, the backfill goes on",
                    job.name,
                    rfc3339(running["slot"] / 1000),
                    running.get("instance"),
                )
                if not await self._cas(kv, key, {**value, "running": None}, revision):
                    await contended.sleep()
                elif self.lost is not None:  # died before its lease? (backfilllost.py)
                    from sidecar.run.backfilllost import judge_taken

                    tag = str(value.get("tag") or "b")
                    self.spawn(judge_taken(self.claimer, job, running, tag, self.lost))
                continue
            if not pending:
                if running is None:
                    # Done: the key goes, so that status shows nothing pending.
                    try:
                        await delete_at(kv, key, revision)
                    except Exception as exc:  # someone added more, or deleted it: fine
                        log.debug("backfill key %s kept: %r", key, exc)
                    log.info("job %s: backfill done (%d slot(s))", job.name, done_of(value))
                return
            slot = pending[0]
            if slot > self.clock.wall_ms():  # written by a clock a little ahead: not yet
                self._later(job)
                return
            taken = {
                **value,
                "pending": pending[1:],
                "running": {"slot": slot, "instance": me, "at": rfc3339(self.clock.wall())},
            }
            if not await self._cas(kv, key, taken, revision):
                await contended.sleep()  # another took it
                continue
            if not await self._run_one(job, slot, str(value.get("tag") or "b"), value):
                await self._give_back(kv, key, slot)
                return
            await self._finish(kv, key, slot)

    async def _hostile(self, kv: KeyValue, key: str, revision: int, why: str) -> None:
        """A value the command would not write: counted, said once, deleted; nothing run."""
        if (key, revision) in self._refused:
            return
        if len(self._refused) >= 1000:
            self._refused.clear()
        self._refused.add((key, revision))
        self.metrics.hostile_input_total.labels(what="backfill_key").inc()
        log.error(
            "state bucket: %s refused: %s; it is hostile input (the backfill command does not "
            "write it; whoever may write the state bucket did) and is deleted, nothing of it "
            "is run",
            key[:200],
            why,
        )
        try:
            await delete_at(kv, key, revision)
        except Exception as exc:  # another sidecar deleted it first, or it changed
            log.debug("backfill key %s not deleted: %r", key, exc)

    def _stale(self, running: dict[str, Any], me: str) -> bool:
        holder = running.get("instance")
        if holder == me:
            return True  # ours from before a restart: this step is the only one here
        # Alive: its presence key is in the view (a look-up, not a walk of every key:
        # this runs on every other sidecar at each step of a backfill).
        if isinstance(holder, str) and instance_key(holder) in self.fleet.view.keys:
            return False
        at = running.get("at")
        try:
            age = self.clock.wall() - parse_rfc3339(at) if isinstance(at, str) else STALE_AFTER
        except ValueError:
            age = STALE_AFTER
        return age >= STALE_AFTER

    async def _run_one(self, job: JobConfig, slot: int, tag: str, value: dict[str, Any]) -> bool:
        """Run `slot` unless its fate forbids it; False: nothing of it was claimed and the
        sidecar stops, the slot is given back to the fleet (``_give_back``)."""
        trigger = (
            value.get("trigger") if value.get("trigger") in ("backfill", "catchup") else "backfill"
        )
        if trigger == "catchup" and (why := await self.fate.refused(job, slot)) is not None:
            if self.stopping.is_set():
                # Its wait may last minutes (catchupfate.py): a rolling update must not
                # drop the slot; no claim of it was made, so another sidecar may run it.
                log.info(
                    "job %s: catch-up of slot %s left to the fleet: %s",
                    job.name,
                    rfc3339(slot / 1000),
                    why,
                )
                return False
            log.info("job %s: slot %s not caught up: %s", job.name, rfc3339(slot / 1000), why)
            return True
        deadline = self.clock.monotonic() + job.max_late
        claim = await self.claimer.claim(
            job.name,
            slot,
            deadline,
            msg_id=claim_id(job.name, slot, tag),
            extra={"backfill": tag},
            trigger=str(trigger),
        )
        if not claim.won:
            log.info("job %s: backfill of %s was run already", job.name, rfc3339(slot / 1000))
            return True
        self.metrics.claims_won_total.labels(job=job.name).inc()
        if failpoints.ENABLED:
            await failpoints.hit("claim.won")
        log.info("job %s: backfill runs slot %s", job.name, rfc3339(slot / 1000))
        await self.run(job, claim, self.clock.wall())
        return True

    async def _finish(self, kv: KeyValue, key: str, slot: int) -> None:
        for _ in range(10):
            try:
                entry = await kv.get(key)
            except Exception:
                return  # cancelled meanwhile
            try:
                value = decode_backfill(entry.value)
            except HostileBackfill:
                return  # the next step says so
            running = running_of(value)
            if running is None or running["slot"] != slot:
                return
            value = {**value, "running": None, "done": done_of(value) + 1}
            if await self._cas(kv, key, value, int(entry.revision or 0)):
                return
        log.warning("backfill key %s not updated after slot %s", key, slot)

    async def _give_back(self, kv: KeyValue, key: str, slot: int) -> None:
        """`slot`, taken by this sidecar and not claimed, back first among the pending
        slots for another sidecar (this one stops)."""
        for _ in range(10):
            try:
                entry = await kv.get(key)
                value = decode_backfill(entry.value)
            except Exception:
                return  # cancelled meanwhile, NATS away (its entry goes stale), or hostile
            running = running_of(value)
            if running is None or running["slot"] != slot:
                return
            pending = sorted({slot, *slot_list(value)})
            value = {**value, "pending": pending, "running": None}
            if await self._cas(kv, key, value, int(entry.revision or 0)):
                return
        log.warning("backfill key %s: slot %s not given back", key, slot)

    async def _cas(self, kv: KeyValue, key: str, value: dict[str, Any], revision: int) -> bool:
        try:
            await create_or_update(kv, key, encode(value), revision)
        except CasConflict:
            return False
        return True


__all__ = [
    "MAX_SLOTS",
    "Backfills",
    "backfill_key",
    "backfilled_slots",
    "claim_id",
    "done_of",
    "fate_verdict",
]
