"""A job's life: wait for its slot, check it may be claimed, claim, run, record.

``Jobs.loop`` runs one job's schedule top-down: sleep until the slot plus a
random jitter in [0, jitter] (sidecar/core/sleeper.py); skip it (counted, said:
sidecar/run/skips.py) when the claim would start more than max_late after its
time, when the stream guard says the stream cannot hold the claim, or when
the fleet keeps it from running (paused, excluded, skip: judged against the
state bucket as it was at the slot's instant, so every sidecar judges a slot
alike; a kept slot's skip record takes the slot's own claim id, so a slot
never has both a run and a skip record: docs/GUARANTEES.md); claim it
(``attempt``: the one place a slot is claimed); if won, take its lease
(sidecar/run/lease.py), trigger the app in a task of its own (tracked in ``runs``
for the drain), and end the run in one ``Outcome`` recorded by
sidecar/run/record.py, then release the lease. A failed attempt is followed by
the next one when ``retry`` allows (sidecar/run/retries.py).

Around it: catch-up after a start or a reconnect (sidecar/run/catchup.py), due
attempts and lost runs (sidecar/run/retries.py, sidecar/run/lostruns.py), each
calling back into ``attempt``. Every task they start is in ``background()``
for the daemon's drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sidecar.config.job_entry import WAITING
from sidecar.core import failpoints
from sidecar.core.clock import rfc3339
from sidecar.core.errors import ClaimDisconnected, ClaimForeign, CountUnavailable, KeyHeld
from sidecar.core.tasks import TaskSet
from sidecar.core.wire import CATCHUP, EVERY, FAILED, RUN_ON_FIELD, SCHEDULED, SKIPPED, every_msg_id
from sidecar.run.lease import (
    KEPT,
    REPLACED,
    RUN_LEASE_WAIT,
    TAKEN,
    overlap_error,
    run_lease,
    uses_lock,
)
from sidecar.run.record import Outcome, Recorder, not_sent, sent
from sidecar.run.skips import EXCLUDED, Unclaimed
from sidecar.run.startup import StartupWait
from sidecar.run.timetable import Timetable
from sidecar.run.trigger import Trigger, Why, interrupted, why_of
from sidecar.store.bucketcheck import needs_leases
from sidecar.when.pauses import PAUSED, SKIP

if TYPE_CHECKING:
    from sidecar.after.aftermath import Aftermath
    from sidecar.config.load import JobConfig
    from sidecar.fleet.candidates import Candidates
    from sidecar.run.atruns import AtRuns
    from sidecar.run.backfill import Backfills
    from sidecar.run.catchup import CatchUp
    from sidecar.run.claim import Claim
    from sidecar.run.claimwindow import ClaimWindow
    from sidecar.run.concurrency import Limits
    from sidecar.run.context import Context
    from sidecar.run.lostruns import LostRuns
    from sidecar.run.onkey import DueOnFirstUse, OnFirstKey
    from sidecar.run.overlap import Overlap
    from sidecar.run.record import Recorder
    from sidecar.run.skips import Unclaimed
    from sidecar.run.trigger import Trigger

log = logging.getLogger(__name__)


def counts(job: JobConfig, claim: Claim) -> bool:
    """Whether this run is one that ``max_runs`` counts: attempt 1 of a slot of the
    schedule (on time or caught up); not a retry or rerun of a counted slot, a
    backfill or a manual run."""
    return (
        job.max_runs is not None
        and claim.attempt == 1
        and not claim.manual
        and claim.trigger in (SCHEDULED, CATCHUP)
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Parts:
    """The parts of a job's life, made once by sidecar/run/wiring.py for one ``Jobs``
    while it is constructed (they call back into it: ``attempt``, ``_start_run``,
    ``_run_tracked``, ``_next_slot``)."""

    unclaimed: Unclaimed  # slots not claimed: counted, said, recorded when kept from running
    catch_up: CatchUp  # slots missed while this sidecar was away
    backfills: OnFirstKey[Backfills]  # made on the first backfill.<job> key
    at_runs: OnFirstKey[AtRuns]  # one-off runs at a set time, claimed like slots
    aftermath: Aftermath  # pings, notifications, auto-pause, anomalies, spans
    recorder: Recorder  # every ending of a run is recorded there
    due: DueOnFirstUse  # what follows a failed run: retries, due attempts (made when needed)
    lost: LostRuns  # lost-run judging
    window: ClaimWindow  # winners of claims lost here that died before their lease
    candidates: Candidates  # claim.candidates: only k instances claim a slot at its time
    # overlap: replace and buffer_one, made (its code imported) by ``make_overlap``
    # now if a job of the file has one of them, else for the first such job of the
    # state bucket's (``Jobs.overlap_part``).
    make_overlap: Callable[[], Overlap]
    overlap: Overlap | None = None


class Jobs:
    """The job loops of one sidecar and the runs they started."""

    # jobs[].concurrency: made (its code imported) by the first run of a job with one.
    limits: Limits | None = None

    def __init__(self, ctx: Context, trigger: Trigger, *, parts: Callable[[Jobs], Parts]) -> None:
        """`parts` makes the parts of a job's life for this object, once, here
        (sidecar/run/wiring.py): nothing is set on it after construction."""
        self.ctx = ctx
        self.config = ctx.config
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.js = ctx.js
        self.claimer = ctx.claimer
        self.trigger = trigger
        self.guard = ctx.guard
        self.fleet = ctx.fleet
        self.spec = ctx.spec
        self.connected = ctx.connected
        self.stopping = ctx.stopping
        # The runs started (the drain waits for them, bounded) and the job loops.
        self.runs = TaskSet("a run")
        # Precise sleeps until an instant, woken at once on stop (sidecar/core/sleeper.py).
        self.sleeper = ctx.sleeper
        self.sleep_until = self.sleeper.until
        self.side_tasks = ctx.tasks
        # The one wait of the slots due while the sidecar starts (sidecar/run/startup.py).
        self.startup = StartupWait(
            started=self._started, clock=self.clock, stopping=self.stopping, tasks=self.side_tasks
        )
        # Every job's slots on one timer (sidecar/run/timetable.py); the parts it
        # calls are wired after this (sidecar/run/wiring.py): looked up per call.
        self.timetable = Timetable(
            clock=self.clock,
            stopping=self.stopping,
            metrics=self.metrics,
            tasks=self.side_tasks,
            attempt=lambda job, slot, now: self.attempt(job, slot, now),
            late=lambda job, slot, now: self.unclaimed.late(job, slot, now),
            over=self._over,
            catch_up=lambda job: self.catch_up(job),
        )
        # The state bucket's key writer; None while unknown or unfit for leases.
        self.keys = ctx.keys
        made = parts(self)
        self.unclaimed = made.unclaimed
        self.catch_up = made.catch_up
        self.backfills = made.backfills
        self.at_runs = made.at_runs
        self.aftermath = made.aftermath
        self.recorder = made.recorder
        self.due = made.due
        self.lost = made.lost
        self.window = made.window
        self.candidates = made.candidates
        self.make_overlap = made.make_overlap
        # overlap: replace and buffer_one, on the lock overlap: skip uses: None until
        # a job has one of them, and then none of its parts is needed.
        self.overlap: Overlap | None = made.overlap

    def overlap_part(self) -> Overlap:
        """The Overlap, made now if it was not (a job with replace or buffer_one)."""
        if self.overlap is None:
            self.overlap = self.make_overlap()
        return self.overlap

    def _next_slot(self, job: JobConfig) -> int:
        """The slot the job's loop handles next: catch-up claims only before it."""
        slot = self.timetable.next_slot(job.name)
        return slot if slot is not None else job.schedule.next_slot(self.clock.wall_ms())

    def start(self, job: JobConfig, resume: int | None = None) -> None:
        """Walk the job's schedule on the one timer (sidecar/run/timetable.py) until
        stop, or ``retire``; `resume`: the slot a retired walk of it waited for
        (``Timetable.start``)."""
        self.timetable.start(job, resume)

    async def retire(self, name: str) -> int | None:
        """End job `name`'s walk alone, between two slots (a job removed from the state
        bucket or put again: sidecar/admin/bucket_jobs.py); its runs in flight go on,
        in ``runs``. The slot it waited for and did not handle (``start``'s `resume`)."""
        return await self.timetable.retire(name)

    def handles(self, name: str) -> bool:
        """Whether job `name`'s walk handles a slot now (checked, claimed): ``retire``
        waits for it, up to the claim's max_late when NATS is slow."""
        return self.timetable.handles(name)

    @property
    def loops(self) -> TaskSet:
        """The tasks handling a slot now (checked, claimed, run started)."""
        return self.timetable.tasks

    def busy_within(self, seconds: float) -> bool:
        """Whether a slot is being handled or run now, or one is due within `seconds`
        (the heap is settled only when not: sidecar/cli/settle.py)."""
        if self.runs or self.timetable.tasks:
            return True
        due = self.timetable.timer.next_instant()
        return due is not None and due - self.clock.wall() < seconds

    def wake(self) -> None:
        """Wake every sleep and end every walk (on stop)."""
        self.sleeper.wake()
        self.timetable.wake()

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
        if not self._started():
            # Started moments before the slot: the first look at the stream and the
            # first read of the state bucket are waited for (half of what is left of
            # the claim's window), not taken for a refusal ("stream not checked yet":
            # a run_on: every instance's slot lost on its own app).
            start = slot / 1000 if due_at is None else due_at
            await self.startup.wait((start + job.max_late - now) / 2)
            if self.stopping.is_set():
                m.claims_skipped_total.labels(job=name, reason="shutdown").inc()
                return
            now = self.clock.wall()
        if why := self.guard.blocked(job, slot):
            self.unclaimed.skip(job, slot, "stream", why)
            return
        if number == 1 and (over := self._over(job, slot)) is not None:
            log.debug("job %s slot %s not claimed: %s", name, slot, over)
            return
        if number == 1 and (excluded := job.schedule.excluded(slot)) is not None:
            self.unclaimed.kept(job, slot, EXCLUDED, f"excluded: {excluded.text}")
            return
        if number == 1:
            if not await self.fleet.freshness.view_at(job, slot, self.stopping):
                m.claims_skipped_total.labels(job=name, reason="shutdown").inc()
                return
            now = self.clock.wall()
            if self.fleet.left_bucket(name):  # removed before its walk was ended
                log.info("job %s slot %s not claimed: the job left the state bucket", name, slot)
                return
        if blocked := self.fleet.blocked(name, slot if number == 1 else None):
            if blocked[0] == PAUSED and number == 1:
                # A slot `skip` chose is recorded as a skip even while paused:
                # `resume --catchup` never runs it (docs/GUARANTEES.md, rule 5).
                skipped = self.fleet.skipped(name, slot)
                kept = skipped if skipped is not None and skipped[0] == SKIP else blocked
                self.unclaimed.kept(job, slot, *kept)
            else:
                self.unclaimed.skip(job, slot, *blocked)
            return
        if number == 1 and (skipped := self.fleet.skipped(name, slot)) is not None:
            if skipped[0] == SKIP:
                self.unclaimed.kept(job, slot, *skipped)
            else:
                self.unclaimed.skip(job, slot, *skipped)
            return
        every = job.run_on == EVERY  # every instance claims its own (job, slot, instance)
        if not every and not deferred and self.candidates.defer(job, slot, number, trigger):
            return  # not a candidate: claimed after claim.fallback unless its run is seen
        start = slot / 1000 if due_at is None else due_at
        deadline = self.clock.monotonic() + (start + job.max_late - now)
        try:
            claim = await self.claimer.claim(
                name,
                slot,
                deadline,
                attempt=number,
                trigger=trigger,
                msg_id=every_msg_id(name, slot, self.config.instance_id) if every else None,
                extra={RUN_ON_FIELD: EVERY} if every else None,
            )
        except asyncio.CancelledError:
            m.claims_skipped_total.labels(job=name, reason="shutdown").inc()
            raise
        except ClaimForeign as exc:
            self.unclaimed.skip(job, slot, "stream", str(exc))
        except ClaimDisconnected as exc:
            self.unclaimed.disconnected(job, slot, exc)
        except Exception as exc:  # ClaimError; a bug must not stop the job's schedule
            self.unclaimed.failed(job, slot, exc)
        else:
            if claim.won:
                # Not for run_on: every: its run has no lease, hence no claim-to-lease
                # window (a kill there leaves its slot running in history).
                if failpoints.ENABLED and not every:
                    await failpoints.hit("claim.won")
                if number > 1:
                    self.due.claimed(name, slot, number)
                self._start_run(job, claim, start)
            elif every:
                # Only this instance takes this id: it claimed the slot before a
                # restart (or a catch-up), and the slot is not run here again.
                log.info("job %s slot %s already claimed by this instance", name, slot)
            else:
                self.window.lost_claim(job, claim)
            self.unclaimed.count(claim)
            if claim.won:
                # Let the trigger reach the app before this loop computes the
                # next slot and sets its timer: about 0.2 ms of its start delay.
                await asyncio.sleep(0)

    def _started(self) -> bool:
        """Whether the stream was looked at and the state bucket read once since start."""
        return self.guard.looked and self.fleet.view.synced

    def _over(self, job: JobConfig, slot: int) -> str | None:
        """Why `slot` is not claimed by end_at or max_runs (None: it may be)."""
        if (outside := job.schedule.outside(slot)) is not None:
            return outside
        if job.max_runs is not None:
            from sidecar.run import runcap  # max_runs's code, loaded by the first job with it

            if runcap.spent(self.fleet.view, job.name, job.max_runs):
                return f"max_runs {job.max_runs} reached ({runcap.count_key(job.name)})"
        return None

    async def _count(self, job: JobConfig, claim: Claim) -> bool:
        """max_runs: count the slot fleet-wide just before its request (sidecar/run/runcap.py),
        after the overlap lock: a slot that does not run is not counted.
        False: not run, recorded skipped (the count is full, or unknown)."""
        assert job.max_runs is not None
        from sidecar.run import runcap

        keys = self.keys()
        try:
            if keys is None:
                why = self.fleet.bucket_problem or "the state bucket cannot be written now"
                raise CountUnavailable(why)
            number = await runcap.take(
                keys, job.name, claim.slot, job.max_runs, self.config.instance_id, self.clock.wall()
            )
        except CountUnavailable as exc:
            error, reason = f"not run: its run count (max_runs) is unknown: {exc}", "bucket"
        else:
            if number is not None:
                log.debug("job %s: run %d of %d", job.name, number, job.max_runs)
                return True
            error, reason = f"not run: max_runs {job.max_runs} reached", "max_runs"
        try:
            outcome = not_sent(claim, SKIPPED, error, self.clock.wall(), reason)
            await self.recorder.record(job, outcome)
        except Exception as exc:  # not recorded (NATS away): still not run, the loop goes on
            log.warning("job %s slot %s: %s; not recorded: %r", job.name, claim.slot, error, exc)
        return False

    # ------------------------------------------------------------------ catch-up

    def reconnected(self) -> None:
        """After a reconnect, look again for slots nobody claimed (jobs with catch-up)."""
        self.unclaimed.reconnected()
        if self.stopping.is_set():
            return
        for job in self.ctx.jobs.all:
            if job.catchup != "none":
                self.side_tasks.spawn(self.catch_up(job))

    def background(self) -> set[asyncio.Task[None]]:
        """Every task started besides the runs (catch-up, skips, due attempts, lost-run
        judging): the drain awaits them, bounded, then cancels the rest."""
        return {*self.side_tasks, *self.due.tasks, *self.lost.tasks, *self.window.tasks}

    def _start_run(self, job: JobConfig, claim: Claim, start: float) -> asyncio.Task[None]:
        """The run in a task of its own, in ``runs``: the drain waits for it."""
        return self.runs.spawn(self._guarded_run(job, claim, start))

    def run_kept(self, job: JobConfig, claim: Claim, late: str | None) -> bool:
        """A slot ``overlap: buffer_one`` kept, its turn come (sidecar/run/overlap.py), through
        the gate of a due attempt: paused now, it is recorded skipped (paused); too old
        (`late` says why), skipped (late). ``max_runs`` is taken by the run (``_count``).
        True when it runs."""
        now = self.clock.wall()
        blocked = self.fleet.blocked(job.name)
        if late is not None:
            reason, why = "late", late
        elif blocked is not None and blocked[0] == PAUSED:
            reason, why = PAUSED, f"not run: {blocked[1]}"
        else:
            self._start_run(job, claim, now)
            return True
        self.runs.spawn(self._end(job, claim, not_sent(claim, SKIPPED, why, now, reason)))
        return False

    async def _run_tracked(self, job: JobConfig, claim: Claim, start: float) -> None:
        """A run awaited (a backfill runs one slot at a time)."""
        await asyncio.shield(self._start_run(job, claim, start))

    async def _guarded_run(self, job: JobConfig, claim: Claim, start: float) -> None:
        """``run_slot``; a run that ends with an exception (a bug, hostile input) is logged
        and recorded ``failed`` (once: the result's msg id is the run's), never left
        ``running`` with a "Task exception was never retrieved"."""
        try:
            await self.run_slot(job, claim, start)
        except Exception as exc:
            log.exception("job %s slot %s: the run ended with an error", job.name, claim.slot)
            with contextlib.suppress(Exception):
                error = f"internal error: {exc!r}"[:300]
                await self.recorder.record(job, not_sent(claim, FAILED, error, self.clock.wall()))

    async def run_slot(self, job: JobConfig, claim: Claim, start: float) -> None:
        """Hold the run's lease, trigger the app, record the result, release the lease.

        With ``overlap: skip`` the lease is ``lock.<job>``: when it is held, a
        run of the job is alive somewhere and this one is recorded skipped.
        `start` is when the attempt was due (the slot's time for attempt 1).
        """
        deadline = self.clock.monotonic() + max(0.0, start + job.max_late - self.clock.wall())
        if job.run_on == EVERY:
            # No lease: the run is this instance's alone, nobody else would judge
            # it or take it over (a runner killed mid-run reads running in history).
            await self._run(job, claim, deadline)
            return
        keys = self.keys()
        if keys is None and needs_leases(job):
            # The bucket turned unfit (or was replaced) between the check and the
            # claim: never run such a job without its lease (overlap: skip as allow).
            why = self.fleet.bucket_problem or "the state bucket cannot hold leases now"
            error = f"not run without a lease: {why}"
            await self._end(
                job, claim, not_sent(claim, SKIPPED, error, self.clock.wall(), "bucket")
            )
            return
        async with contextlib.AsyncExitStack() as stack:
            if keys is not None:
                lease = run_lease(
                    keys,
                    job,
                    claim,
                    self.config.instance_id,
                    self.config.nats.lease_ttl,
                    self.metrics,
                    self.clock,
                    deadline,
                    self.fleet.view.lock_markers,
                )
                if not uses_lock(job):
                    # A run lease only lets the fleet see a dead runner: the run
                    # waits for it a moment at most (lease.RUN_LEASE_WAIT).
                    stack.push_async_exit(lease)
                    left = max(0.0, deadline - self.clock.monotonic())
                    await lease.start(min(RUN_LEASE_WAIT, left / 2))
                    # Judged lost while this sidecar was away before its lease
                    # existed (sidecar/run/claimwindow.py): the lost record stands.
                    if lease.judged or await self.window.judged_lost(job, claim):
                        return
                    if lease.elsewhere and self.window.late(claim):
                        # A judge of this claim waits for that key to go, then records
                        # the run lost: a late winner without its lease does not run.
                        why = f"not run: {lease.key} is held by another run of the slot and "
                        why += "this claim's lease came late (docs/GUARANTEES.md, lost runs)"
                        outcome = not_sent(claim, SKIPPED, why, self.clock.wall(), "late")
                        await self._end(job, claim, outcome)
                        return
                    await self._limited(job, claim, deadline)
                    return
                # Judged lost while this sidecar was away since its claim (claimwindow.py)?
                if await self.window.judged_before_lock(job, claim):
                    return
                try:
                    await stack.enter_async_context(lease)
                except KeyHeld as held:  # a run of the job is alive: nothing sent
                    error, hostile = overlap_error(held.value)
                    if hostile:
                        self.metrics.hostile_input_total.labels(what="value").inc()
                    what = ""
                    if job.overlap != "skip":  # replace: wait for it to stop; buffer_one: keep
                        try:
                            what, why = await self.overlap_part().held(
                                job,
                                claim,
                                held.value,
                                deadline,
                                lambda: stack.enter_async_context(lease),
                            )
                        except asyncio.CancelledError:  # the drain: never sent
                            if job.overlap != "replace":
                                raise  # buffer_one: the slot may be kept already
                            why = "overlap: the sidecar stopped while it waited for the lock"
                            at = self.clock.wall()
                            await self._end(
                                job, claim, not_sent(claim, SKIPPED, why, at, "overlap")
                            )
                            raise
                        if what == KEPT:
                            return
                        error = why if what != TAKEN else error
                    if what != TAKEN:
                        outcome = not_sent(claim, SKIPPED, error, self.clock.wall(), "overlap")
                        await self._end(job, claim, outcome)
                        return
                except Exception as exc:
                    # Nothing sent, failed: a retry may follow.
                    error = f"{lease.key} not taken: {exc!r}"
                    await self._end(job, claim, not_sent(claim, FAILED, error, self.clock.wall()))
                    return
                # The lock held: judged lost while this sidecar was away before it
                # took it (sidecar/run/claimwindow.py)? The lost record stands.
                if await self.window.lock_judged(job, claim):
                    return
            await self._limited(job, claim, deadline)

    async def _limited(self, job: JobConfig, claim: Claim, deadline: float) -> None:
        """``_run`` inside a slot of the job's shared concurrency limit, if it has one
        (sidecar/run/concurrency.py): none free (skip), or none by slot + max_late,
        and the run is recorded skipped (reason concurrency), never sent."""
        if job.concurrency is None:
            await self._run(job, claim, deadline)
            return
        from sidecar.run.concurrency import REASON, Limits  # loaded by the first such run

        keys = self.keys()
        if keys is None:  # turned unfit since run_slot looked: never run past the limit
            why = f"{REASON}: the state bucket cannot hold its slot now"
            await self._end(job, claim, not_sent(claim, SKIPPED, why, self.clock.wall(), "bucket"))
            return
        if self.limits is None:
            self.limits = Limits(self.ctx)
        try:
            took = await self.limits.take(keys, job, claim, deadline)
        except asyncio.CancelledError:  # the drain: never sent
            why = f"{REASON}: the sidecar stopped while it waited for a slot"
            await self._end(job, claim, not_sent(claim, SKIPPED, why, self.clock.wall(), REASON))
            raise
        if isinstance(took, str):
            await self._end(job, claim, not_sent(claim, SKIPPED, took, self.clock.wall(), REASON))
            return
        try:
            await self._run(job, claim, deadline)
        finally:
            await self.limits.release(job, took)

    async def _run(self, job: JobConfig, claim: Claim, deadline: float) -> None:
        """Trigger the app for a won claim and record the result."""
        if counts(job, claim) and not await self._count(job, claim):
            return
        m = self.metrics
        slot_time = claim.slot / 1000
        m.runs_in_progress.labels(job=job.name).inc()
        started_at = self.clock.wall()
        started = self.clock.monotonic()
        m.run_start_delay_seconds.labels(job=job.name).observe(max(0.0, started_at - slot_time))
        self.aftermath.started(job, claim.token, started_at)
        try:
            # No Overlap made yet: no run was kept (buffer_one) nor is replaceable.
            overlap = self.overlap_part() if job.overlap in WAITING else self.overlap
            fire = self.trigger.fire(
                overlap.request_job(job, claim) if overlap is not None else job,
                claim.slot,
                claim.token,
                deadline,
                attempt=claim.attempt,
                fence=claim.seq,
                send_by=deadline,
                why=self._why(job, claim),
            )
            if overlap is not None:
                result, replaced = await overlap.run(job, claim, fire, (started_at, started))
            else:
                result, replaced = await fire, False
        except asyncio.CancelledError:
            # Cut off by the drain: the record keeps when the run really
            # started and how long it had run until then.
            ran = self.clock.monotonic() - started
            result = interrupted(started_at, ran, self.config.shutdown_grace)
            await self._end(job, claim, sent(claim, result))
            raise
        finally:
            m.runs_in_progress.labels(job=job.name).dec()
        if result.late:
            # Frozen past slot + max_late before the request went out: skipped, not
            # retried (the app did not fail, the run's time is over).
            error = result.error or "late"
            await self._end(job, claim, not_sent(claim, SKIPPED, error, self.clock.wall(), "late"))
            return
        if replaced:  # stopped for a newer slot (overlap: replace): failed, not retried
            await self._end(job, claim, dataclasses.replace(sent(claim, result), reason=REPLACED))
            return
        await self._end(job, claim, sent(claim, result))

    def _why(self, job: JobConfig, claim: Claim) -> Why:
        """X-Anarchon-Trigger and -Previous-Scheduled-At; the loop's answer when it has one."""
        if claim.after_run is not None:  # no schedule: the run it follows instead
            return Why(claim.trigger, None, claim.after_run)
        known = self.timetable.previous.get(job.name)
        if known is None or known[0] != claim.slot:
            return why_of(job, claim.slot, claim.trigger)
        previous = known[1]
        return Why(claim.trigger, rfc3339(previous / 1000) if previous is not None else None)

    async def _end(self, job: JobConfig, claim: Claim, outcome: Outcome) -> None:
        """Record the run's outcome (sidecar/run/record.py); a failed attempt may be retried."""
        seq = await self.recorder.record(job, outcome)
        if outcome.kind == FAILED and outcome.reason != REPLACED:
            await self.due.retry(job, claim, outcome.finished_at, seq)
