"""A job's life: wait for its slot, check it may be claimed, claim, run, record.

``Jobs.loop`` runs one job's schedule top-down: sleep until the slot plus a
random jitter in [0, jitter]; skip it (counted) when the claim would start
more than max_late after its time, or when the stream guard says the stream
cannot hold the claim; claim it; if won, trigger the app in a task of its own
(tracked in ``runs`` for the drain) and publish the result.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Coroutine
from typing import Any

from nats.js import JetStreamContext

from sidecar.claim import Claim, ClaimDisconnected, Claimer, ClaimForeign
from sidecar.clock import Clock, rfc3339
from sidecar.config import Config, JobConfig
from sidecar.errors import ClaimError
from sidecar.fleet import Fleet
from sidecar.guard import REPEAT_LOG, StreamGuard
from sidecar.metrics import Metrics
from sidecar.ratelog import RateLimitedLog
from sidecar.runs import ResultRecord, last_messages, last_scheduled_slot, publish_result
from sidecar.trigger import Trigger, TriggerResult

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
        self.spec = guard.spec
        self.connected = connected
        self.stopping = stopping
        self.runs: set[asyncio.Task[None]] = set()
        self._sleepers: set[asyncio.Future[None]] = set()  # loops in sleep_until
        self._skip_logged: dict[str, float] = {}
        self.warnings = RateLimitedLog(log)
        self.side_tasks: set[asyncio.Task[None]] = set()  # catch-up

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
        if job.catchup != "none":
            self._spawn(self.catch_up(job))
        while not self.stopping.is_set():
            self._next[name] = slot
            m.job_next_run_timestamp_seconds.labels(job=name).set(slot / 1000)
            fire_at = slot / 1000 + random.uniform(0.0, job.jitter)
            if await self.sleep_until(fire_at):
                if self.clock.wall() >= slot / 1000:
                    m.claims_skipped_total.labels(job=name, reason="shutdown").inc()
                return
            now = self.clock.wall()
            if now - slot / 1000 > job.max_late:
                slot = self._skip_late(job, slot, now)
                continue
            await self.attempt(job, slot, now)
            slot = job.schedule.next_slot(slot)

    async def attempt(self, job: JobConfig, slot: int, now: float) -> None:
        """Claim `slot` unless something forbids it now; run it when won."""
        m = self.metrics
        name = job.name
        if why := self.guard.blocked(job, slot):
            self._skip(job, slot, "stream", why)
            return
        if blocked := self.fleet.blocked(name):
            self._skip(job, slot, *blocked)
            return
        deadline = self.clock.monotonic() + (slot / 1000 + job.max_late - now)
        try:
            claim = await self.claimer.claim(name, slot, deadline)
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
                self._start_run(job, claim)
            self._count_claim(claim)
            if claim.won:
                # Let the trigger reach the app before this loop computes the
                # next slot and sets its timer: about 0.2 ms of its start delay.
                await asyncio.sleep(0)

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
        task.add_done_callback(self.side_tasks.discard)

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
            await self.attempt(job, slot, now)

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

    def _start_run(self, job: JobConfig, claim: Claim) -> None:
        task = asyncio.create_task(self.run_slot(job, claim))
        self.runs.add(task)
        task.add_done_callback(self.runs.discard)

    async def run_slot(self, job: JobConfig, claim: Claim) -> None:
        """Trigger the app for a won claim and record the result."""
        m = self.metrics
        slot_time = claim.slot / 1000
        deadline = self.clock.monotonic() + max(0.0, slot_time + job.max_late - self.clock.wall())
        m.runs_in_progress.labels(job=job.name).inc()
        started_at = self.clock.wall()
        started = self.clock.monotonic()
        m.run_start_delay_seconds.labels(job=job.name).observe(max(0.0, started_at - slot_time))
        try:
            result = await self.trigger.fire(
                job, claim.slot, claim.token, deadline, fence=claim.seq
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
        await self._finish(job, claim, result)

    async def _finish(self, job: JobConfig, claim: Claim, result: TriggerResult) -> None:
        m = self.metrics
        status = "succeeded" if result.ok else "failed"
        m.runs_total.labels(job=job.name, status=status).inc()
        m.run_duration_seconds.labels(job=job.name).observe(result.duration)
        if result.ok:
            m.job_last_success_timestamp_seconds.labels(job=job.name).set(result.finished_at)
        record = ResultRecord.of(
            job.name, claim.slot, claim.token, self.config.instance_id, result, claim.manual
        )
        (log.info if result.ok else log.warning)(
            "run job=%s slot=%s status=%s http_status=%s duration_ms=%d%s",
            job.name,
            rfc3339(claim.slot / 1000),
            status,
            result.http_status,
            record.duration_ms,
            f" error={result.error!r}" if result.error else "",
        )
        if not await publish_result(self.js, self.spec.name, self.spec.prefix, record):
            log.error("job %s slot %s: result not recorded", job.name, claim.slot)
