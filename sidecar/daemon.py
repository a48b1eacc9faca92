"""The daemon: per-job loops that wait, claim, trigger and record; a bounded drain.

For each job: wait for the next slot plus a random jitter in [0, jitter];
skip the slot (counted) when the claim would start more than max_late after
its time; claim it; if won, trigger the app in a task of its own and publish
the result. SIGTERM/SIGINT: stop claiming, let running triggers finish within
``shutdown_grace``, record their results, drain the connection, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import signal
import time
from dataclasses import dataclass, field

from nats.js import JetStreamContext
from prometheus_client import CollectorRegistry

from sidecar.claim import Claim, ClaimDisconnected, Claimer
from sidecar.clock import Clock, rfc3339
from sidecar.config import Config, JobConfig, Secrets
from sidecar.connection import Connection
from sidecar.errors import ClaimError, StreamError, StreamNotFound
from sidecar.metrics import Metrics
from sidecar.runs import ResultRecord, publish_result
from sidecar.server import AdminServer
from sidecar.stream import RETRYABLE, StreamState, ensure_stream, read_stream, stream_spec
from sidecar.trigger import Trigger, TriggerResult

log = logging.getLogger(__name__)

# How often the stream gauges are refreshed: one stream_info call, whose cost
# does not depend on the number of messages.
STREAM_REFRESH = 10.0
# On SIGTERM, how long a claim in flight may still take before it is abandoned.
CLAIM_DRAIN = 2.0
# At most this many late slots are walked one by one after a stall.
MAX_LATE_WALK = 10_000
# asyncio's timers fire up to a millisecond late (the epoll timeout is rounded
# up to whole milliseconds), plus the time an idle CPU takes to wake: about
# 1.5 ms at p50 here. A slot's timer is set this much early and the rest is
# slept precisely, blocking the loop for at most this long once per due instant.
PRECISE_WAKE = 0.002


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass
class Daemon:
    """One sidecar: NATS connection, stream, job loops, admin server."""

    config: Config
    secrets: Secrets
    clock: Clock = field(default_factory=Clock)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.registry, tuple(j.name for j in self.config.jobs))
        self.conn = Connection(self.config, self.secrets, self.metrics)
        self.spec = stream_spec(self.config)
        self.stopping = asyncio.Event()
        self._sleepers: set[asyncio.Future[None]] = set()  # job loops in sleep_until
        self.stream_ready = False
        self.stream_problem = "stream not checked yet"
        self.runs: set[asyncio.Task[None]] = set()
        self.admin = AdminServer(
            self.registry, self.config.metrics.host, self.config.metrics.port, self.not_ready
        )

    # ------------------------------------------------------------------ lifecycle

    def not_ready(self) -> str | None:
        if self.stopping.is_set():
            return "shutting down"
        if not self.conn.connected.is_set():
            return "not connected to NATS"
        if not self.stream_ready:
            return self.stream_problem
        return None

    def stop(self) -> None:
        if not self.stopping.is_set():
            log.info("stopping: no new claims; draining running triggers")
            self.stopping.set()
            for waiter in self._sleepers:
                _wake(waiter)

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT; ConnectError when NATS is unreachable at start."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        await self.admin.start()
        try:
            nc = await self.conn.connect()
            js = nc.jetstream()
            claimer = Claimer(
                nc,
                js,
                self.spec.name,
                self.spec.prefix,
                self.config.instance_id,
                self.clock,
                self.config.nats.ack_timeout,
                self.conn.wait_connected,
            )
            async with Trigger(
                self.secrets.signing_secret, self.clock, self.config.instance_id
            ) as trigger:
                watcher = asyncio.create_task(self.watch_stream(js))
                loops = [
                    asyncio.create_task(self.job_loop(job, claimer, trigger, js))
                    for job in self.config.jobs
                ]
                # Everything made so far lives as long as the process: keep it out
                # of the collector's full passes, which otherwise walk all of it
                # (about 8 ms) and now and then land on a slot's start. Collect
                # first, so that start-up garbage is not frozen with it.
                gc.collect()
                gc.freeze()
                await self.stopping.wait()
                # A claim still waiting for an answer (NATS down, say) gets a
                # moment, then is abandoned: the slot is skipped, never run.
                _, waiting = await asyncio.wait(loops, timeout=CLAIM_DRAIN)
                for task in waiting:
                    task.cancel()
                await asyncio.gather(*loops, return_exceptions=True)
                await self.drain()
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            await self.conn.close(drain=True)
            log.info("stopped")
            return 0
        finally:
            await self.admin.stop()
            await self.conn.close(drain=False)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
                # Stopping already: a second signal must not kill the exit.
                signal.signal(sig, signal.SIG_IGN)

    async def drain(self) -> None:
        """Wait for running triggers up to the grace period; cancel the rest."""
        if not self.runs:
            return
        grace = self.config.shutdown_grace
        log.info("waiting up to %gs for %d running trigger(s)", grace, len(self.runs))
        _, pending = await asyncio.wait(set(self.runs), timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)

    # ------------------------------------------------------------------ stream

    async def watch_stream(self, js: JetStreamContext) -> None:
        """Ensure the stream, then keep its gauges fresh; readiness follows it."""
        backoff = 0.2
        ensured = False
        while True:
            try:
                if not self.conn.connected.is_set():
                    await self.conn.connected.wait()
                state = await (
                    read_stream(js, self.spec) if ensured else ensure_stream(js, self.spec)
                )
                ensured = True
            except StreamNotFound:
                ensured = False
                self._stream_down("stream missing; creating it again")
                continue
            except (*RETRYABLE, StreamError) as exc:
                ensured = False
                self._stream_down(f"stream not available: {exc!r}")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            except Exception as exc:  # never let readiness die silently
                ensured = False
                log.exception("checking the stream failed")
                self._stream_down(f"stream check failed: {exc!r}")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.2
            self._stream_up(state)
            await asyncio.sleep(STREAM_REFRESH)

    def _stream_down(self, problem: str) -> None:
        if self.stream_ready or problem != self.stream_problem:
            log.warning("%s", problem)
        self.stream_ready = False
        self.stream_problem = problem

    def _stream_up(self, state: StreamState) -> None:
        if not self.stream_ready:
            log.info(
                "stream %s ready: history_size=%d duplicate_window=%gs replicas=%d",
                state.name,
                state.history_size,
                state.duplicate_window,
                state.replicas,
            )
        self.stream_ready = True
        m = self.metrics
        m.stream_messages.set(state.messages)
        m.stream_bytes.set(state.bytes)
        m.stream_history_size.set(state.history_size)
        m.stream_duplicate_window_seconds.set(state.duplicate_window)
        m.stream_replicas.set(state.replicas)

    # ------------------------------------------------------------------ jobs

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

    async def job_loop(
        self, job: JobConfig, claimer: Claimer, trigger: Trigger, js: JetStreamContext
    ) -> None:
        m = self.metrics
        name = job.name
        slot = job.schedule.next_slot(self.clock.wall_ms())
        while not self.stopping.is_set():
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
            deadline = self.clock.monotonic() + (slot / 1000 + job.max_late - now)
            try:
                claim = await claimer.claim(name, slot, deadline)
            except asyncio.CancelledError:
                m.claims_skipped_total.labels(job=name, reason="shutdown").inc()
                raise
            except ClaimDisconnected as exc:
                m.claims_skipped_total.labels(job=name, reason="disconnected").inc()
                log.warning("job %s slot %s skipped: %s", name, rfc3339(slot / 1000), exc)
            except ClaimError as exc:
                m.claim_errors_total.labels(job=name).inc()
                log.warning("job %s slot %s not claimed: %s", name, rfc3339(slot / 1000), exc)
            except Exception:  # a bug must not stop the job's schedule; nothing ran
                m.claim_errors_total.labels(job=name).inc()
                log.exception("job %s slot %s: claim failed unexpectedly", name, slot)
            else:
                if claim.won:
                    self._start_run(job, claim, trigger, js)
                self._count_claim(claim)
                if claim.won:
                    # Let the trigger reach the app before this loop computes the
                    # next slot and sets its timer: about 0.2 ms of its start delay.
                    await asyncio.sleep(0)
            slot = job.schedule.next_slot(slot)

    def _skip_late(self, job: JobConfig, slot: int, now: float) -> int:
        """Count every slot whose claim can no longer start in time; return the next one."""
        skipped = 0
        while now - slot / 1000 > job.max_late and skipped < MAX_LATE_WALK:
            skipped += 1
            slot = job.schedule.next_slot(slot)
        if skipped >= MAX_LATE_WALK:
            slot = job.schedule.next_slot(int((now - job.max_late) * 1000))
        # Late because NATS was away: say so, it is what the operator must fix.
        reason = "late" if self.conn.connected.is_set() else "disconnected"
        self.metrics.claims_skipped_total.labels(job=job.name, reason=reason).inc(skipped)
        log.warning(
            "job %s: %d slot(s) skipped, later than max_late %gs%s",
            job.name,
            skipped,
            job.max_late,
            "" if reason == "late" else " while disconnected from NATS",
        )
        return slot

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

    def _start_run(
        self, job: JobConfig, claim: Claim, trigger: Trigger, js: JetStreamContext
    ) -> None:
        task = asyncio.create_task(self.run_slot(job, claim, trigger, js))
        self.runs.add(task)
        task.add_done_callback(self.runs.discard)

    async def run_slot(
        self, job: JobConfig, claim: Claim, trigger: Trigger, js: JetStreamContext
    ) -> None:
        """Trigger the app for a won claim and record the result."""
        m = self.metrics
        slot_time = claim.slot / 1000
        deadline = self.clock.monotonic() + max(0.0, slot_time + job.max_late - self.clock.wall())
        m.runs_in_progress.labels(job=job.name).inc()
        m.run_start_delay_seconds.labels(job=job.name).observe(
            max(0.0, self.clock.wall() - slot_time)
        )
        try:
            result = await trigger.fire(job, claim.slot, claim.token, deadline)
        except asyncio.CancelledError:
            now = self.clock.wall()
            result = TriggerResult(
                False,
                now,
                now,
                0.0,
                None,
                f"interrupted: still running after the {self.config.shutdown_grace:g}s "
                "shutdown grace period; outcome unknown",
                1,
            )
            await self._finish(job, claim, result, js)
            raise
        finally:
            m.runs_in_progress.labels(job=job.name).dec()
        await self._finish(job, claim, result, js)

    async def _finish(
        self, job: JobConfig, claim: Claim, result: TriggerResult, js: JetStreamContext
    ) -> None:
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
        if not await publish_result(js, self.spec.name, self.spec.prefix, record):
            log.error("job %s slot %s: result not recorded", job.name, claim.slot)
