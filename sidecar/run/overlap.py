"""Overlap policies beyond skip: ``replace`` and ``buffer_one`` (docs/CONFIG.md).

All three policies that keep runs apart (``skip``, ``replace``, ``buffer_one``)
hold the fleet-wide ``lock.<job>`` of ``skip`` for every run (sidecar/run/lease.py):
no two runs of such a job are ever alive at once. What happens when a won
slot finds the lock held:

* ``replace``: the winner asks the holder to stop by writing
  ``stop.<job>`` (the holder's run token, the asking slot and claim
  sequence; TTL ``lease_ttl``). Every sidecar watches the state bucket; the
  one running that token sends the app the cancel request (``jobs[].cancel``,
  docs/TRIGGER.md), gives the run ``cancel.grace`` to answer, then closes
  its connection, records it ``failed`` with error ``replaced: ...`` (no
  retry), and releases the lock. The winner takes the lock as soon as it is
  free and runs; if it is not free by slot + ``max_late``, the slot is
  recorded ``skipped`` (reason ``overlap``). When several slots wait, the
  newest wins: an older waiter that sees a newer slot's stop request gives up
  (skipped, overlap).
* ``buffer_one``: the winner keeps its slot in ``buffer.<job>``, created by
  compare-and-set (no TTL): one slot is kept, the others are skipped
  (overlap). When the lock is released (or expires: a dead runner), every
  sidecar that sees it gone while ``buffer.<job>`` exists deletes the key by
  its revision: exactly one succeeds and runs the kept slot, with the kept
  claim's token (the slot's claim was won once, by its winner), trigger
  ``scheduled`` and the header ``X-Anarchon-Buffered: true``. The kept run
  takes the lock like any run: should another run hold it by then, it is kept
  again (or skipped when another slot is kept already). A kept slot is not run
  while its job is paused (recorded ``skipped``, paused), and one older than
  ``kept_window`` is recorded ``skipped`` (late).

Both keys can be written by anyone who may write the state bucket: neither is
acted on before the stream backs it (sidecar/run/overlapcheck.py). A kept
slot's run id, fence, attempt and trigger are its stored claim's; a stop
request is honoured only for a newer claim of the job that is still waiting.
Any other value is counted (``hostile_input_total{what="buffer_key"}`` or
``"stop_key"``), logged once and deleted, and nothing of it is done.

This module joins the two to the job loops and the watch: ``buffer_one``'s part
is sidecar/run/keptslots.py, ``replace``'s sidecar/run/stoprequests.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from sidecar.run.claim import Claim
from sidecar.run.keptslots import KeptSlots
from sidecar.run.overlapcheck import KeyChecks
from sidecar.run.stoprequests import StopRequests
from sidecar.run.trigger import Trigger, TriggerResult

if TYPE_CHECKING:
    from sidecar.config.jobset import Change
    from sidecar.config.load import JobConfig
    from sidecar.run.context import Context


class Overlap:
    """One sidecar's part in ``replace`` and ``buffer_one`` (see the module doc): the
    watch's changes, a won slot that finds the lock held and a run, each handed to the
    policy's part."""

    def __init__(
        self,
        ctx: Context,
        trigger: Trigger,
        run_kept: Callable[[JobConfig, Claim, str | None], bool],
    ) -> None:
        self.fleet = fleet = ctx.fleet
        # By name: the sidecar's job set, the state bucket's jobs as they come and go.
        self.jobs = ctx.jobs
        # The checks of buffer.* and stop.* against the stream, shared by both parts.
        checks = KeyChecks(ctx)
        self.kept = KeptSlots(ctx, checks, run_kept)
        self.stops = StopRequests(ctx, checks, trigger)
        # Only the keys `changed` acts on (sidecar/fleet/listeners.py).
        fleet.key_listeners.append(self.changed, "lock.", "buffer.", "stop.")
        # A job that is (or becomes) buffer_one: the run holding its lock now is never
        # a kept slot's, whatever policy it was claimed under.
        self.jobs.subscribe(self._jobs_changed)
        for job in self.jobs.values():
            if job.overlap == "buffer_one":
                self.kept.saw_lock(job.name)

    def _jobs_changed(self, change: Change) -> None:
        for job in change.put:
            if job.overlap == "buffer_one":
                self.kept.saw_lock(job.name)
            else:
                self.kept.forget(job.name)
        for name in change.removed:
            self.kept.forget(name)

    def changed(self, key: str) -> None:
        """A key of the state bucket changed ("" after a re-sync)."""
        kind, _, name = key.partition(".")
        if key == "":
            for each in self.jobs.values():
                if each.overlap == "buffer_one":
                    self.kept.saw_lock(each.name)
                    self.kept.maybe_take(each.name)
            self.stops.resynced()
            return
        job = self.jobs.get(name)
        if job is None:
            return
        if kind == "lock":
            self.stops.lock_changed(name)
            if job.overlap == "buffer_one":  # its lock's holders: never a kept slot's run
                self.kept.saw_lock(name)
                self.kept.maybe_take(name)
        elif kind == "buffer" and job.overlap == "buffer_one":
            self.kept.maybe_take(name)
        elif kind == "stop" and job.overlap == "replace":
            self.stops.changed(key)

    async def held(
        self,
        job: JobConfig,
        claim: Claim,
        holder: dict[str, Any],
        deadline: float,
        take: Callable[[], Awaitable[object]],
    ) -> tuple[str, str]:
        """A won slot of a ``replace`` or ``buffer_one`` job found ``lock.<job>`` held by
        `holder`. (TAKEN, ""): `take()` got the lock, run it; (KEPT, ""): kept in
        ``buffer.<job>``, nothing more to do now; (SKIPPED, why): record it skipped."""
        if job.overlap == "buffer_one":
            return await self.kept.keep(job, claim, holder)
        return await self.stops.replace(job, claim, holder, deadline, take)

    def request_job(self, job: JobConfig, claim: Claim) -> JobConfig:
        """The job as its request is sent: a kept run's says it was kept."""
        return self.kept.request_job(job, claim)

    async def run(
        self,
        job: JobConfig,
        claim: Claim,
        fire: Coroutine[Any, Any, TriggerResult],
        started: tuple[float, float],
    ) -> tuple[TriggerResult, bool]:
        """Await `fire`; for ``replace``, stop it when a newer slot asks (True: replaced).

        `started`: when the run's request went out, (wall, monotonic): a run cut off
        is recorded from then to the cut."""
        if job.overlap == "buffer_one":  # it holds the lock: never a kept slot's claim
            self.kept.holds(job.name, claim.token)
        if job.overlap != "replace":
            try:
                return await fire, False
            finally:
                self.kept.ended(claim.token)
        self.kept.ended(claim.token)
        return await self.stops.run(job, claim, fire, started)


__all__ = ["Overlap"]
