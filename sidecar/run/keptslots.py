"""``overlap: buffer_one``: the slot kept in ``buffer.<job>`` while a run holds the
lock, and run once by the one sidecar that takes the key when the lock goes.

What the policy does is said in sidecar/run/overlap.py's docstring, which hands
this part the watch's changes, a won slot that found the lock held, and each run
of a ``buffer_one`` job. A kept slot is run from its stored claim, checked
against the stream first (sidecar/run/overlapcheck.py), never from the key.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sidecar.core.bounds import slot_ms
from sidecar.core.clock import rfc3339
from sidecar.core.errors import CasConflict, KeyHeld
from sidecar.run.claim import Claim
from sidecar.run.lease import KEPT, SKIPPED
from sidecar.run.overlapcheck import KeyChecks, StoredClaim, kept_window
from sidecar.when.attempts import lock_key

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.context import Context

log = logging.getLogger(__name__)

# The header of a run kept by ``buffer_one`` and run after the one it fell during.
BUFFERED_HEADER = "X-Anarchon-Buffered"
# The run ids last seen holding each job's lock: a kept slot is never one of them.
HOLDERS_KEPT = 16


def buffer_key(job: str) -> str:
    return f"buffer.{job}"


class KeptSlots:
    """One sidecar's part in ``buffer_one``: keeps a slot, takes and runs a kept one."""

    def __init__(
        self,
        ctx: Context,
        checks: KeyChecks,
        run_kept: Callable[[JobConfig, Claim, str | None], bool],
    ) -> None:
        self.config = ctx.config
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.fleet = ctx.fleet
        self.keys = ctx.keys
        self.spawn = ctx.tasks.spawn
        # By name: the sidecar's job set, the state bucket's jobs as they come and go.
        self.jobs = ctx.jobs
        self.checks = checks
        # Runs a kept slot's claim through the gates of a due run (paused: skipped), or
        # records it skipped with the reason given (late); True when it runs.
        self.run_kept = run_kept
        # Per job, the run ids seen holding its lock (never a kept slot's).
        self._holders: dict[str, collections.deque[str]] = {}
        # Tokens of kept runs this sidecar runs now (their request says so).
        self._buffered: set[str] = set()
        # Jobs whose kept slot this sidecar is checking or taking now, and those whose
        # keys changed meanwhile.
        self._taking: set[str] = set()
        self._again: set[str] = set()

    # ------------------------------------------------------------- who holds the lock

    def saw_lock(self, name: str) -> None:
        """Remember who holds `name`'s lock now: a kept slot never held it."""
        entry = self.fleet.view.keys.get(lock_key(name))
        token = entry.value.get("token") if entry is not None else None
        if isinstance(token, str):
            seen = self._holders.setdefault(name, collections.deque(maxlen=HOLDERS_KEPT))
            if token not in seen:
                seen.append(token)

    def forget(self, name: str) -> None:
        """`name` is no ``buffer_one`` job now (removed, or another policy): its lock's
        holders are not kept."""
        self._holders.pop(name, None)

    def holds(self, name: str, token: str) -> None:
        """The run `token` of `name` holds its lock now: never a kept slot's claim."""
        self._holders.setdefault(name, collections.deque(maxlen=HOLDERS_KEPT))
        self._holders[name].append(token)

    # ------------------------------------------------------- a held lock: keep the slot

    async def keep(self, job: JobConfig, claim: Claim, holder: dict[str, Any]) -> tuple[str, str]:
        """Keep `claim`'s slot in ``buffer.<job>`` to run after `holder`'s run: (KEPT, ""),
        or (SKIPPED, why) when another slot is kept already or the key was not written."""
        keys = self.keys()
        if keys is None:
            return SKIPPED, "overlap: a run is alive and the state bucket cannot keep this slot"
        value = {
            "job": job.name,
            "slot": claim.slot,
            "attempt": claim.attempt,
            "token": claim.token,
            "trigger": claim.trigger,
            "manual": claim.manual,
            "fence": claim.seq,
            "instance": self.config.instance_id,
            "kept_at": rfc3339(self.clock.wall()),
            "behind": holder.get("token"),
        }
        key = buffer_key(job.name)
        try:
            await keys.create(key, value, None)
        except KeyHeld as kept:
            other = slot_ms(kept.value.get("slot"))
            said = rfc3339(other / 1000) if other is not None else "another slot"
            return SKIPPED, f"overlap: a run is alive and {said} is already kept to run after it"
        except Exception as exc:
            return SKIPPED, f"overlap: a run is alive and this slot could not be kept: {exc!r}"
        self.metrics.runs_buffered_total.labels(job=job.name).inc()
        log.info(
            "job %s slot %s kept in %s: runs when the running one ends",
            job.name,
            rfc3339(claim.slot / 1000),
            key,
        )
        # Released meanwhile? Then nobody saw the lock go with this key there.
        self.maybe_take(job.name)
        return KEPT, ""

    # ---------------------------------------------------------------- a kept run

    def request_job(self, job: JobConfig, claim: Claim) -> JobConfig:
        """The job as its request is sent: a kept run's says it was kept."""
        if claim.token not in self._buffered:
            return job
        headers = {**job.request.headers, BUFFERED_HEADER: "true"}
        return dataclasses.replace(job, request=dataclasses.replace(job.request, headers=headers))

    def ended(self, token: str) -> None:
        """The run `token` ended (or, for another policy, starts): not a kept run now."""
        self._buffered.discard(token)

    # --------------------------------------------------------------- the kept slot

    def maybe_take(self, name: str) -> None:
        """Check the kept slot of `name` (sidecar/run/overlapcheck.py) as soon as it is
        seen, and run it if the lock is free (as the watch shows it)."""
        if buffer_key(name) not in self.fleet.view.keys:
            return
        if name in self._taking:
            self._again.add(name)  # changed meanwhile (the lock went): looked at again
            return
        self._taking.add(name)
        self.spawn(self._take(name))

    async def _take(self, name: str) -> None:
        try:
            await self._take_kept(name)
            while name in self._again:
                self._again.discard(name)
                await self._take_kept(name)
        finally:
            self._taking.discard(name)
            self._again.discard(name)

    async def _take_kept(self, name: str) -> None:
        job = self.jobs.get(name)
        keys = self.keys()
        if job is None or keys is None:
            return
        key = buffer_key(name)
        last = await keys.last(key)
        if last is None:
            return
        revision, value = last
        if value is None:
            return
        if self.checks.refused(key, revision):
            return
        holders = set(self._holders.get(name, ()))
        stored = await self.checks.kept(job, key, revision, value, holders)
        if stored is None or lock_key(name) in self.fleet.view.keys:
            return  # hostile (deleted), not checked, or the run it waits for goes on
        try:
            await keys.delete(key, revision)  # exactly one sidecar gets here per kept slot
        except CasConflict:
            return  # taken by another sidecar (or kept anew)
        self._run_kept(job, stored, value)

    def _run_kept(self, job: JobConfig, stored: StoredClaim, value: dict[str, Any]) -> None:
        """The kept slot's run, made of its stored claim (never of the key's value)."""
        claim = Claim(
            job=job.name,
            slot=stored.slot,
            token=stored.token,
            won=True,
            seq=stored.seq,
            publish_tries=0,
            duplicate_acks=0,
            ack_seconds=0.0,
            attempt=stored.attempt,
            trigger=stored.trigger,
        )
        window = kept_window(job, self.config.nats.lease_ttl)
        late = None
        if self.clock.wall() - stored.stored_at > window:
            late = f"overlap: kept longer than {window:g}s (the fleet was away); not run"
        log.info(
            "job %s: the kept slot %s (kept by %s at %s) %s",
            job.name,
            rfc3339(stored.slot / 1000),
            str(value.get("instance", "?"))[:100],
            str(value.get("kept_at", "?"))[:40],
            "is recorded skipped: too late" if late else "runs now",
        )
        self._buffered.add(stored.token)
        if not self.run_kept(job, claim, late):
            self._buffered.discard(stored.token)


__all__ = ["BUFFERED_HEADER", "KeptSlots", "buffer_key"]
