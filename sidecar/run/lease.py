"""Run leases on the state bucket (docs/GUARANTEES.md): held while a run runs, lost at expiry.

``async with Lease(...)``: the key (``run.<job>.<slot>[.<attempt>]``, or
``lock.<job>`` for ``overlap: skip``) is created before the trigger with a
TTL of ``nats.lease_ttl``, renewed every ``lease_ttl / 3`` by compare-and-set
with a fresh TTL, and deleted by its revision when the block ends (after the
result was published). A renewal that fails is logged and counted; it never
interrupts the trigger. A CAS conflict is not taken at its word: replicated
buckets answer 10164 as well as 10071, and spurious conflicts were reported
under load (nats-io/nats-server#7281), so the key is read again and the lease
is lost only when the owner or token stored there is not ours.

The keys are written by sidecar/store/kv.py; an expired lease is judged and
recorded ``lost`` by sidecar/run/lostruns.py.

A lock (and a slot of a concurrency limit, ``conc.<key>.<n>``) is always
written with a TTL. One found without a TTL, or with one
longer than any sidecar's lease (``kv.lock_ttl_limit``), was written by hand:
it would hold the job for ever. It is hostile input, counted
(``hostile_input_total{what="lock_key"}``), logged once, and deleted by its
revision (that value only, by compare-and-set) so that the lock can be taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sidecar.config.job_entry import LOCKED
from sidecar.core import failpoints
from sidecar.core.backoff import Backoff
from sidecar.core.bounds import slot_ms
from sidecar.core.clock import Clock, rfc3339
from sidecar.core.errors import CasConflict, KeyHeld, Untimed
from sidecar.core.tasks import TaskSet
from sidecar.obs.ratelog import RateLimitedLog
from sidecar.store.kv import Keys, lock_ttl_limit, same_owner, until_answered
from sidecar.when.attempts import lock_key, renew_every, run_key

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.obs.metrics import Metrics
    from sidecar.run.claim import Claim

log = logging.getLogger(__name__)

# The longest a won run waits for its run lease before it triggers the app
# (``Lease.start``); the create goes on meanwhile. The state bucket's stream has
# a Raft leader of its own: when that leader is lost and the claims' is not, a
# new one takes the election timeout (4-9 s), and a run that waited for its
# lease until slot + max_late was never sent (found by the nemesis).
RUN_LEASE_WAIT = 1.0
# After a spurious CAS conflict, the renewal is asked again after this, doubled
# for each further one in a row (up to lease_ttl / 3).
SPURIOUS_WAIT = 0.02

# A forged lock without a TTL is said once a minute per key, not once per slot.
_untimed_log = RateLimitedLog(log)
# A run lease made by a loser for a winner that died before its own existed
# (sidecar/run/claimwindow.py) names its maker here: the winner, woken late,
# finds it and does not run.
JUDGED_BY = "judged_by"
# The same run key made by a lock job's winner that took long between its claim
# and its lock (claimwinner.py ``lock_judged``): it shuts the judges out and
# names the lock that covers the run; its expiry is no lost run (lostruns.py).
COVERED_BY = "covered_by"

# The record's error of a replaced run starts with this (no retry follows it).
REPLACED = "replaced"
# Leases that must carry a TTL a sidecar writes: one without is forged, refused and
# taken (the locks of overlap, the slots of concurrency limits: sidecar/run/concurrency.py).
TIMED = ("lock.", "conc.")
# What became of a won slot that found the lock held.
TAKEN, KEPT, SKIPPED = "taken", "kept", "skipped"


def uses_lock(job: JobConfig) -> bool:
    """Whether every run of the job holds ``lock.<job>`` (skip, replace, buffer_one)."""
    return job.overlap in LOCKED


class Lease:
    """``async with Lease(...)``: hold `key` while the block runs (see the module doc)."""

    def __init__(
        self,
        keys: Keys,
        key: str,
        value: dict[str, Any],
        ttl: float,
        metrics: Metrics,
        clock: Clock,
        deadline: float,
        marker: int = 0,
    ) -> None:
        self.keys = keys
        self.marker = marker  # the revision of the key's last marker, when known
        self.released = 0  # the revision of the delete marker that released it
        self.key = key
        self.value = value
        self.ttl = ttl
        self.metrics = metrics
        self.clock = clock
        self.deadline = deadline  # monotonic: how long the create may be retried
        self.job = str(value.get("job", ""))
        self.revision = 0
        self.lost = False
        self.renewals = 0
        self.renewed_at = 0.0  # monotonic time of the last write that set the TTL
        self.created = False
        # Its run was judged lost before the lease existed: the key holds a
        # judge's copy of it (JUDGED_BY), and the run must not start.
        self.judged = False
        # The key is held by another claim's run of the same slot (a backfill of
        # it): this run goes without its lease, unless it came late (job.py).
        self.elsewhere = False
        # Set when the create got through or the run must not start (judged lost):
        # what ``start`` waits for beside its task, a future, not a task of its own.
        self._created: asyncio.Future[None] | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._tasks = TaskSet("a lease", say=False)

    async def __aenter__(self) -> Lease:
        """Create the key; KeyHeld when it is live, NATS errors when no answer came."""
        self.revision = await until_answered(
            f"lease {self.key}", self._create, self.clock, self.deadline
        )
        self.renewed_at = self.clock.monotonic()
        self.created = True
        self._renewer = self._tasks.spawn(self._renew())
        return self

    async def start(self, wait: float) -> bool:
        """Create the key without holding the run up: True when it was created
        within `wait` seconds.

        For a run lease (not a lock): the create is asked again in the background
        while the run goes on, until it is created (then renewed as usual) or the
        block ends (``__aexit__``). A run started without its lease is not seen
        lost if its runner dies before the create gets through; a run held back
        until slot + max_late is never sent at all.
        """
        done = self._created = asyncio.get_running_loop().create_future()
        self._renewer = self._tasks.spawn(self._create_then_renew())
        try:
            await asyncio.wait(
                {self._renewer, done}, timeout=wait, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            done.cancel()
        if not self.created and not self.judged:
            log.warning(
                "lease %s not created within %.1fs; running, creating it meanwhile", self.key, wait
            )
        return self.created

    async def _create(self) -> int:
        if failpoints.ENABLED:
            await failpoints.hit("lease.create")
        if not self.key.startswith(TIMED):
            return await self.keys.create(self.key, self.value, self.ttl, self.marker)
        limit = lock_ttl_limit(self.ttl)
        try:
            return await self.keys.create(self.key, self.value, self.ttl, self.marker, limit)
        except Untimed as forged:
            what = "conc_key" if self.key.startswith("conc.") else "lock_key"
            self.metrics.hostile_input_total.labels(what=what).inc()
            _untimed_log.warning(
                f"untimed {self.key}",
                "state bucket: %s refused: held without a TTL a sidecar writes (Nats-TTL "
                "%s, at most %gs); it is hostile input (whoever may write the state bucket "
                "wrote it): deleted, the lock taken",
                self.key,
                repr(forged.ttl)[:40],
                limit,
            )
            # That value only: a lock taken meanwhile is someone's real one.
            with contextlib.suppress(CasConflict):
                self.marker = await self.keys.delete(self.key, forged.revision)
            return await self.keys.create(self.key, self.value, self.ttl, self.marker, limit)

    def _set_created(self) -> None:
        if self._created is not None and not self._created.done():
            self._created.set_result(None)

    async def _create_then_renew(self) -> None:
        began = self.clock.monotonic()
        try:
            self.revision = await until_answered(
                f"lease {self.key}", self._create, self.clock, math.inf
            )
        except KeyHeld as held:
            if held.value.get(JUDGED_BY) and held.value.get("token") == self.value.get("token"):
                self.judged = True  # start() returns at once, and the run is not made
                self._set_created()
                log.warning(
                    "lease %s: %s judged this run lost before its lease existed",
                    self.key,
                    str(held.value.get(JUDGED_BY))[:100],
                )
                return
            self.elsewhere = True
            log.warning("lease %s exists already; running without it", self.key)
            return
        except Exception as exc:  # a definite refusal: the run goes on without it
            log.warning("lease %s not created (%r); running without it", self.key, exc)
            return
        self.renewed_at = self.clock.monotonic()
        self.created = True
        self._set_created()
        took = self.renewed_at - began
        if took > RUN_LEASE_WAIT:
            log.info("lease %s created after %.1fs, while its run went on", self.key, took)
        await self._renew()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Not a single cancel: on Python 3.11 one that lands as a renewal's
        # answer arrives is lost (see sidecar/core/tasks.py); the renewer then
        # renewed for ever, the run never ended, and once a renewal failed
        # the lease expired into a lost record for a run that had succeeded.
        await self._tasks.cancel()
        if self.lost:
            return  # not ours any more: leave whatever is there
        if not self.created:
            # Never created (``start``): nothing to release. A create still in
            # flight may land and expire; its run's result is stored by then.
            return
        silent = self.clock.monotonic() - self.renewed_at
        if silent > self.ttl:
            # The process was stopped or its loop stalled: the key expired
            # meanwhile and may be someone else's now.
            self._failed(f"not renewed for {silent:.1f}s, longer than lease_ttl: it expired")
            self.lost = True
            return
        try:
            deadline = self.clock.monotonic() + max(self.ttl, 5.0)
            for _ in range(3):
                try:
                    await until_answered(
                        f"lease {self.key} delete",
                        functools.partial(self._delete, self.revision),
                        self.clock,
                        deadline,
                    )
                    return
                except CasConflict:
                    if await self._still_ours() is False:
                        self._failed("it changed before it was released")
                        return
        except Exception as exc:  # it expires on its own: lost runs check the result first
            log.warning("lease %s not released: %r; it expires in %gs", self.key, exc, self.ttl)

    async def _delete(self, revision: int) -> int:
        self.released = await self.keys.delete(self.key, revision)
        return self.released

    async def _renew(self) -> None:
        every = renew_every(self.ttl)
        wait = every
        # Spurious conflicts in a row: renew again soon, backing off while they repeat.
        spurious = Backoff(start=min(SPURIOUS_WAIT, every), cap=every)
        while True:
            await asyncio.sleep(wait)
            wait = every
            try:
                sent = self.clock.monotonic()
                self.revision = await self.keys.renew(self.key, self.value, self.revision, self.ttl)
                self.renewed_at = sent
                self.renewals += 1
                spurious.reset()
            except CasConflict:
                ours = await self._still_ours()
                if ours is None:
                    wait = min(every, 1.0)
                elif ours:
                    # A spurious conflict: renew soon with the revision read. Right
                    # after a leader change that read can be stale and conflict
                    # again: back off while they repeat (it spun at 1,000 a second).
                    wait = spurious.next()
                else:
                    self._failed("the key was taken over or expired")
                    self.lost = True
                    return
            except Exception as exc:  # NATS away: try again sooner, the TTL still runs
                self._failed(repr(exc))
                wait = min(every, 1.0)

    async def _still_ours(self) -> bool | None:
        """After a CAS conflict: is the stored value still our owner and token?

        None when the key could not be read (not known lost: asked again soon).
        """
        try:
            last = await self.keys.last(self.key)
        except Exception as exc:
            self._failed(f"conflict, then the key could not be read: {exc!r}")
            return None
        if last is None:
            # No message at all, not even a marker: the bucket was deleted (and made
            # again) or purged under us. The run is alive: take the lease again, so
            # that the others, who judge such leases after lease_ttl, see it is.
            try:
                self.revision = await self.keys.create(self.key, self.value, self.ttl)
            except Exception as exc:
                self._failed(f"the key vanished with its bucket and was not taken again: {exc!r}")
                return None if not isinstance(exc, KeyHeld) else False
            log.warning(
                "lease %s vanished without a trace (bucket replaced?); taken again", self.key
            )
            return True
        revision, value = last
        if value is None:
            return False
        mine = same_owner(value, self.value)
        if mine:
            log.info("lease %s: a spurious CAS conflict; still ours at %d", self.key, revision)
            self.revision = revision
        return mine

    def _failed(self, why: str) -> None:
        self.metrics.lease_renewal_failures_total.labels(job=self.job).inc()
        log.warning(
            "lease %s: renewal failed (%s); the run goes on, it may be recorded lost",
            self.key,
            why,
        )


def run_lease(
    keys: Keys,
    job: JobConfig,
    claim: Claim,
    instance: str,
    ttl: float,
    metrics: Metrics,
    clock: Clock,
    deadline: float,
    markers: dict[str, int],
) -> Lease:
    """The lease of a won claim: ``lock.<job>`` for ``overlap: skip``, ``replace`` and
    ``buffer_one`` (sidecar/run/overlap.py), else the run's
    own ``run.<job>.<slot>[.<attempt>]``. `markers`: the last marker revision of
    each key, as the watch saw them."""
    key = lock_key(job.name) if uses_lock(job) else run_key(job.name, claim.slot, claim.attempt)
    value = {
        "job": job.name,
        "slot": claim.slot,
        "attempt": claim.attempt,
        "token": claim.token,
        "instance": instance,
        "started_at": rfc3339(clock.wall()),
        # The claim's sequence: a lost-run check reads the results
        # stored since, not only the newest (runs may overlap).
        "fence": claim.seq,
    }
    return Lease(keys, key, value, ttl, metrics, clock, deadline, markers.get(key, 0))


def overlap_error(holder: dict[str, Any]) -> tuple[str, bool]:
    """What a skipped run's record says of the run holding ``lock.<job>``, and whether
    the holder's slot was hostile (read from NATS: range-checked)."""
    running = slot_ms(holder.get("slot"))
    since = holder.get("started_at", "?")
    if running is None:
        return "overlap: a run of this job is still alive", holder.get("slot") is not None
    return (
        f"overlap: slot {rfc3339(running / 1000)} is still running on "
        f"{str(holder.get('instance', '?'))[:100]} since {str(since)[:40]}",
        False,
    )
