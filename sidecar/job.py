"""A job's life: wait for its slot, check it may be claimed, claim, run, record.

``Jobs.loop`` runs one job's schedule top-down: sleep until the slot plus a
random jitter in [0, jitter]; skip it (counted) when the claim would start
more than max_late after its time, or when the stream guard says the stream
cannot hold the claim; claim it; if won, take its lease (sidecar/lease.py),
trigger the app in a task of its own (tracked in ``runs`` for the drain),
publish the result, release the lease, and make the next attempt due when
the run failed and ``retry`` allows one.

Attempts after the first come from ``due.<job>.<slot>.<attempt>`` keys, which
every sidecar watches: each competes for the attempt at its due time plus
jitter (the replica whose app failed the previous one a little later), with
the attempt's own claim id, inside its own window (due time + max_late).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Coroutine
from typing import Any

from nats.js import JetStreamContext

from sidecar import failpoints
from sidecar.aftermath import Aftermath
from sidecar.backfill import Backfills
from sidecar.bounds import slot_ms
from sidecar.bucketcheck import needs_leases
from sidecar.candidates import Candidates
from sidecar.claim import Claim, ClaimDisconnected, Claimer, ClaimForeign
from sidecar.clock import Clock, rfc3339
from sidecar.config import Config, JobConfig
from sidecar.due import (
    LOST,
    RETRY,
    DueKey,
    due_key,
    failed_replica_wait,
    lock_key,
    may_follow,
    parse_due_key,
    retry_due_at,
    run_key,
)
from sidecar.duecheck import Backed, Hostile, backing, config_problem
from sidecar.errors import ClaimError
from sidecar.fleet import Fleet
from sidecar.guard import REPEAT_LOG, StreamGuard
from sidecar.lease import RUN_LEASE_WAIT, KeyHeld, Keys, Lease, LostRuns, make_due
from sidecar.metrics import Metrics
from sidecar.ratelog import RateLimitedLog
from sidecar.runs import (
    SKIPPED,
    ResultRecord,
    last_messages,
    last_scheduled_slot,
    publish_result,
)
from sidecar.since import floor_ms, settle, since_key
from sidecar.skips import EXCLUDED, PAUSED, SkipRecorder
from sidecar.trigger import CATCHUP, RERUN, SCHEDULED, Trigger, TriggerResult, Why, why_of
from sidecar.trigger import RETRY as RETRY_TRIGGER

log = logging.getLogger(__name__)

# At most this many late slots are walked one by one after a stall.
MAX_LATE_WALK = 10_000
# catchup: all claims at most this many missed slots of a job at once.
MAX_CATCHUP = 100
# asyncio's timers fire up to a millisecond late (the epoll timeout is rounded
# up to whole milliseconds), plus the time an idle CPU takes to wake: about
# 1.5 ms at p50 here. A slot's timer is set this much early and the rest is
# slept precisely, blocking the loop for at most this long once per due instant.
PRECISE_WAKE = 0.002


def _secret(trigger: Trigger) -> bytes | None:
    """The current signing secret: webhooks are signed like triggers."""
    signer = getattr(trigger, "signer", None)  # tests drive Jobs without a trigger
    return signer.secrets[0] if signer is not None else None


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Jobs:
    """The job loops of one sidecar and the runs they started."""

    def __init__(
        self,
        config: Config,
        metrics: Metrics,
        clock: Clock,
        js: JetStreamContext,
        claimer: Claimer,
        trigger: Trigger,
        guard: StreamGuard,
        fleet: Fleet,
        connected: asyncio.Event,
        stopping: asyncio.Event,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.js = js
        self.claimer = claimer
        self.trigger = trigger
        self.guard = guard
        self.fleet = fleet
        # Per job: the slot its loop handles next; catch-up claims only before it.
        self._next: dict[str, int] = {}
        # Per job: (slot, the schedule's slot before it), computed before the slot's time.
        self._previous: dict[str, tuple[int, int | None]] = {}
        self.spec = guard.spec
        self.connected = connected
        self.stopping = stopping
        self.runs: set[asyncio.Task[None]] = set()
        self._sleepers: set[asyncio.Future[None]] = set()  # loops in sleep_until
        self._skip_logged: dict[str, float] = {}
        self.warnings = RateLimitedLog(log)
        self.side_tasks: set[asyncio.Task[None]] = set()  # catch-up, due attempts
        self._by_name = {job.name: job for job in config.jobs}
        self._keys: Keys | None = None
        self._due: set[str] = set()  # due keys this sidecar waits for
        self._refused: set[tuple[str, int]] = set()  # hostile due keys (key, revision) said
        self.lost = LostRuns(config, metrics, clock, js, self.spec, self.keys)
        self.skips = SkipRecorder(
            claimer, metrics, clock, config.instance_id, self.spec.name, self.spec.prefix
        )
        self.backfills = Backfills(
            config, metrics, clock, claimer, fleet, self._run_tracked, self._spawn, stopping
        )
        fleet.key_listeners.append(self.backfills.changed)
        self.lost.judges_foreign = fleet.orphans.judges
        self.lost.view = fleet.view  # leases of a replaced bucket are looked for again
        # Pings, notifications, auto-pause, anomalies, spans (sidecar/aftermath.py).
        self.aftermath = Aftermath(config, metrics, clock, self.keys, _secret(trigger), fleet)
        self.lost.after = self.aftermath.after_outcome
        fleet.removal_listeners.append(self.lost.removed)
        fleet.key_listeners.append(self.due_changed)
        # claim.candidates: only k instances claim a slot at its time (sidecar/candidates.py).
        self.candidates = Candidates(
            config.instance_id,
            metrics,
            clock,
            fleet,
            self._spawn,
            self.sleep_until,
            lambda job, slot: self.attempt(job, slot, self.clock.wall(), deferred=True),
        )

    def keys(self) -> Keys | None:
        """The state bucket's key writer; None while unknown or unfit for leases."""
        bucket = self.fleet.bucket
        if not self.fleet.leases_ok or bucket is None:
            return None
        if self._keys is None:
            self._keys = Keys(bucket, self.fleet.denied)
        return self._keys

    def wake(self) -> None:
        """Wake every sleeping loop (on stop)."""
        for waiter in self._sleepers:
            _wake(waiter)

    async def sleep_until(self, wall: float) -> bool:
        """Sleep until wall-clock time `wall`; True when stopping interrupted it."""
        loop = asyncio.get_running_loop()
        while True:
            delay = wall - self.clock.wall()
            if delay <= 0:
                return self.stopping.is_set()
            if self.stopping.is_set():
                return True
            if delay <= PRECISE_WAKE:
                # Never early: the first job due at this instant sleeps the rest
                # (to about 0.1 ms); the others find it past when they run.
                time.sleep(delay)  # noqa: ASYNC251
                continue
            # A bare future woken by a timer or by stop(): wait_for on the event
            # started a task per sleep, and with every job due at the same
            # instant that cost each one about twice the CPU and made it later.
            # Short hops keep long sleeps honest when the wall clock is corrected.
            waiter: asyncio.Future[None] = loop.create_future()
            timer = loop.call_later(min(delay - PRECISE_WAKE, 30.0), _wake, waiter)
            self._sleepers.add(waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._sleepers.discard(waiter)
            if self.stopping.is_set():
                return True

    async def loop(self, job: JobConfig) -> None:
        """The job's schedule until stopping: wait, check, claim, run each slot."""
        m = self.metrics
        name = job.name
        slot = job.schedule.next_slot(self.clock.wall_ms())
        self._next[name] = slot
        previous = job.schedule.previous_slot(slot)
        if job.catchup != "none":
            self._spawn(self.catch_up(job))
        while not self.stopping.is_set():
            self._next[name] = slot
            # X-Anarchon-Previous-Scheduled-At, known before the slot's time.
            self._previous[name] = (slot, previous)
            m.job_next_run_timestamp_seconds.labels(job=name).set(slot / 1000)
            fire_at = slot / 1000 + random.uniform(0.0, job.jitter)
            if await self.sleep_until(fire_at):
                if self.clock.wall() >= slot / 1000:
                    m.claims_skipped_total.labels(job=name, reason="shutdown").inc()
                return
            now = self.clock.wall()
            if now - slot / 1000 > job.max_late:
                slot = self._skip_late(job, slot, now)
                previous = job.schedule.previous_slot(slot)
                continue
            await self.attempt(job, slot, now)
            previous, slot = slot, job.schedule.next_slot(slot)

    async def attempt(
        self,
        job: JobConfig,
        slot: int,
        now: float,
        number: int = 1,
        due_at: float | None = None,
        trigger: str = SCHEDULED,
        deferred: bool = False,
    ) -> None:
        """Claim attempt `number` of `slot` unless something forbids it now; run it when won.

        Attempt 1 is due at the slot's time, a later one at `due_at`; either
        is claimed only within max_late of that.
        """
        m = self.metrics
        name = job.name
        if why := self.guard.blocked(job, slot):
            self._skip(job, slot, "stream", why)
            return
        if number == 1 and (excluded := job.schedule.excluded(slot)) is not None:
            self._skip_recorded(job, slot, EXCLUDED, f"excluded: {excluded.text}")
            return
        if blocked := self.fleet.blocked(name):
            if blocked[0] == PAUSED and number == 1:
                self._skip_recorded(job, slot, *blocked)
            else:
                self._skip(job, slot, *blocked)
            return
        if number == 1 and (skipped := self.fleet.skipped(name, slot)) is not None:
            self._skip_recorded(job, slot, *skipped)
            return
        if not deferred and self.candidates.defer(job, slot, number, trigger):
            return  # not a candidate: claimed after claim.fallback unless its run is seen
        start = slot / 1000 if due_at is None else due_at
        deadline = self.clock.monotonic() + (start + job.max_late - now)
        try:
            claim = await self.claimer.claim(name, slot, deadline, attempt=number, trigger=trigger)
        except asyncio.CancelledError:
            m.claims_skipped_total.labels(job=name, reason="shutdown").inc()
            raise
        except ClaimForeign as exc:
            self._skip(job, slot, "stream", str(exc))
        except ClaimDisconnected as exc:
            m.claims_skipped_total.labels(job=name, reason="disconnected").inc()
            # Once a minute a job while NATS is away, with the count; all said on reconnect.
            self.warnings.warning(
                f"disconnected:{name}",
                "job %s slot %s skipped: %s",
                name,
                rfc3339(slot / 1000),
                exc,
            )
        except ClaimError as exc:
            m.claim_errors_total.labels(job=name).inc()
            log.warning("job %s slot %s not claimed: %s", name, rfc3339(slot / 1000), exc)
        except Exception:  # a bug must not stop the job's schedule; nothing ran
            m.claim_errors_total.labels(job=name).inc()
            log.exception("job %s slot %s: claim failed unexpectedly", name, slot)
        else:
            if claim.won:
                if failpoints.ENABLED:
                    await failpoints.hit("claim.won")
                if number > 1:
                    self._spawn(self._drop_due(due_key(name, slot, number)))
                self._start_run(job, claim, start)
            self._count_claim(claim)
            if claim.won:
                # Let the trigger reach the app before this loop computes the
                # next slot and sets its timer: about 0.2 ms of its start delay.
                await asyncio.sleep(0)

    # ------------------------------------------------------------------ due attempts

    def due_changed(self, key: str) -> None:
        """A key the watch delivered: a new ``due.*`` key of ours is checked, then waited for."""
        if not key.startswith("due.") or key in self._due or self.stopping.is_set():
            return
        entry = self.fleet.view.keys.get(key)
        parsed = parse_due_key(key)
        job = self._by_name.get(parsed.job if parsed else key.split(".")[1])
        if job is None or entry is None:
            return  # not one of our jobs (another fleet may share the bucket), or gone
        if (key, entry.revision) in self._refused:
            return  # said once already (its delete may have failed)
        self._due.add(key)
        if parsed is None:
            why = "not a due key: due.<job>.<slot>.<attempt> with an attempt of 2 or more"
            self._spawn(self._hostile_due(key, entry.revision, why))
            return
        self._spawn(self._due_attempt(job, parsed, key, entry.value, entry.revision))

    async def _due_attempt(
        self, job: JobConfig, due: DueKey, key: str, value: dict[str, Any], revision: int
    ) -> None:
        """Check a due attempt (sidecar/duecheck.py), then compete for it at its time
        (plus jitter; later where it failed)."""
        try:
            backed = await self._backed(job, due, key, value, revision)
            if backed is None:
                return
            due_at = backed.due_at
            wake = due_at + random.uniform(0.0, job.jitter)
            if backed.reason == RETRY and value.get("instance") == self.config.instance_id:
                wake += failed_replica_wait(job.jitter)
            if await self.sleep_until(wake):
                return
            if key not in self.fleet.view.keys:
                return  # claimed (its winner deleted the key) or expired
            now = self.clock.wall()
            if now - due_at > job.max_late:
                self.metrics.claims_skipped_total.labels(job=job.name, reason="late").inc()
                log.warning(
                    "job %s slot %s: attempt %d skipped, later than max_late %gs",
                    job.name,
                    rfc3339(due.slot / 1000),
                    due.attempt,
                    job.max_late,
                )
                return
            trigger = RERUN if backed.reason == LOST else RETRY_TRIGGER
            await self.attempt(job, due.slot, now, due.attempt, due_at, trigger)
        finally:
            self._due.discard(key)

    async def _backed(
        self, job: JobConfig, due: DueKey, key: str, value: dict[str, Any], revision: int
    ) -> Backed | None:
        """The due attempt as the config and the stream back it; None when they do not
        (a hostile key: counted, logged, deleted) or the stream did not answer."""
        why = config_problem(job, due, self.clock.wall())
        if why is None:
            for tries in range(3):
                try:
                    return await backing(self.js, self.spec, job, due, value)
                except Hostile as exc:
                    why = str(exc)
                    break
                except Exception as exc:  # no answer: nothing judged, the key is left
                    if tries == 2 or self.stopping.is_set():
                        log.warning(
                            "due key %s not checked (the stream did not answer): %r", key, exc
                        )
                        return None
                    await asyncio.sleep(0.5)
        if why is not None:
            await self._hostile_due(key, revision, why)
        return None

    async def _hostile_due(self, key: str, revision: int, why: str) -> None:
        """A due key the config and the stream do not back: counted, said once, deleted."""
        try:
            if len(self._refused) >= 1000:
                self._refused.clear()
            self._refused.add((key, revision))
            self.metrics.hostile_input_total.labels(what="due_key").inc()
            log.error(
                "state bucket: due key %s refused: %s; it is hostile input (whoever may write "
                "the state bucket wrote it) and is deleted, nothing is claimed",
                key[:200],
                why,
            )
            keys = self.keys()
            if keys is not None:
                with contextlib.suppress(Exception):  # another sidecar deleted it first
                    await keys.delete(key, revision)
        finally:
            self._due.discard(key)

    async def _drop_due(self, key: str) -> None:
        """The attempt is claimed: its due key is no longer needed by anyone."""
        keys = self.keys()
        entry = self.fleet.view.keys.get(key)
        if keys is None:
            return
        try:
            await keys.delete(key, entry.revision if entry is not None else None)
        except Exception as exc:  # it expires on its own
            log.debug("due key %s not deleted: %r", key, exc)

    # ------------------------------------------------------------------ catch-up

    def reconnected(self) -> None:
        """After a reconnect, look again for slots nobody claimed (jobs with catch-up)."""
        self.warnings.clear_prefix("disconnected:")
        if self.stopping.is_set():
            return
        for job in self.config.jobs:
            if job.catchup != "none":
                self._spawn(self.catch_up(job))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self.side_tasks.add(task)
        task.add_done_callback(self._side_done)

    def _side_done(self, task: asyncio.Task[None]) -> None:
        self.side_tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("a catch-up or due-attempt task failed", exc_info=exc)

    async def catch_up(self, job: JobConfig) -> None:
        """Claim the slots of the last max_late that nobody claimed (FLEET.md catch-up).

        Only slots before the one the loop handles next, and only those whose
        claim can still be made in time. When the job's newest claim is for the
        newest of them, nothing was missed: one read, no claim. Otherwise the
        newest missed slot (``latest``) or each of them (``all``, at most
        MAX_CATCHUP) is claimed with its usual id, so a slot that did run is a
        duplicate and does not run again.
        """
        now = self.clock.wall()
        first = self._next.get(job.name, job.schedule.next_slot(self.clock.wall_ms()))
        candidates: list[int] = []
        slot = job.schedule.next_slot(int((now - job.max_late) * 1000))
        while slot < first and slot <= now * 1000 and len(candidates) < 10 * MAX_CATCHUP:
            candidates.append(slot)
            slot = job.schedule.next_slot(slot)
        if not candidates:
            return
        # The stream check and the state bucket must have been read first.
        wait = candidates[0] / 1000 + job.max_late - now
        ready = await self._wait_ready(wait)
        if not ready or self.stopping.is_set():
            return
        # Never before a resume, a timed pause's end or a schedule change (since.py).
        floor = await self._catchup_floor(job)
        candidates = [s for s in candidates if s >= floor]
        if not candidates:
            return
        try:
            messages = await last_messages(self.js, self.spec.name, self.spec.prefix, job.name)
        except Exception as exc:  # no answer: claim them all; duplicates do not run
            log.debug("catch-up of %s: reading its last claim failed: %r", job.name, exc)
            messages = []
        last = last_scheduled_slot(messages, self.spec.prefix, job.name)
        missed = [s for s in candidates if last is None or s > last]
        if not missed:
            return
        chosen = missed[-1:] if job.catchup == "latest" else missed[-MAX_CATCHUP:]
        log.info(
            "job %s: catching up %d missed slot(s) of the last %gs (catchup: %s)",
            job.name,
            len(chosen),
            job.max_late,
            job.catchup,
        )
        for slot in chosen:
            now = self.clock.wall()
            if now - slot / 1000 > job.max_late or self.stopping.is_set():
                continue
            await self.attempt(job, slot, now, trigger=CATCHUP)

    async def _catchup_floor(self, job: JobConfig) -> int:
        bucket = self.fleet.bucket
        entry = self.fleet.view.keys.get(since_key(job.name))
        since = entry.value if entry is not None else None
        now_ms = self.clock.wall_ms()
        if bucket is not None:
            try:
                since = await settle(
                    bucket.kv, job, since, entry.revision if entry else None, now_ms
                )
            except Exception as exc:  # NATS away: the bound as last read
                log.warning("job %s: %s not updated: %r", job.name, since_key(job.name), exc)
        paused = self.fleet.view.paused(job.name)
        return floor_ms(since, paused.value if paused is not None else None, now_ms)

    async def _wait_ready(self, timeout: float) -> bool:
        deadline = self.clock.monotonic() + max(0.0, timeout)
        while not (self.guard.stream_ready and self.fleet.view.synced):
            if self.clock.monotonic() > deadline or self.stopping.is_set():
                return False
            await asyncio.sleep(0.05)
        return True

    def _skip_late(self, job: JobConfig, slot: int, now: float) -> int:
        """Count every slot whose claim can no longer start in time; return the next one."""
        skipped = 0
        while now - slot / 1000 > job.max_late and skipped < MAX_LATE_WALK:
            skipped += 1
            slot = job.schedule.next_slot(slot)
        if skipped >= MAX_LATE_WALK:
            slot = job.schedule.next_slot(int((now - job.max_late) * 1000))
        # Late because NATS was away: say so, it is what the operator must fix.
        reason = "late" if self.connected.is_set() else "disconnected"
        self.metrics.claims_skipped_total.labels(job=job.name, reason=reason).inc(skipped)
        log.warning(
            "job %s: %d slot(s) skipped, later than max_late %gs%s",
            job.name,
            skipped,
            job.max_late,
            "" if reason == "late" else " while disconnected from NATS",
        )
        return slot

    def _skip(self, job: JobConfig, slot: int, reason: str, why: str) -> None:
        """A slot not claimed (stream, paused): counted, said at most once a minute a job."""
        self.metrics.claims_skipped_total.labels(job=job.name, reason=reason).inc()
        now = self.clock.monotonic()
        last = self._skip_logged.get(job.name)
        if last is None or now - last > REPEAT_LOG:
            self._skip_logged[job.name] = now
            log.warning("job %s slot %s skipped: %s", job.name, rfc3339(slot / 1000), why)

    def _skip_recorded(self, job: JobConfig, slot: int, reason: str, why: str) -> None:
        """A slot kept from running (excluded, skip, paused): counted, and recorded
        ``skipped`` in the stream once for the fleet (sidecar/skips.py)."""
        now = self.clock.monotonic()
        last = self._skip_logged.get(job.name)
        if last is None or now - last > REPEAT_LOG:
            self._skip_logged[job.name] = now
            log.warning("job %s slot %s skipped: %s", job.name, rfc3339(slot / 1000), why)
        self._spawn(self._record_skip(job, slot, reason, why))

    async def _record_skip(self, job: JobConfig, slot: int, reason: str, why: str) -> None:
        await self.skips.record(job, slot, reason, why)

    def _count_claim(self, claim: Claim) -> None:
        m = self.metrics
        m.claim_ack_seconds.labels(job=claim.job).observe(claim.ack_seconds)
        if claim.duplicate_acks:
            m.claim_duplicate_acks_total.labels(job=claim.job).inc(claim.duplicate_acks)
        if claim.won:
            m.claims_won_total.labels(job=claim.job).inc()
            log.debug("job %s slot %s won (seq %d)", claim.job, claim.slot, claim.seq)
        else:
            m.claims_lost_total.labels(job=claim.job).inc()
            log.debug("job %s slot %s lost (seq %d)", claim.job, claim.slot, claim.seq)

    def _start_run(self, job: JobConfig, claim: Claim, start: float) -> None:
        task = asyncio.create_task(self._guarded_run(job, claim, start))
        self.runs.add(task)
        task.add_done_callback(self.runs.discard)

    async def _run_tracked(self, job: JobConfig, claim: Claim, start: float) -> None:
        """A run the drain waits for, awaited (a backfill runs one slot at a time)."""
        task = asyncio.create_task(self._guarded_run(job, claim, start))
        self.runs.add(task)
        task.add_done_callback(self.runs.discard)
        await asyncio.shield(task)

    async def _guarded_run(self, job: JobConfig, claim: Claim, start: float) -> None:
        """``run_slot``; a run that ends with an exception (a bug, hostile input) is logged
        and recorded ``failed`` (once: the result's msg id is the run's), never left
        ``running`` with a "Task exception was never retrieved"."""
        try:
            await self.run_slot(job, claim, start)
        except Exception as exc:
            log.exception("job %s slot %s: the run ended with an error", job.name, claim.slot)
            with contextlib.suppress(Exception):
                await self._record(job, claim, "failed", f"internal error: {exc!r}"[:300])

    async def run_slot(self, job: JobConfig, claim: Claim, start: float) -> None:
        """Hold the run's lease, trigger the app, record the result, release the lease.

        With ``overlap: skip`` the lease is ``lock.<job>``: when it is held, a
        run of the job is alive somewhere and this one is recorded skipped.
        `start` is when the attempt was due (the slot's time for attempt 1).
        """
        deadline = self.clock.monotonic() + max(0.0, start + job.max_late - self.clock.wall())
        keys = self.keys()
        if keys is None and needs_leases(job):
            # The bucket turned unfit (or was replaced) between the check and the
            # claim: never run such a job without its lease (overlap: skip as allow).
            why = self.fleet.bucket_problem or "the state bucket cannot hold leases now"
            await self._skip_won(job, claim, "bucket", f"not run without a lease: {why}")
            return
        async with contextlib.AsyncExitStack() as stack:
            if keys is not None:
                key = (
                    lock_key(job.name)
                    if job.overlap == "skip"
                    else run_key(job.name, claim.slot, claim.attempt)
                )
                value = {
                    "job": job.name,
                    "slot": claim.slot,
                    "attempt": claim.attempt,
                    "token": claim.token,
                    "instance": self.config.instance_id,
                    "started_at": rfc3339(self.clock.wall()),
                    # The claim's sequence: a lost-run check reads the results
                    # stored since, not only the newest (runs may overlap).
                    "fence": claim.seq,
                }
                lease = Lease(
                    keys,
                    key,
                    value,
                    self.config.nats.lease_ttl,
                    self.metrics,
                    self.clock,
                    deadline,
                    self.fleet.view.lock_markers.get(key, 0),
                )
                if job.overlap != "skip":
                    # A run lease only lets the fleet see a dead runner: the run
                    # waits for it a moment at most (lease.RUN_LEASE_WAIT).
                    stack.push_async_exit(lease)
                    wait = min(RUN_LEASE_WAIT, max(0.0, deadline - self.clock.monotonic()) / 2)
                    if not await lease.start(wait):
                        log.warning(
                            "lease %s not created within %.1fs; running, creating it meanwhile",
                            key,
                            wait,
                        )
                    await self._run(job, claim, deadline)
                    return
                try:
                    await stack.enter_async_context(lease)
                except KeyHeld as held:
                    await self._skipped(job, claim, held.value)
                    return
                except Exception as exc:
                    await self._not_run(job, claim, f"{key} not taken: {exc!r}")
                    return
            await self._run(job, claim, deadline)

    async def _run(self, job: JobConfig, claim: Claim, deadline: float) -> None:
        """Trigger the app for a won claim and record the result."""
        m = self.metrics
        slot_time = claim.slot / 1000
        m.runs_in_progress.labels(job=job.name).inc()
        started_at = self.clock.wall()
        started = self.clock.monotonic()
        m.run_start_delay_seconds.labels(job=job.name).observe(max(0.0, started_at - slot_time))
        self.aftermath.started(job, claim.token, started_at)
        try:
            result = await self.trigger.fire(
                job,
                claim.slot,
                claim.token,
                deadline,
                attempt=claim.attempt,
                fence=claim.seq,
                send_by=deadline,
                why=self._why(job, claim),
            )
        except asyncio.CancelledError:
            # Cut off by the drain: the record keeps when the run really
            # started and how long it had run until then.
            ran = self.clock.monotonic() - started
            result = TriggerResult(
                False,
                started_at,
                started_at + ran,
                ran,
                None,
                f"interrupted: still running after the {self.config.shutdown_grace:g}s "
                "shutdown grace period; outcome unknown",
                1,
            )
            await self._finish(job, claim, result)
            raise
        finally:
            m.runs_in_progress.labels(job=job.name).dec()
        if result.late:
            await self._skip_won(job, claim, "late", result.error or "late")
            return
        await self._finish(job, claim, result)

    def _why(self, job: JobConfig, claim: Claim) -> Why:
        """X-Anarchon-Trigger and -Previous-Scheduled-At; the loop's answer when it has one."""
        known = self._previous.get(job.name)
        if known is None or known[0] != claim.slot:
            return why_of(job, claim.slot, claim.trigger)
        previous = known[1]
        return Why(claim.trigger, rfc3339(previous / 1000) if previous is not None else None)

    async def _finish(self, job: JobConfig, claim: Claim, result: TriggerResult) -> None:
        m = self.metrics
        status = "succeeded" if result.ok else "failed"
        m.runs_total.labels(job=job.name, status=status).inc()
        m.run_duration_seconds.labels(job=job.name).observe(result.duration)
        if result.ok:
            m.job_last_success_timestamp_seconds.labels(job=job.name).set(result.finished_at)
        record = ResultRecord.of(
            job.name,
            claim.slot,
            claim.token,
            self.config.instance_id,
            result,
            claim.manual,
            claim.attempt,
            claim.trigger,
        )
        record = self.aftermath.marked(job, record)
        (log.info if result.ok else log.warning)(
            "run job=%s slot=%s%s status=%s http_status=%s duration_ms=%d%s",
            job.name,
            rfc3339(claim.slot / 1000),
            f" attempt={claim.attempt}" if claim.attempt > 1 else "",
            status,
            result.http_status,
            record.duration_ms,
            f" error={result.error!r}" if result.error else "",
        )
        seq = await publish_result(self.js, self.spec.name, self.spec.prefix, record)
        if not seq:
            log.error("job %s slot %s: result not recorded", job.name, claim.slot)
        self.aftermath.after_outcome(job, record, result.answer, getattr(claim, "trigger", None))
        if not result.ok:
            await self._retry(job, claim, result.finished_at, seq)

    async def _retry(self, job: JobConfig, claim: Claim, finished_at: float, seq: int) -> None:
        """After a failed attempt (its result stored at `seq`): make the next one due,
        while retry.max allows. Without a stored result no sidecar would act on it."""
        if job.retry.max < 1 or claim.manual:
            return
        if not may_follow(claim.attempt, job.retry.max):
            self.metrics.retries_exhausted_total.labels(job=job.name).inc()
            log.error(
                "job %s slot %s: attempt %d failed; no attempt left (retry.max %d)",
                job.name,
                rfc3339(claim.slot / 1000),
                claim.attempt,
                job.retry.max,
            )
            return
        due_at = retry_due_at(finished_at, job.retry.backoff, claim.attempt)
        await make_due(
            self.keys(),
            self.metrics,
            self.clock,
            job,
            claim.slot,
            claim.attempt + 1,
            due_at,
            RETRY,
            self.config.instance_id,
            seq,
        )

    async def _skipped(self, job: JobConfig, claim: Claim, holder: dict[str, Any]) -> None:
        """Won, but a run of the job is alive: recorded ``skipped`` (overlap), nothing sent."""
        running = slot_ms(holder.get("slot"))  # read from NATS: range-checked
        since = holder.get("started_at", "?")
        if running is None and holder.get("slot") is not None:
            self.metrics.hostile_input_total.labels(what="value").inc()
        error = (
            f"overlap: slot {rfc3339(running / 1000)} is still running on "
            f"{str(holder.get('instance', '?'))[:100]} since {str(since)[:40]}"
            if running is not None
            else "overlap: a run of this job is still alive"
        )
        await self._skip_won(job, claim, "overlap", error)

    async def _skip_won(self, job: JobConfig, claim: Claim, reason: str, error: str) -> None:
        """A won slot recorded ``skipped``, nothing sent: ``overlap``, or ``late`` (frozen
        past slot + max_late before the request went out; not retried: the app did
        not fail, the run's time is over)."""
        m = self.metrics
        m.runs_skipped_total.labels(job=job.name, reason=reason).inc()
        m.runs_total.labels(job=job.name, status=SKIPPED).inc()
        log.warning(
            "run job=%s slot=%s status=skipped error=%r",
            job.name,
            rfc3339(claim.slot / 1000),
            error,
        )
        await self._record(job, claim, SKIPPED, error)

    async def _not_run(self, job: JobConfig, claim: Claim, error: str) -> None:
        """Won, but the lock could not be taken: failed, nothing sent (a retry may follow)."""
        self.metrics.runs_total.labels(job=job.name, status="failed").inc()
        log.warning(
            "run job=%s slot=%s status=failed error=%r", job.name, rfc3339(claim.slot / 1000), error
        )
        seq = await self._record(job, claim, "failed", error)
        await self._retry(job, claim, self.clock.wall(), seq)

    async def _record(self, job: JobConfig, claim: Claim, status: str, error: str) -> int:
        now = rfc3339(self.clock.wall())
        record = ResultRecord(
            job=job.name,
            slot=claim.slot,
            token=claim.token,
            instance=self.config.instance_id,
            status=status,
            started_at=now,
            finished_at=now,
            duration_ms=0,
            http_status=None,
            error=error,
            manual=claim.manual,
            attempt=claim.attempt,
        )
        seq = await publish_result(self.js, self.spec.name, self.spec.prefix, record)
        if not seq:
            log.error("job %s slot %s: result not recorded", job.name, claim.slot)
        self.aftermath.after_outcome(job, record, b"", getattr(claim, "trigger", None))
        return seq
