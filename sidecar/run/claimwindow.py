"""The claim-to-lease window: a winner that died before its run lease existed.

A won claim's runner creates its run lease (sidecar/run/lease.py) right after
the claim; a runner killed in between leaves no lease to expire, so lost-run
judging (sidecar/run/lostruns.py) never sees it. The losers close that window
(docs/GUARANTEES.md, "Lost runs"):

1. A loser knows the winning claim's sequence from its duplicate ack. When the
   run's lease (``run.<job>.<slot>[.<attempt>]``) is in its view, or was seen
   lately, the usual judging covers the run: nothing more is done, nothing is
   read. This is the case of nearly every slot.
2. Otherwise it waits ``lease_ttl`` for the lease, then reads the stored claim
   (its token, instance and ``claimed_at``) and the results stored since it.
   A result of that run ends the judging (its lease came and went unseen).
3. The winner is judged dead only on evidence: its ``instance.<id>`` presence
   started after the claim (it restarted), or its presence stayed away for
   ``ABSENT_GRACE`` while this sidecar's own presence was renewed meanwhile
   (the bucket answered, the watch delivered). A runner whose lease is only
   late (the bucket without a leader, a frozen runner) keeps its presence, or
   gets it back, and is never judged.
4. The judge then creates the run's lease itself, a copy naming it
   (``judged_by``), with the bucket's compare-and-set: if the winner's own
   create got there first the judge stops; otherwise the winner's create now
   fails, and a winner that wakes finds the copy and does not run. Only one
   judge's create succeeds: it records ``lost`` with the attempt's usual id
   (de-duplicated, rerun once with ``on_lost: rerun``, as for an expired
   lease). The copy expires later into the usual judging, which finds the
   record (or makes it, if the judge died before it could).

A winner woken after the copy expired (frozen longer than ``lease_ttl`` past
the judging) creates its lease, so it also asks, when its claim-to-lease time
was long (more than ``lease_ttl / 2``, half what any judge waits), whether
its run was recorded lost, and does not run if it was (``judged_lost``; the
winner's side is sidecar/run/claimwinner.py).

Jobs whose runs hold ``lock.<job>`` (``overlap: skip``, ``replace``,
``buffer_one``) are judged the same way, with these differences:

* The run's lease is known when ``lock.<job>`` holds (or was seen holding) the
  claim's token, or ``buffer.<job>`` keeps it; a slot its winner recorded
  skipped has a result. A winner waiting for the lock (``replace``) keeps its
  presence, so the lock's absence is never evidence by itself.
* The judge's one-winner marker is still the run key's copy (the winner never
  makes that key for its own run), so the winner, when its claim-to-lock time
  was long (more than ``lease_ttl / 2``), creates that key itself with the
  bucket's compare-and-set before its request (``lock_judged``): a judge's
  copy there, or a lost record, and it does not run; its own marker shuts the
  judges out (``covered_by``: its expiry is not judged, the lock's is).
  Before it asks for the lock, such a winner also looks for a judge's copy or
  the lost record (``judged_before_lock``): a stale winner must not take the
  lock from the rerun, record the judged attempt ``skipped`` as well, keep it
  in ``buffer.<job>`` or ask a live run to stop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any

from sidecar.core.backoff import Backoff
from sidecar.core.bounds import attempt_no, seq_no, slot_ms
from sidecar.core.clock import parse_rfc3339
from sidecar.core.errors import KeyHeld
from sidecar.core.tasks import TaskSet
from sidecar.core.wakers import Wakers
from sidecar.core.wire import instance_key, run_key
from sidecar.run.claimwinner import COPY_EXTRA, WinnerSide
from sidecar.run.lease import JUDGED_BY, uses_lock
from sidecar.store.kv import until_answered
from sidecar.store.state import EXPIRED, PRESENCE_RENEW, Entry, Removal
from sidecar.when.attempts import lock_key

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.claim import Claim
    from sidecar.run.context import Context
    from sidecar.run.lostruns import LostRuns

log = logging.getLogger(__name__)

# A winner's presence must stay away this long (two renewals and a margin)
# before it is taken for dead: a presence that expired while the bucket had no
# leader comes back at the live runner's next renewal.
ABSENT_GRACE = 2 * PRESENCE_RENEW + 1.0
# The keys that hold a run's lease or mark it (run.*, lock.*, buffer.*).
HELD = ("run.", "lock.", "buffer.")
# A judge looks again at least this often (and sees the drain start).
POLL = 1.0
# A judge whose winner lives on without a lease reads the results again this often.
RECHECK = 30.0
# A judge whose reads failed begins again after this long, doubling up to RETRY_CAP.
RETRY_START = 1.0
RETRY_CAP = 15.0
# A judge gives up after this long (its winner alive, without lease nor result).
JUDGE_MAX = 3600.0
# Run keys the watch delivered are remembered this much longer than a job's
# jitter + max_late: a loser's ack may come after the winner's short run ended.
SEEN_MARGIN = 60.0


class ClaimWindow(WinnerSide):
    """Judges the winners of claims this sidecar lost (see the module doc); its
    winner's side (whether a run won here was judged meanwhile) is WinnerSide's."""

    def __init__(self, ctx: Context, lost: LostRuns) -> None:
        super().__init__(ctx, lost)
        self.claimer = ctx.claimer
        self.stopping = ctx.stopping
        self.tasks = TaskSet("judging a claim's winner")
        # Run keys the watch delivered (put or removed), oldest first: monotonic time.
        self._seen: dict[str, float] = {}
        self.jobs = ctx.jobs
        # Judges waiting for a key to change: woken when the watch delivers it.
        self._waiting = Wakers()
        # Claims lost here whose run lease was not seen yet, by that key, oldest
        # first: (job, claim, monotonic time lost). A dict entry, not a task: the
        # lease of nearly every one is delivered within milliseconds.
        self._pending: dict[str, tuple[JobConfig, Claim, float]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def delivered(self, key: str) -> None:
        """The watch delivered `key` ("" after a re-read): wake who waits for it."""
        if key.startswith(HELD):
            # Which claim's run holds it: the fence every lease, kept slot and judge's
            # copy carries is that claim's sequence, which a loser knows from its ack
            # (a backfill of the same slot holds the same run key under its own).
            entry = self.view.keys.get(key)
            fence = seq_no(entry.value.get("fence")) if entry is not None else None
            if fence is not None:
                seen = _mark(key, fence)
                now = self.clock.monotonic()
                self._seen.pop(seen, None)
                self._seen[seen] = now
                # Kept as long as a claim of any job may come (the job set's bound).
                horizon = now - (SEEN_MARGIN + self.ttl + self.jobs.latest_claim)
                while self._seen:
                    first = next(iter(self._seen))
                    if self._seen[first] >= horizon:
                        break
                    del self._seen[first]
                self._pending.pop(seen, None)
        if key:
            self._waiting.wake(key)
        else:
            self._waiting.wake_all()

    def lost_claim(self, job: JobConfig, claim: Claim) -> None:
        """This sidecar lost `claim`: judge its winner unless its lease is known."""
        if claim.seq <= 0 or self.stopping.is_set() or self.keys() is None:
            return
        if self._known(job, claim):
            return
        held = (
            lock_key(job.name) if uses_lock(job) else run_key(job.name, claim.slot, claim.attempt)
        )
        self._pending[_mark(held, claim.seq)] = (job, claim, self.clock.monotonic())
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = self.tasks.spawn(self._sweep())

    async def _sweep(self) -> None:
        """Judge each pending claim whose lease did not come within lease_ttl."""
        while self._pending and not self.stopping.is_set():
            mark, (job, claim, lost_at) = next(iter(self._pending.items()))
            wait = lost_at + self.ttl - self.clock.monotonic()
            if wait > 0:
                await asyncio.sleep(min(wait, POLL))
                continue
            del self._pending[mark]
            if not self._known(job, claim):
                key = run_key(job.name, claim.slot, claim.attempt)
                self.tasks.spawn(self._judge(job, claim, key, lost_at))
        self._pending.clear()  # stopping: nothing more is judged

    def _known(self, job: JobConfig, claim: Claim) -> bool:
        """Whether the winning claim's lease (or a mark of its run: a kept slot, a
        judge's copy, a winner's marker) is in the view or was seen: a key whose
        ``fence`` is that claim's sequence."""
        keys = [run_key(job.name, claim.slot, claim.attempt)]
        if uses_lock(job):
            # buffer.<job>: a slot buffer_one kept (sidecar/run/keptslots.py buffer_key).
            keys += [lock_key(job.name), f"buffer.{job.name}"]
        for held in keys:
            entry = self.view.keys.get(held)
            if entry is not None and seq_no(entry.value.get("fence")) == claim.seq:
                return True
            if _mark(held, claim.seq) in self._seen:
                return True
        return False

    async def _judge(self, job: JobConfig, claim: Claim, key: str, lost_at: float) -> None:
        """``_judged``, begun again after an error (the stream or the bucket without a
        leader: every loser's judge may meet it at once, so none may give up on it),
        until the judging's hour is over. Each step is safe to make again: reads, the
        wait for evidence, the copy's compare-and-set, the de-duplicated record."""
        retry = Backoff(start=RETRY_START, cap=RETRY_CAP, jitter=0.5)
        failures = 0
        while not self.stopping.is_set():
            try:
                await self._judged(job, claim, key, lost_at)
                return
            except Exception as exc:
                failures += 1
                left = lost_at + JUDGE_MAX - self.clock.monotonic()
                level = logging.WARNING if failures == 1 or left <= 0 else logging.DEBUG
                log.log(level, "job %s slot %s: judging its winner failed (%r); %s", job.name,
                        claim.slot, exc, "given up" if left <= 0 else "trying again")  # fmt: skip
                if left <= 0:
                    return
                await retry.sleep(at_most=left)

    async def _judged(self, job: JobConfig, claim: Claim, key: str, lost_at: float) -> None:
        winner = _winner(await self.claimer.stored_claim(claim.seq), claim)
        if winner is None:
            log.debug("job %s slot %s: the stored claim is not one to judge", job.name, claim.slot)
            return
        token, runner, claimed_at = winner
        if (await self.lost.recorded(job.name, token, claim.seq))[0]:
            return
        log.info(
            "job %s slot %s: no lease of its winner %s after %gs; waiting for it, or for its death",
            job.name,
            claim.slot,
            runner[:100],
            self.ttl,
        )
        how = await self._dead(key, runner, claimed_at, lost_at + JUDGE_MAX, job, token, claim)
        if how is None:
            return
        if (await self.lost.recorded(job.name, token, claim.seq))[0]:
            return
        keys = self.keys()
        if keys is None:
            return  # the bucket cannot hold leases now: nobody's lease is judged
        value: dict[str, Any] = {
            "job": job.name,
            "slot": claim.slot,
            "attempt": claim.attempt,
            "token": token,
            "instance": self.instance,  # not the winner's: its own create must not take it
            "runner": runner,
            "started_at": str(claimed_at[1]),
            "fence": claim.seq,
            JUDGED_BY: self.instance,
        }
        create = functools.partial(keys.create, key, value, self.ttl + COPY_EXTRA)
        while True:
            try:
                # Asked again while NATS gives no answer: a create stored but answered
                # late is found ours (same instance and token) by the next one.
                revision = await until_answered(
                    f"lease {key}", create, self.clock, self.clock.monotonic() + self.ttl
                )
                break
            except KeyHeld as held:
                if seq_no(held.value.get("fence")) == claim.seq:
                    return  # the winner's lease (alive after all), or another judge's copy
            # Another claim's run holds the slot's run key (a backfill of the slot, or
            # the slot's scheduled run when a backfill's taker is judged): the copy is
            # made once it is gone, so that a winner that wakes meanwhile still finds
            # the key held and does not run late (sidecar/run/job_loop.py).
            log.info("%s held by another run of the slot; judged once it is gone", key)
            while key in self.view.keys:
                if self.stopping.is_set() or self.clock.monotonic() >= lost_at + JUDGE_MAX:
                    return
                await self._waiting.wait((key,), POLL)
        log.warning(
            "lease %s: instance %s %s before it took it; recording its run lost",
            key,
            runner[:100],
            how,
        )
        why = f"lease {key} never made: instance {runner} {how}; judged by {self.instance}"
        removal = Removal(key, Entry(value, revision), EXPIRED, self.clock.wall())
        await self.lost.record_lost(job, removal, why)

    async def _dead(
        self,
        key: str,
        runner: str,
        claimed_at: tuple[float, str],
        until: float,
        job: JobConfig,
        token: str,
        claim: Claim,
    ) -> str | None:
        """How the winner is known dead ("restarted", "left the fleet"); None when its
        lease or result appeared, or the judging ended without evidence."""
        presence = instance_key(runner)
        mine = instance_key(self.instance)
        absent_since: float | None = None
        own_then = 0
        recheck = self.clock.monotonic() + RECHECK
        while not self.stopping.is_set():
            now = self.clock.monotonic()
            if now >= until:
                log.info("job %s slot %s: its winner %s neither ran nor died", job.name,
                         claim.slot, runner[:100])  # fmt: skip
                return None
            if self._known(job, claim):
                return None  # its lease: the usual judging covers the run
            if now >= recheck:
                recheck = now + RECHECK
                if (await self.lost.recorded(job.name, token, claim.seq))[0]:
                    return None
            entry = self.view.keys.get(presence)
            own = self.view.keys.get(mine)
            if entry is not None:
                absent_since = None
                started = _epoch(entry.value.get("started_at"))
                if started is not None and started > claimed_at[0]:
                    return "restarted"
            elif absent_since is None:
                absent_since, own_then = now, own.revision if own is not None else 0
            elif now - absent_since >= ABSENT_GRACE and own is not None and own.revision > own_then:
                return "left the fleet"
            await self._waiting.wait((key, presence, mine), POLL)
        return None


