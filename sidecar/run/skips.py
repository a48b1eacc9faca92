"""Slots the fleet keeps from running, and their records: exclusions, ``skip``, pauses.

What the state bucket's values say (a pause's end, the slots to skip) is
pure and lives in sidecar/when/pauses.py. Here, the I/O: ``SkipRecorder.record_skip``
writes a skipped slot into the stream once for the whole fleet, so that
``history`` has no silent hole: every replica publishes a claim with the
slot's own ``Nats-Msg-Id: <job>:<slot>`` carrying ``"skipped": <reason>``; the
one whose claim is stored publishes the result, status ``skipped``, its error
saying why. The same id as a run's claim: a slot's skip record and its run
exclude each other, the first stored is the slot's fate, and every other
sidecar follows it.
A skip this sidecar's own config decided (``LOCAL``: an exclusion) may have met a
run claim of a replica whose config differs: its duplicate answer then names a
winner that nobody else may be left to judge, so it is handed to the claim-window
judge as a losing claim is (sidecar/run/claimwindow.py ``lost_claim``).
Every replica counts ``claims_skipped_total{reason}``, the recorder
``runs_skipped_total{reason}``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sidecar.core.clock import rfc3339
from sidecar.core.errors import ClaimError, ClaimUnanswered
from sidecar.core.wire import EVERY, RUN_ON_FIELD, SKIPPED, claim_msg_id, every_msg_id
from sidecar.obs.ratelog import RateLimitedLog
from sidecar.run.record import Outcome, Recorder
from sidecar.run.unanswered import Unanswered, asked_for

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.claim import Claim
    from sidecar.run.context import Context

log = logging.getLogger(__name__)

EXCLUDED = "excluded"
# Skips decided by this sidecar's own config (its `exclude` and calendar files): a
# replica with another config (a rollout of a new calendar) may have claimed the
# slot to run it, and the winner this sidecar's duplicate answer names is judged
# like a lost claim's (docs/GUARANTEES.md, lost runs). When the fleet agrees, what
# beat the record is another skip record: one read of it, lease_ttl later. A pause
# or a `skip` is read from the state bucket as it was at the slot's instant, alike
# on every sidecar: their duplicates name another skip record, so they are not
# judged (a read a slot on every sidecar but one, for nothing).
LOCAL = frozenset({EXCLUDED})
# Reasons that are the fleet's trouble, said by the stream check itself: a job
# says once that it is kept from its claims by it, whatever the text.
SHARED = ("stream", "bucket")
# At most this many late slots are walked one by one after a stall.
MAX_LATE_WALK = 10_000


def skip_record_id(job: str, slot: int) -> str:
    """The claim id of a skipped slot's record: the slot's own claim id, ``<job>:<slot>``.

    So a skip record and a run of one slot exclude each other in JetStream:
    whichever is stored first is the slot's fate (docs/GUARANTEES.md).
    """
    return claim_msg_id(job, slot, "", manual=False)


class SkipRecorder:
    """Records skipped slots in the stream, once per slot for the whole fleet."""

    def __init__(self, ctx: Context, lost_claim: Callable[[JobConfig, Claim], None]) -> None:
        """`lost_claim`: the claim-window judge's (sidecar/run/claimwindow.py), told of a
        ``LOCAL`` skip whose record came second."""
        self.claimer = ctx.claimer
        self.lost_claim = lost_claim
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.instance = ctx.config.instance_id
        self.stream = ctx.spec.name
        self.prefix = ctx.spec.prefix
        self.window = ctx.config.nats.duplicate_window

    @property
    def recorder(self) -> Recorder:
        """Where the skipped slot's record is made (sidecar/run/record.py); no aftermath."""
        return Recorder(self.claimer.js, self.stream, self.prefix, self.instance, self.metrics)

    async def record_skip(
        self, job: JobConfig, slot: int, reason: str, why: str, count: bool = True
    ) -> bool:
        """Count the skip and record it once fleet-wide; True when this replica recorded it.

        `count` False: not this replica's skip of the slot, but ``resume --catchup``
        settling the slot's fate before it is caught up (sidecar/run/catchupfate.py).
        """
        m = self.metrics
        if count:
            m.claims_skipped_total.labels(job=job.name, reason=reason).inc()
        # Asked for as long as JetStream surely remembers the slot's id (a skip record
        # is no run: it may be stored after max_late), so that a record answered late
        # is found ours and gets its result (sidecar/run/unanswered.py).
        late = slot / 1000 + job.jitter + job.max_late + asked_for(job, self.window)
        deadline = self.clock.monotonic() + max(0.0, late - self.clock.wall())
        # run_on: every: each instance records its own kept slot (so it does not read
        # as missed there), under its own claim id of the slot.
        every = job.run_on == EVERY
        try:
            claim = await self.claimer.claim(
                job.name,
                slot,
                deadline,
                msg_id=(
                    every_msg_id(job.name, slot, self.instance)
                    if every
                    else skip_record_id(job.name, slot)
                ),
                extra={"skipped": reason, RUN_ON_FIELD: EVERY} if every else {"skipped": reason},
            )
        except Exception as exc:  # NATS away: counted, not recorded (said once here)
            log.warning(
                "job %s slot %s skipped (%s); not recorded: %s",
                job.name,
                rfc3339(slot / 1000),
                why,
                exc,
            )
            return False
        if not claim.won:
            if reason in LOCAL and not every:
                # Maybe a run claim of a replica whose config runs the slot: judged
                # as a losing claimer judges its winner (sidecar/run/claimwindow.py).
                self.lost_claim(job, claim)
            return False
        now = self.clock.wall()
        outcome = Outcome(
            kind=SKIPPED,
            job=job.name,
            slot=slot,
            token=claim.token,
            started_at=now,
            finished_at=now,
            error=why,
            reason=reason,
            run=False,  # kept from running: runs_skipped_total, no run
        )
        return bool(await self.recorder.record(job, outcome))


