"""The winner's side of the claim-to-lease window (sidecar/run/claimwindow.py).

A sidecar that won a claim and came to its lease (or ``lock.<job>``) late,
more than ``lease_ttl / 2`` after the claim (half what any judge waits),
asks whether a loser judged its run lost meanwhile, and does not run if one
did: the lost record (and its rerun) stands. For a run lease the judge's copy
at the run key makes the winner's own create fail (sidecar/run/lease.py); a
lock job's winner never makes that key for its own run, so it looks for the
copy before it asks for the lock (``judged_before_lock``) and makes the key
itself after taking it (``lock_judged``, ``covered_by``), by compare-and-set
against the judges' copy. Once the copy expired, the results tell
(``judged_lost``).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from sidecar.core.errors import KeyHeld
from sidecar.core.wire import run_key
from sidecar.run.lease import COVERED_BY, JUDGED_BY
from sidecar.store.kv import until_answered
from sidecar.when.attempts import lock_key

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.claim import Claim
    from sidecar.run.context import Context
    from sidecar.run.lostruns import LostRuns

log = logging.getLogger(__name__)

# The judge's copy of the lease outlives lease_ttl by the time a lost record's
# publish may take (sidecar/run/record.py LOST_RETRY): it is stored before the copy
# expires and a late winner's create succeeds.
COPY_EXTRA = 10.0


class WinnerSide:
    """Whether a run won here was judged lost while its winner was away."""

    def __init__(self, ctx: Context, lost: LostRuns) -> None:
        self.lost = lost
        self.clock = ctx.clock
        self.view = ctx.fleet.view
        self.keys = ctx.keys
        self.instance = ctx.config.instance_id
        self.ttl = ctx.config.nats.lease_ttl

    def late(self, claim: Claim) -> bool:
        """Whether the time since `claim` (won here) passed ``lease_ttl / 2``, half
        what any judge waits for its lease: a judge may be at work then."""
        return claim.sent_at is not None and self.clock.monotonic() - claim.sent_at > self.ttl / 2

    async def judged_before_lock(self, job: JobConfig, claim: Claim) -> bool:
        """A lock job's winner, before it asks for ``lock.<job>``: whether its run was
        judged lost already (a judge's copy in the view, or the lost record). Asked
        only when its claim is old (more than ``lease_ttl / 2``); True: it neither
        takes the lock, nor keeps or skips the slot, nor asks a run to stop: the
        lost record (and its rerun) stands. Not atomic: ``lock_judged`` is."""
        if not self.late(claim):
            return False
        key = run_key(job.name, claim.slot, claim.attempt)
        copy = self.view.keys.get(key)
        value = copy.value if copy is not None else {}
        if value.get(JUDGED_BY) and value.get("token") == claim.token:
            log.error(
                "%s: %s judged this run lost before it took its lock; not run "
                "(on_lost says whether it runs again)",
                key,
                str(value.get(JUDGED_BY))[:100],
            )
            return True
        return await self.judged_lost(job, claim)

    async def lock_judged(self, job: JobConfig, claim: Claim) -> bool:
        """A lock job's winner, holding ``lock.<job>``: whether its run was judged
        lost while it was away between its claim and its lock (see the module doc).
        Asked only when that took long; True: it does not run."""
        if not self.late(claim):
            return False
        keys = self.keys()
        key = run_key(job.name, claim.slot, claim.attempt)
        if keys is not None:
            value: dict[str, Any] = {
                "job": job.name,
                "slot": claim.slot,
                "attempt": claim.attempt,
                "token": claim.token,
                "instance": self.instance,
                "fence": claim.seq,
                COVERED_BY: lock_key(job.name),
            }
            create = functools.partial(keys.create, key, value, self.ttl + COPY_EXTRA)
            try:
                await until_answered(
                    f"marker {key}", create, self.clock, self.clock.monotonic() + self.ttl
                )
            except KeyHeld as held:
                if held.value.get(JUDGED_BY) and held.value.get("token") == claim.token:
                    log.error(
                        "%s: %s judged this run lost before it took its lock; not run "
                        "(on_lost says whether it runs again)",
                        key,
                        str(held.value.get(JUDGED_BY))[:100],
                    )
                    return True
            except Exception as exc:  # unknown: the results say (a judge needs us gone)
                log.warning("%s not made: %r", key, exc)
        # A judge's copy that expired already: its lost record was stored before.
        return await self.judged_lost(job, claim)

    async def judged_lost(self, job: JobConfig, claim: Claim) -> bool:
        """The winner's side: whether its run was recorded lost while it was away
        between its claim and its lease (asked only when that took long)."""
        if not self.late(claim):
            return False
        try:
            recorded, _ = await self.lost.recorded(job.name, claim.token, claim.seq)
        except Exception as exc:  # unknown: it runs (a judge needs its presence gone)
            log.warning("job %s slot %s: results not read: %r", job.name, claim.slot, exc)
            return False
        if recorded:
            log.error(
                "job %s slot %s: judged lost while this sidecar was away between its claim "
                "and its lease; not run (on_lost says whether it runs again)",
                job.name,
                claim.slot,
            )
        return recorded
