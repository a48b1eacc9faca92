"""What follows a failed or lost run (FLEET.md): retries, due attempts, lost runs.

``DueAttempts.retry``: after a failed attempt whose result is stored, the
next one is made due (``due.<job>.<slot>.<attempt>``, sidecar/due.py) while
``retry.max`` allows. Every sidecar watches those keys (``due_changed``),
checks them against its config and the stream (sidecar/duecheck.py) and
competes for the attempt at its due time plus jitter (the replica whose app
failed the previous one a little later), with the attempt's own claim id,
through the `attempt` callback it was given (``Jobs.attempt``).

``LostRuns``: every sidecar sees a lease expire (a ``MaxAge`` marker, not a
delete) and publishes a ``lost`` result for that run with ``Nats-Msg-Id:
<job>:<slot>:<attempt>:lost`` (sidecar/record.py); exactly one is stored and
the sidecar whose copy was stored counts it and, with ``on_lost: rerun``,
makes the next attempt due.

Every task started here is in ``tasks``: the daemon's drain awaits them,
bounded, then cancels what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from sidecar.bounds import attempt_no, epoch_s, seq_no, slot_ms
from sidecar.claim import new_token, token_of
from sidecar.clock import Clock, parse_rfc3339, rfc3339
from sidecar.due import LOST as DUE_LOST
from sidecar.due import (
    RETRY,
    DueKey,
    due_key,
    due_key_ttl,
    failed_replica_wait,
    is_lease_key,
    lease_job,
    may_follow,
    parse_due_key,
    renew_every,
    retry_due_at,
)
from sidecar.duecheck import Backed, Hostile, backing, config_problem
from sidecar.kv import KeyHeld, Keys, last_msg, until_answered
from sidecar.record import Outcome, Recorder
from sidecar.state import EXPIRED, REPLACED, Removal, View
from sidecar.trigger import RERUN
from sidecar.trigger import RETRY as RETRY_TRIGGER
from sidecar.wire import LOST, result_subject

if TYPE_CHECKING:
    from sidecar.claim import Claim
    from sidecar.config import Config, JobConfig
    from sidecar.fleet import Fleet
    from sidecar.metrics import Metrics
    from sidecar.stream import StreamSpec

log = logging.getLogger(__name__)

# A lost record is checked against the results this often at most when results
# keep coming in between the check and the record.
RECHECKS = 5
# A lease that vanished with its bucket is judged this long after lease_ttl and
# a renewal have passed (a renewal's round trip and the watch's delivery).
REPLACED_GRACE = 2.0
# At most this many results of a job stored since a run's claim are read.
MAX_RESULTS_READ = 10_000

#: ``attempt(job, slot, now, number, due_at, trigger)``: compete for an attempt now.
Attempt = Callable[["JobConfig", int, float, int, float, str], Awaitable[None]]


class DueAttempts:
    """Retries made due after a failure, and due attempts competed for (module doc)."""

    def __init__(
        self,
        config: Config,
        metrics: Metrics,
        clock: Clock,
        js: JetStreamContext,
        spec: StreamSpec,
        fleet: Fleet,
        keys: Callable[[], Keys | None],
        attempt: Attempt,
        sleep_until: Callable[[float], Awaitable[bool]],
        stopping: asyncio.Event,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.js = js
        self.spec = spec
        self.fleet = fleet
        self.keys = keys
        self.attempt = attempt
        self.sleep_until = sleep_until
        self.stopping = stopping
        self.by_name = {job.name: job for job in config.jobs}
        self.tasks: set[asyncio.Task[None]] = set()
        self._due: set[str] = set()  # due keys this sidecar waits for
        self._refused: set[tuple[str, int]] = set()  # hostile due keys (key, revision) said

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("a due-attempt task failed", exc_info=exc)

    async def retry(self, job: JobConfig, claim: Claim, finished_at: float, seq: int) -> None:
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

    def claimed(self, name: str, slot: int, number: int) -> None:
        """Attempt `number` (2 or more) was won here: its due key is dropped."""
        self._spawn(self._drop_due(due_key(name, slot, number)))

    def due_changed(self, key: str) -> None:
        """A key the watch delivered: a new ``due.*`` key of ours is checked, then waited for."""
        if not key.startswith("due.") or key in self._due or self.stopping.is_set():
            return
        entry = self.fleet.view.keys.get(key)
        parsed = parse_due_key(key)
        job = self.by_name.get(parsed.job if parsed else key.split(".")[1])
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
            trigger = RERUN if backed.reason == DUE_LOST else RETRY_TRIGGER
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


class LostRuns:
    """Records a ``lost`` result for every lease that expired (see the module doc)."""

    def __init__(
        self,
        config: Config,
        metrics: Metrics,
        clock: Clock,
        js: JetStreamContext,
        spec: StreamSpec,
        keys: Callable[[], Keys | None],
        recorder: Recorder | None = None,
        stopping: asyncio.Event | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.js = js
        self.spec = spec
        self.keys = keys
        self.jobs = {job.name: job for job in config.jobs}
        self.tasks: set[asyncio.Task[None]] = set()
        # Whether an expired lease of a job not in this config is judged here
        # (sidecar/orphans.py: when no other live instance runs that job).
        self.judges_foreign: Callable[[Removal], bool] = lambda removal: False
        self.view: View | None = None  # the live view: leases of a replaced bucket
        # Records, counts and says the lost outcome, tells the aftermath (sidecar/record.py).
        self.recorder = recorder or Recorder(
            js, spec.name, spec.prefix, config.instance_id, metrics
        )
        # Set: the sidecar drains, no new judging starts (the drain awaits ``tasks``).
        self.stopping = stopping or asyncio.Event()

    def removed(self, removal: Removal) -> None:
        """The view lost `removal.key`; an expired lease of one of our jobs was lost."""
        if not is_lease_key(removal.key) or self.stopping.is_set():
            return
        name = lease_job(removal.key) or ""
        job = self.jobs.get(name)
        if job is None:
            # A job not in this config: only its expiry is judged, and only when
            # no other live instance runs it (sidecar/orphans.py).
            if removal.how != EXPIRED or not self.judges_foreign(removal):
                return
            coro = self.record(name, removal)
        elif removal.how == REPLACED:
            coro = self.replaced(job, removal)
        elif removal.how != EXPIRED:
            if removal.how is None:
                log.debug("lease %s vanished between two reads; not judged", removal.key)
            return
        else:
            coro = self.record(job, removal)
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        """A recorder that ended with an exception is said (never "never retrieved")."""
        self.tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("recording a lost run failed", exc_info=exc)

    async def replaced(self, job: JobConfig, removal: Removal) -> None:
        """A lease that vanished with its bucket (deleted, made again): a live runner
        takes it again at its next renewal (Lease), a dead one cannot. Judged once
        lease_ttl and a renewal have passed: still gone, it is recorded lost, like an
        expired one (the result is looked for first), never left ``running``."""
        ttl = self.config.nats.lease_ttl
        await asyncio.sleep(ttl + renew_every(ttl) + REPLACED_GRACE)
        view = self.view
        if view is not None:
            back = view.keys.get(removal.key)
            if back is not None and back.value.get("token") == removal.entry.value.get("token"):
                return  # its runner took it again: alive
        log.warning(
            "lease %s vanished with the state bucket and was not taken again within "
            "lease_ttl: its runner is gone",
            removal.key[:200],
        )
        await self.record(job, Removal(removal.key, removal.entry, EXPIRED, self.clock.wall()))

    async def record(self, job: JobConfig | str, removal: Removal) -> None:
        """Record the run of an expired lease lost; `job` is a name for a job not
        in this config (recorded, never rerun)."""
        name = job if isinstance(job, str) else job.name
        value = removal.entry.value
        # Read from NATS: every number is range-checked before it is used.
        slot, attempt = slot_ms(value.get("slot")), attempt_no(value.get("attempt"), 1)
        token = value.get("token")
        if slot is None or attempt is None or not isinstance(token, str):
            self.metrics.hostile_input_total.labels(what="value").inc()
            log.warning(
                "lease %s expired with a value that is not a lease (or out of range): ignored",
                removal.key[:200],
            )
            return
        at = epoch_s(removal.at) or self.clock.wall()
        after = seq_no(value.get("fence"))
        try:
            for _ in range(RECHECKS):
                recorded, last = await self._recorded(name, token, after)
                if recorded:
                    log.info("lease %s expired after its run was recorded", removal.key)
                    return
                stored = await self._publish(
                    name, removal.key, value, slot, attempt, token, at, last
                )
                if stored is not None:
                    break
                # A result came in between the check and the lost record: look again.
            else:
                log.warning("lease %s expired; results kept coming in, not recorded", removal.key)
                return
        except Exception as exc:  # another sidecar records it; say so here
            log.warning("lease %s expired; recording the run lost failed: %r", removal.key, exc)
            return
        if not stored:
            return
        if isinstance(job, str):
            return  # a job this config does not have: nothing to rerun it with
        if job.on_lost == "rerun":
            if may_follow(attempt, job.retry.max):
                await make_due(
                    self.keys(),
                    self.metrics,
                    self.clock,
                    job,
                    slot,
                    attempt + 1,
                    at,
                    DUE_LOST,
                    "",
                    stored,
                )
            else:
                self.metrics.retries_exhausted_total.labels(job=job.name).inc()

    async def _recorded(self, job: str, token: str, after: int | None) -> tuple[bool, int]:
        """Whether this run has a result (its own, or a lost record), and the sequence
        of the job's last result (0: none), which the lost record then expects.

        The newest result alone is not enough: runs of a job overlap, and a later
        slot's result hides this run's. With the run's claim sequence (`after`,
        the lease's ``fence``) every result stored since is read; without it
        (a lease written by another implementation) only the newest.
        """
        subject = result_subject(self.spec.prefix, job)
        newest = await last_msg(self.js, self.spec.name, subject)
        if newest is None:
            return False, 0
        last = int(newest.seq or 0)
        if token_of(newest.data or b"") == token:
            return True, last
        seq = (after or last) + 1
        for _ in range(MAX_RESULTS_READ):
            if seq >= last:
                break
            try:
                msg = await self.js.get_msg(self.spec.name, seq, subject=subject, next=True)
            except NotFoundError:
                break
            if int(msg.seq or 0) >= last:
                break
            if token_of(msg.data or b"") == token:
                return True, last
            seq = int(msg.seq or 0) + 1
        return False, last

    async def _publish(
        self,
        job: JobConfig | str,
        key: str,
        value: dict[str, Any],
        slot: int,
        attempt: int,
        token: str,
        at: float,
        last: int,
    ) -> int | None:
        """Publish the lost result, expecting `last` as the job's last result.

        Its sequence when this copy was the one stored, 0 when another
        sidecar's was; None when a result was stored since `last` was read
        (perhaps this run's own): it is looked at again.
        """
        name = job if isinstance(job, str) else job.name
        started = value.get("started_at")
        try:
            started_at = parse_rfc3339(started[:40]) if isinstance(started, str) else at
        except (ValueError, OverflowError, OSError):
            started_at = at
        if not at >= started_at:
            started_at = at
        instance = value.get("instance")
        outcome = Outcome(
            kind=LOST,
            job=name,
            slot=slot,
            token=token,
            started_at=started_at,
            finished_at=at,
            attempt=attempt,
            instance=str(instance if instance is not None else ""),
            error=f"lease {key} expired: instance {instance} stopped renewing it "
            f"(lease_ttl {self.config.nats.lease_ttl:g}s); recorded by {self.config.instance_id}",
        )
        # A job of this config (record passes its name): its pings, notifications.
        ours = self.jobs.get(name) if isinstance(job, str) else job
        return await self.recorder.record_lost(ours, outcome, last)


async def make_due(
    keys: Keys | None,
    metrics: Metrics,
    clock: Clock,
    job: JobConfig,
    slot: int,
    attempt: int,
    due_at: float,
    reason: str,
    failed_on: str,
    result_seq: int = 0,
) -> bool:
    """Store ``due.<job>.<slot>.<attempt>``; True when this call made it due.

    `result_seq`: the sequence of the stored result of the attempt before; the
    other sidecars read it there before they act on the key (sidecar/duecheck.py).
    """
    if keys is None:
        log.warning(
            "job %s: attempt %d of slot %d not made due: no bucket", job.name, attempt, slot
        )
        return False
    key = due_key(job.name, slot, attempt)
    value = {
        "due_at": due_at,
        "reason": reason,
        "instance": failed_on,
        "token": new_token(),
        "result": result_seq,
    }
    ttl = due_key_ttl(due_at, clock.wall(), job.jitter, job.max_late)
    try:
        await until_answered(
            f"due key {key}",
            lambda: keys.create(key, value, ttl),
            clock,
            clock.monotonic() + 10.0,
        )
    except KeyHeld:
        return False
    except Exception as exc:
        log.error("job %s: attempt %d of slot %d not made due: %r", job.name, attempt, slot, exc)
        return False
    metrics.attempts_due_total.labels(job=job.name, reason=reason).inc()
    log.info(
        "job %s slot %s: attempt %d due at %s (%s)",
        job.name,
        rfc3339(slot / 1000),
        attempt,
        rfc3339(due_at),
        reason,
    )
    return True


def parse_due(entry_value: dict[str, Any]) -> tuple[float, str, str] | None:
    """(due_at, reason, failed_on) of a due key's value; None when malformed."""
    due_at = entry_value.get("due_at")
    if not isinstance(due_at, int | float) or isinstance(due_at, bool):
        return None
    reason = entry_value.get("reason")
    failed_on = entry_value.get("instance")
    return (
        float(due_at),
        reason if isinstance(reason, str) else "",
        failed_on if isinstance(failed_on, str) else "",
    )