class Unclaimed:
    """Slots the job loop does not claim: counted, said once per reason a job (again
    when the reason changes or after a claim), and recorded (``kept``) when the fleet
    keeps them from running."""

    def __init__(
        self, ctx: Context, recorder: SkipRecorder, unanswered: Unanswered | None = None
    ) -> None:
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.connected = ctx.connected
        self.recorder = recorder
        # Claims given up without an answer: their slots' fate asked for later.
        self.unanswered = unanswered
        self.spawn = ctx.tasks.spawn
        # Per job: the reason last said; forgotten when the job claims again.
        self._said: dict[str, str] = {}
        self.warnings = RateLimitedLog(log)

    def late(self, job: JobConfig, slot: int, now: float) -> int:
        """Count every slot whose claim can no longer start in time; return the next one."""
        skipped = 0
        while now - slot / 1000 > job.max_late and skipped < MAX_LATE_WALK:
            skipped += 1
            slot = job.schedule.next_slot(slot)
        if skipped >= MAX_LATE_WALK:
            slot = job.schedule.next_slot(int((now - job.max_late) * 1000))
        # Late because NATS was away: say so, it is what the operator must fix.
        reason = "late" if self.connected.is_set() else "disconnected"
        self.metrics.claims_skipped_total.labels(job=job.name, reason=reason).inc(skipped)
        log.warning(
            "job %s: %d slot(s) skipped, later than max_late %gs%s",
            job.name,
            skipped,
            job.max_late,
            "" if reason == "late" else " while disconnected from NATS",
        )
        return slot

    def skip(self, job: JobConfig, slot: int, reason: str, why: str) -> None:
        """A slot not claimed (stream, paused): counted, said once per reason a job."""
        self.metrics.claims_skipped_total.labels(job=job.name, reason=reason).inc()
        self._say(job, slot, reason, why)

    def kept(self, job: JobConfig, slot: int, reason: str, why: str) -> None:
        """A slot kept from running (excluded, skip, paused): counted, and recorded
        ``skipped`` in the stream once for the fleet (``SkipRecorder``)."""
        self._say(job, slot, reason, why)
        self.spawn(self.recorder.record_skip(job, slot, reason, why))

    def disconnected(self, job: JobConfig, slot: int, exc: Exception) -> None:
        """Not claimed, NATS away: counted; said once a minute a job while it lasts,
        with the count; all said on reconnect."""
        self.metrics.claims_skipped_total.labels(job=job.name, reason="disconnected").inc()
        self.warnings.warning(
            f"disconnected:{job.name}",
            "job %s slot %s skipped: %s",
            job.name,
            rfc3339(slot / 1000),
            exc,
        )

    def reconnected(self) -> None:
        self.warnings.clear_prefix("disconnected:")

    def failed(self, job: JobConfig, slot: int, exc: Exception) -> None:
        """No claim made (a ClaimError, or a bug): counted, said; nothing ran. A claim
        given up without an answer may be stored all the same: its slot's fate is
        asked for after the deadline (sidecar/run/unanswered.py)."""
        self.metrics.claim_errors_total.labels(job=job.name).inc()
        if isinstance(exc, ClaimUnanswered) and self.unanswered is not None:
            self.unanswered.given_up(job, exc)
        if isinstance(exc, ClaimError):
            log.warning("job %s slot %s not claimed: %s", job.name, rfc3339(slot / 1000), exc)
        else:
            log.error("job %s slot %s: claim failed unexpectedly", job.name, slot, exc_info=exc)

    def count(self, claim: Claim) -> None:
        """A claim decided: its ack time, duplicate acks, won or lost."""
        m = self.metrics
        self._said.pop(claim.job, None)  # it claims again: a later skip is news
        m.claim_ack_seconds.labels(job=claim.job).observe(claim.ack_seconds)
        if claim.duplicate_acks:
            m.claim_duplicate_acks_total.inc(claim.duplicate_acks)
        if claim.won:
            m.claims_won_total.labels(job=claim.job).inc()
            log.debug("job %s slot %s won (seq %d)", claim.job, claim.slot, claim.seq)
        else:
            m.claims_lost_total.labels(job=claim.job).inc()
            log.debug("job %s slot %s lost (seq %d)", claim.job, claim.slot, claim.seq)

    def _say(self, job: JobConfig, slot: int, reason: str, why: str) -> None:
        """Said once per reason: nothing more while the job's slots keep being kept
        from their claim for the same reason (issue 39 item 9: a sidecar without the
        permissions said "stream not checked yet" once a minute for ever); said
        again when the reason changes, or once the job has claimed in between.

        For the fleet's own trouble (``stream``, ``bucket``) the reason is the
        kind: the stream check and the permissions say each new problem
        themselves (sidecar/store/guard.py, sidecar/store/permissions.py), once.
        For a pause, a skip or an exclusion it is the text (who paused, until when).
        """
        said = reason if reason in SHARED else f"{reason}: {why}"
        if self._said.get(job.name) == said:
            return
        self._said[job.name] = said
        log.warning("job %s slot %s skipped: %s", job.name, rfc3339(slot / 1000), why)