def _mark(key: str, fence: int) -> str:
    """A held key as seen for one claim's run: ``<key>#<its claim's sequence>``."""
    return f"{key}#{fence}"


def _epoch(text: object) -> float | None:
    """An RFC 3339 time read from NATS as epoch seconds; None when it is not one."""
    if not isinstance(text, str):
        return None
    try:
        return parse_rfc3339(text[:40])
    except (ValueError, OverflowError, OSError):
        return None


def _winner(
    stored: dict[str, object] | None, claim: Claim
) -> tuple[str, str, tuple[float, str]] | None:
    """(token, instance, (claimed_at, as written)) of the stored claim that beat
    `claim`; None when it is not a claim of the same job, slot and attempt (read
    from NATS: every field is checked), or is a skipped slot's record (no run,
    no lease: sidecar/run/skips.py)."""
    if stored is None or "skipped" in stored:
        return None
    token, runner, claimed = stored.get("token"), stored.get("instance"), stored.get("claimed_at")
    at = _epoch(claimed)
    if (
        not isinstance(token, str)
        or not isinstance(runner, str)
        or at is None
        or stored.get("job") != claim.job
        or slot_ms(stored.get("slot")) != claim.slot
        or attempt_no(stored.get("attempt"), 1) != claim.attempt
    ):
        return None
    return token, runner, (at, str(claimed))
