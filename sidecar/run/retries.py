"""What follows a failed or lost run (docs/GUARANTEES.md): retries and due attempts.

Lost runs themselves are judged and recorded in sidecar/run/lostruns.py; what
follows one (``on_lost: rerun``) is made due here.

``DueAttempts.retry``: after a failed attempt whose result is stored, the
next one is made due (``due.<job>.<slot>.<attempt>``, sidecar/when/attempts.py) while
``retry.max`` allows. Every sidecar watches those keys (``due_changed``),
checks them against its config and the stream (sidecar/run/duecheck.py) and
competes for the attempt at its due time plus jitter (the replica whose app
failed the previous one a little later), with the attempt's own claim id,
through the `attempt` callback it was given (``Jobs.attempt``). A due key of a
job not in the job set yet (one of the state bucket, taken up after the start's
read told the key) is kept until the job is put; one of a job gone from the set
while it waited is let go at its time.

``DueAttempts.rerun``: after this sidecar recorded a run lost
(sidecar/run/lostruns.py) and ``on_lost: rerun``, the next attempt is made
due the same way.

Every task started here is in ``tasks``: the daemon's drain awaits them,
bounded, then cancels what is left.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sidecar.core.backoff import Backoff
from sidecar.core.clock import Clock, rfc3339
from sidecar.core.errors import Hostile, KeyHeld
from sidecar.core.tasks import TaskSet
from sidecar.core.wire import AT, LOST, RERUN, RETRY, new_token
from sidecar.run.duecheck import Backed, backing, config_problem
from sidecar.store.kv import Keys, until_answered
from sidecar.when.attempts import (
    DueKey,
    due_key,
    due_key_ttl,
    failed_replica_wait,
    may_follow,
    parse_due_key,
    retry_due_at,
)

if TYPE_CHECKING:
    from sidecar.config.jobset import Change
    from sidecar.config.load import JobConfig
    from sidecar.obs.metrics import Metrics
    from sidecar.run.claim import Claim
    from sidecar.run.context import Context
    from sidecar.store.state import Removal

log = logging.getLogger(__name__)

# Between the three reads of the stream that back a due key (s, not growing:
# the key waits meanwhile, and a stream that does not answer leaves it).
DUE_CHECK_RETRY = 0.5

# Due keys kept for a job not in this sidecar's set yet (``_unknown``), at most
# (another fleet may share the bucket); each is let go when it leaves the view.
MAX_UNKNOWN = 10_000

#: ``attempt(job, slot, now, number, due_at, trigger)``: compete for an attempt now.
Attempt = Callable[["JobConfig", int, float, int, float | None, str], Awaitable[None]]


class DueAttempts:
    """Retries made due after a failure, and due attempts competed for (module doc)."""

    def __init__(self, ctx: Context, attempt: Attempt) -> None:
        self.config = ctx.config
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.js = ctx.js
        self.spec = ctx.spec
        self.fleet = ctx.fleet
        self.keys = ctx.keys
        self.attempt = attempt
        self.sleep_until = ctx.sleeper.until
        self.stopping = ctx.stopping
        self.by_name = ctx.jobs
        self.tasks = TaskSet("a due-attempt task")
        self._due: set[str] = set()  # due keys this sidecar waits for
        self._refused: set[tuple[str, int]] = set()  # hostile due keys (key, revision) said
        # Per job name not in the set when its due keys came: those keys. A job of the
        # state bucket is taken up after the start's full read told them (its gather,
        # sidecar/admin/bucket_jobs.py): ignored, a retry made due before a restart of
        # the fleet was never attempted. Looked at again when the job is put.
        self._unknown: dict[str, set[str]] = {}
        self._unknown_count = 0
        ctx.jobs.subscribe(self._jobs_changed)
        ctx.fleet.removal_listeners.append(self._removed)

    async def retry(self, job: JobConfig, claim: Claim, finished_at: float, seq: int) -> None:
        """After a failed attempt (its result stored at `seq`): make the next one due,
        while retry.max allows. Without a stored result no sidecar would act on it."""
        if job.retry.max < 1 or claim.manual or claim.trigger == AT:
            return  # a one-off (sidecar/run/atruns.py) is not retried, as run-now
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

    async def rerun(
        self, job: JobConfig, slot: int, attempt: int, lost_at: float, lost_seq: int
    ) -> None:
        """After attempt `attempt` was recorded lost here (``on_lost: rerun``): make the
        next one due at once, while retry.max allows."""
        if job.schedule.next_slot(slot - 1) != slot:
            return  # a one-off's instant (sidecar/run/atruns.py): no due key can name it
        if not may_follow(attempt, job.retry.max):
            self.metrics.retries_exhausted_total.labels(job=job.name).inc()
            return
        await make_due(
            self.keys(),
            self.metrics,
            self.clock,
            job,
            slot,
            attempt + 1,
            lost_at,
            LOST,
            "",
            lost_seq,
        )

    def claimed(self, name: str, slot: int, number: int) -> None:
        """Attempt `number` (2 or more) was won here: its due key is dropped."""
        self.tasks.spawn(self._drop_due(due_key(name, slot, number)))

    def due_changed(self, key: str) -> None:
        """A key the watch delivered: a new ``due.*`` key of ours is checked, then waited for."""
        if not key.startswith("due.") or key in self._due or self.stopping.is_set():
            return
        entry = self.fleet.view.keys.get(key)
        parsed = parse_due_key(key)
        job = self.by_name.get(parsed.job if parsed else key.split(".")[1])
        if entry is None:
            return  # gone
        if job is None:
            # Not one of our jobs (another fleet may share the bucket), or not yet.
            if parsed is not None:
                self._wait_for_job(parsed.job, key)
            return
        if (key, entry.revision) in self._refused:
            return  # said once already (its delete may have failed)
        self._due.add(key)
        if parsed is None:
            why = "not a due key: due.<job>.<slot>.<attempt> with an attempt of 2 or more"
            self.tasks.spawn(self._hostile_due(key, entry.revision, why))
            return
        self.tasks.spawn(self._due_attempt(job, parsed, key, entry.value, entry.revision))

    def _wait_for_job(self, name: str, key: str) -> None:
        """Keep `key` until job `name` is put into the job set (``_jobs_changed``)."""
        if self._unknown_count >= MAX_UNKNOWN:
            return  # another fleet's due keys: not ours to wait for
        keys = self._unknown.setdefault(name, set())
        if key not in keys:
            keys.add(key)
            self._unknown_count += 1

    def _removed(self, removal: Removal) -> None:
        """A key left the view: a due key kept for a job not in the set is let go."""
        if not self._unknown or not removal.key.startswith("due."):
            return
        parsed = parse_due_key(removal.key)
        keys = self._unknown.get(parsed.job) if parsed is not None else None
        if parsed is None or keys is None or removal.key not in keys:
            return
        keys.discard(removal.key)
        self._unknown_count -= 1
        if not keys:
            del self._unknown[parsed.job]

    def _jobs_changed(self, change: Change) -> None:
        """Jobs put into the set: their due keys delivered before are checked now."""
        if not self._unknown:
            return
        for job in change.put:
            keys = self._unknown.pop(job.name, None)
            if keys:
                self._unknown_count -= len(keys)
                for key in sorted(keys):
                    self.due_changed(key)

    async def _due_attempt(
        self, job: JobConfig, due: DueKey, key: str, value: dict[str, Any], revision: int
    ) -> None:
        """Check a due attempt (sidecar/run/duecheck.py), then compete for it at its time
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
            if job.name not in self.by_name:
                # Removed meanwhile (`job remove` of a job of the state bucket): not
                # claimed, nor counted skipped (the stream guard no longer covers it:
                # "stream not checked yet", and the job-not-running alert fired).
                log.info(
                    "job %s slot %s: attempt %d not claimed: the job is not run here any more",
                    job.name,
                    rfc3339(due.slot / 1000),
                    due.attempt,
                )
                return
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
            trigger = RERUN if backed.reason == LOST else RETRY
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
            retry = Backoff(start=DUE_CHECK_RETRY, cap=DUE_CHECK_RETRY)
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
                    await retry.sleep()
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
    other sidecars read it there before they act on the key (sidecar/run/duecheck.py).
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
