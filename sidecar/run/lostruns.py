"""Lost runs (docs/GUARANTEES.md): a lease that expired is a run whose runner is gone.

Every sidecar sees a lease expire (a ``MaxAge`` marker, not a delete) and
publishes a ``lost`` result for that run with ``Nats-Msg-Id:
<job>:<slot>:<attempt>:lost`` (sidecar/run/record.py); exactly one is stored and
the sidecar whose copy was stored counts it and, with ``on_lost: rerun``,
has the next attempt made due (``rerun``, sidecar/run/retries.py). A result of
the run stored meanwhile wins: it is looked for before and after.

Every task started here is in ``tasks``: the daemon's drain awaits them,
bounded, then cancels what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from sidecar.core.backoff import Backoff
from sidecar.core.bounds import attempt_no, epoch_s, seq_no, slot_ms
from sidecar.core.clock import parse_rfc3339
from sidecar.core.tasks import TaskSet
from sidecar.core.wire import LOST, TRANSIENT, results_subject
from sidecar.obs.ratelog import RateLimitedLog
from sidecar.run.claim import token_of
from sidecar.run.lease import COVERED_BY
from sidecar.run.record import Outcome, Recorder
from sidecar.store.kv import last_msg
from sidecar.store.state import BUCKET_REPLACED, EXPIRED, UNSEEN, Removal, View
from sidecar.when.attempts import is_lease_key, lease_job, renew_every

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.context import Context

log = logging.getLogger(__name__)

# A lost record is checked against the results again at once this many times when
# results keep coming in between the check and the record, then after a backoff.
RECHECKS = 5
# A lease that vanished with its bucket is judged this long after lease_ttl and
# a renewal have passed (a renewal's round trip and the watch's delivery).
REPLACED_GRACE = 2.0
# At most this many judges read the results and publish at once (the others wait).
LOOKS_AT_ONCE = 64
# A lost record's publish is asked again this long within one turn of a judge.
PUBLISH_GIVE_UP = 2.0
# A judge whose reads and publish NATS does not answer asks again this long.
JUDGE_GIVE_UP = 60.0
# At most this many results of a job stored since a run's claim are read.
MAX_RESULTS_READ = 10_000


async def scan_results(
    js: JetStreamContext, stream: str, subject: str, token: str, after: int, last: int
) -> bool | None:
    """Whether a result of the run `token` is stored on `subject` after sequence
    `after` and before `last` (the newest, which the caller looked at): True found,
    False not there, None when MAX_RESULTS_READ of them were read without an end
    (what that means is the caller's: sidecar/run/overlapcheck.py ``has_result``)."""
    seq = after + 1
    for _ in range(MAX_RESULTS_READ):
        if seq >= last:
            return False
        try:
            msg = await js.get_msg(stream, seq, subject=subject, next=True)
        except NotFoundError:
            return False
        if int(msg.seq or 0) >= last:
            return False
        if token_of(msg.data or b"") == token:
            return True
        seq = int(msg.seq or 0) + 1
    return None


async def has_result(
    js: JetStreamContext, stream: str, prefix: str, job: str, token: str, after: int | None
) -> tuple[bool, int]:
    """Whether the run `token` of `job` has a result (its own, or a lost record), and
    the sequence of the job's last result (0: none), which a lost record then expects.

    The newest result alone is not enough: runs of a job overlap, and a later
    slot's result hides this run's. With the run's claim sequence (`after`,
    the lease's ``fence``) every result stored since is read; without it
    (a lease written by another implementation) only the newest.
    """
    subject = results_subject(prefix, job)
    newest = await last_msg(js, stream, subject)
    if newest is None:
        return False, 0
    last = int(newest.seq or 0)
    if token_of(newest.data or b"") == token:
        return True, last
    found = await scan_results(js, stream, subject, token, after or last, last)
    return found is True, last


class LostRuns:
    """Records a ``lost`` result for every lease that expired (see the module doc)."""

    def __init__(
        self,
        ctx: Context,
        recorder: Recorder | None = None,
        *,
        judges_foreign: Callable[[Removal], bool] | None = None,
        view: View | None = None,
        rerun: Callable[[JobConfig, int, int, float, int], Awaitable[None]] | None = None,
    ) -> None:
        config, spec = ctx.config, ctx.spec
        self.config = config
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.js = ctx.js
        self.spec = spec
        self.keys = ctx.keys
        self.jobs = ctx.jobs
        self.tasks = TaskSet("recording a lost run")
        # Whether an expired lease of a job not in this config is judged here
        # (sidecar/fleet/orphans.py: when no other live instance runs that job).
        self.judges_foreign = judges_foreign or (lambda removal: False)
        self.view = view  # the live view: leases of a replaced bucket are looked for again
        # Records, counts and says the lost outcome, tells the aftermath (sidecar/run/record.py).
        self.recorder = recorder or Recorder(
            ctx.js, spec.name, spec.prefix, config.instance_id, ctx.metrics
        )
        # on_lost: rerun: (job, slot, attempt, lost at, the lost record's seq) -> the
        # next attempt made due (sidecar/run/retries.py).
        self.rerun = rerun
        # Set: the sidecar drains, no new judging starts (the drain awaits ``tasks``).
        self.stopping = ctx.stopping
        # A judge asking NATS again says so once a minute for all of them.
        self._said = RateLimitedLog(log)
        # The judges asking NATS at once: a sidecar killed in a burst leaves
        # thousands of leases that expire together, on every other sidecar.
        self._looking = asyncio.Semaphore(LOOKS_AT_ONCE)

    def removed(self, removal: Removal) -> None:
        """The view lost `removal.key`; an expired lease of one of our jobs was lost."""
        if not is_lease_key(removal.key) or self.stopping.is_set():
            return
        if removal.entry.value.get(COVERED_BY):
            return  # a lock job's marker (claimwindow.py): its lock is judged instead
        name = lease_job(removal.key) or ""
        job = self.jobs.get(name)
        ended = removal.how in (EXPIRED, UNSEEN)  # UNSEEN: its run's result is looked for
        if job is None:
            # A job not in this config: only its expiry is judged, and only when
            # no other live instance runs it (sidecar/fleet/orphans.py).
            if not ended or not self.judges_foreign(removal):
                return
            coro = self.record_lost(name, removal)
        elif removal.how in (BUCKET_REPLACED, None):
            # Gone without a marker (the bucket replaced or purged, or its marker aged
            # out while this sidecar was away): a live runner takes it again.
            coro = self.replaced(job, removal)
        elif not ended:
            return
        else:
            coro = self.record_lost(job, removal)
        self.tasks.spawn(coro)

    async def replaced(self, job: JobConfig, removal: Removal) -> None:
        """A lease that vanished without a marker (with its bucket, deleted and made
        again, or purged; or seen gone by a re-read after its marker aged out): a live
        runner takes it again at its next renewal (Lease), a dead one cannot. Judged
        once lease_ttl and a renewal have passed: still gone, it is recorded lost, like
        an expired one (the result is looked for first), never left ``running``."""
        ttl = self.config.nats.lease_ttl
        with contextlib.suppress(TimeoutError):  # the drain: not judged here
            await asyncio.wait_for(self.stopping.wait(), ttl + renew_every(ttl) + REPLACED_GRACE)
            return
        if await self._taken_again(removal):
            return  # its runner took it again: alive
        log.warning(
            "lease %s vanished without a marker (%s) and was not taken again within "
            "lease_ttl: its runner is gone",
            removal.key[:200],
            "with the state bucket" if removal.how == BUCKET_REPLACED else "seen by a re-read",
        )
        await self.record_lost(job, Removal(removal.key, removal.entry, EXPIRED, self.clock.wall()))

    async def _taken_again(self, removal: Removal) -> bool:
        """Whether the lease `removal` lost is held again by its run: in the view, or,
        the view not following (it may lack a renewal), as NATS has it."""
        token = removal.entry.value.get("token")
        view = self.view
        if view is not None:
            back = view.keys.get(removal.key)
            if back is not None and back.value.get("token") == token:
                return True
            if view.following:
                return False
        keys = self.keys()
        if keys is None:
            return False
        try:
            last = await keys.last(removal.key)
        except Exception as exc:  # unknown: judged (the run's result is looked for)
            log.debug("lease %s not read: %r", removal.key, exc)
            return False
        return last is not None and last[1] is not None and last[1].get("token") == token

    async def record_lost(
        self, job: JobConfig | str, removal: Removal, why: str | None = None
    ) -> None:
        """Record the run of an expired lease lost; `job` is a name for a job not
        in this config (recorded, never rerun). `why`: the record's error, when
        not the lease's expiry (sidecar/run/claimwindow.py)."""
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
        # NATS busy or away, or results of the job coming in between the look and
        # the lost record (a skip each slot while the dead run's lock is held): asked
        # again for JUDGE_GIVE_UP. Every other sidecar judges it too, but they share the
        # server, and the same results race them all.
        deadline = 0.0  # set at the judge's first turn (it may wait for one)
        backoff = Backoff(start=0.2, cap=5.0, jitter=0.2)
        conflicts = 0
        while True:
            try:
                async with self._looking:
                    if self.stopping.is_set():
                        log.info("lease %s expired; not judged here, stopping", removal.key)
                        return
                    deadline = deadline or self.clock.monotonic() + JUDGE_GIVE_UP
                    recorded, last = await self.recorded(name, token, after)
                    if recorded:
                        log.info("lease %s ended after its run was recorded", removal.key)
                        return
                    stored = await self._publish(
                        name, removal.key, value, slot, attempt, token, at, last, why
                    )
            except TRANSIENT as exc:
                if self.clock.monotonic() + backoff.current > deadline:
                    log.error(
                        "lease %s expired; its run is not recorded lost here, NATS gave no "
                        "answer for %gs: %r",
                        removal.key,
                        JUDGE_GIVE_UP,
                        exc,
                    )
                    return
                self._said.log(
                    logging.INFO,
                    "no answer",
                    "lease %s expired; NATS gave no answer (%r), asking again",
                    removal.key,
                    exc,
                )
                await backoff.sleep(at_most=deadline - self.clock.monotonic())
                continue
            except Exception as exc:  # another sidecar records it; say so here
                log.warning("lease %s expired; recording the run lost failed: %r", removal.key, exc)
                return
            if stored is not None:
                break
            # A result came in between the look and the lost record: look again (at
            # once the first RECHECKS times, then after a backoff's wait).
            conflicts += 1
            log.debug(
                "lease %s: a result came in first (%d); looking again", removal.key, conflicts
            )
            if self.clock.monotonic() + backoff.current > deadline:
                log.error(
                    "lease %s expired; its run is not recorded lost here, results of the "
                    "job kept coming in first for %gs (%d tries)",
                    removal.key,
                    JUDGE_GIVE_UP,
                    conflicts,
                )
                return
            if conflicts >= RECHECKS:
                await backoff.sleep(at_most=deadline - self.clock.monotonic())
        if not stored:
            return
        if isinstance(job, str):
            return  # a job this config does not have: nothing to rerun it with
        if job.on_lost == "rerun" and self.rerun is not None:
            await self.rerun(job, slot, attempt, at, stored)

    async def recorded(self, job: str, token: str, after: int | None) -> tuple[bool, int]:
        """Whether this run has a result (its own, or a lost record), and the sequence
        of the job's last result (0: none), which the lost record then expects
        (``has_result``)."""
        return await has_result(self.js, self.spec.name, self.spec.prefix, job, token, after)

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
        why: str | None = None,
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
        # A judge's lease for a winner that died before its own (claimwindow.py)
        # names the winner as its runner.
        instance = value.get("runner", value.get("instance"))
        outcome = Outcome(
            kind=LOST,
            job=name,
            slot=slot,
            token=token,
            started_at=started_at,
            finished_at=at,
            attempt=attempt,
            instance=str(instance if instance is not None else ""),
            error=why
            or f"lease {key} expired: instance {instance} stopped renewing it "
            f"(lease_ttl {self.config.nats.lease_ttl:g}s); recorded by {self.config.instance_id}",
        )
        # A job of this config (record passes its name): its pings, notifications.
        ours = self.jobs.get(name) if isinstance(job, str) else job
        # Asked again briefly here: a longer wait is record_lost's, out of its turn.
        return await self.recorder.record_lost(ours, outcome, last, PUBLISH_GIVE_UP)
