"""A claim given up at its deadline without a definite answer: what became of its slot.

A claim that got no definite answer before due time + ``max_late`` is given up
(``claim_errors_total``) and its slot is not run by this sidecar. That alone
left a hole (measured: the 10,000-job burst, thousands of slots whose every
claim went unanswered while the server was buried, bench/burst.py): either no
claim of the slot was ever stored, and the stream said nothing of it, or one
was, answered too late for its sidecar (a publish that waited in a busy or
frozen server's socket), and the slot read ``running`` in ``history`` for
ever: no lease was ever made, so no lost-run judge looked at it.

So each sidecar that gave up a claim asks again, after the deadline, **under
the claim's own id and token** (``Claimer.claim(token=...)``), with the body of
a skip record (``"skipped": "unanswered"``). JetStream keeps one message per
id, so one question settles it (docs/GUARANTEES.md, "One fate per slot"):

* stored now, or the stored claim is this sidecar's own earlier one: the
  slot's fate is this claim, which nobody runs; it gets its result here,
  ``skipped`` (reason ``unanswered``, counted in ``runs_skipped_total``);
* another claim is stored: a run of its winner, a skip record, or another
  sidecar's claim given up like this one (that sidecar records it the same
  way); it is handed to the claim window's judges like any lost claim, so a
  stored claim whose sidecar died before it could settle it is judged
  ``lost`` there (sidecar/run/claimwindow.py).

The question must reach JetStream while it still remembers the slot's id: the
first claim of the slot was published no earlier than its due time, and
JetStream remembers an id for ``nats.duplicate_window`` after it stored it; the
slot's last claim was sent by due time + ``jitter + max_late``. The question is
asked until halfway between that and the window's end. The fate records of a
burst (every claim of one instant given up at once) are spread over a few
seconds, so as not to come all at once to a server already too busy to answer.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from sidecar.core.clock import rfc3339
from sidecar.core.errors import ClaimUnanswered
from sidecar.core.wire import EVERY, SKIPPED
from sidecar.run.lostruns import has_result
from sidecar.run.record import Recorder, not_sent

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.claim import Claim
    from sidecar.run.context import Context

log = logging.getLogger(__name__)

# The skip record's reason, and runs_skipped_total's.
REASON = "unanswered"
# The questions of one burst are spread over up to this long after the deadline.
SPREAD = 5.0


def asked_for(job: JobConfig, duplicate_window: float) -> float:
    """How long after a claim's deadline its slot's fate may still be asked for: half
    of what JetStream's memory of the slot's id has left once the slot's last claim
    was sent (the config keeps ``jitter + max_late`` below the window)."""
    return max(0.0, (duplicate_window - job.jitter - job.max_late) / 2)


class Unanswered:
    """Settles the fate of slots whose claims this sidecar gave up (module doc)."""

    def __init__(self, ctx: Context, lost_claim: Callable[[JobConfig, Claim], None]) -> None:
        self.claimer = ctx.claimer
        self.clock = ctx.clock
        self.sleeper = ctx.sleeper
        self.spawn = ctx.tasks.spawn
        self.window = ctx.config.nats.duplicate_window
        self.lost_claim = lost_claim
        spec = ctx.spec
        self.js, self.stream, self.prefix = ctx.js, spec.name, spec.prefix
        # No aftermath: the slot never ran (no ping, no health, no notification).
        self.recorder = Recorder(
            ctx.js, spec.name, spec.prefix, ctx.config.instance_id, ctx.metrics
        )

    def given_up(self, job: JobConfig, exc: ClaimUnanswered) -> None:
        """`exc`'s claim was given up at its deadline: settle its slot's fate."""
        self.spawn(self.settle(job, exc))

    async def settle(self, job: JobConfig, exc: ClaimUnanswered) -> bool:
        """Ask for the claim again as a skip record; record it skipped when it is the
        stored one. True when this sidecar recorded the slot's fate."""
        # Counted from the claim's deadline, not from now: a sidecar frozen or
        # suspended past it must not ask once JetStream may have forgotten the id
        # (the question would then be stored beside the slot's claim).
        deadline = exc.deadline + asked_for(job, self.window)
        when = rfc3339(exc.slot / 1000)
        left = deadline - self.clock.monotonic()
        if left <= 0:
            log.warning(
                "job %s slot %s: its claim got no answer in time, and it is too late to ask "
                "for its fate (nats.duplicate_window); not recorded",
                exc.job,
                when,
            )
            return False
        spread = random.uniform(0.0, min(SPREAD, left / 4))
        # On stop: asked at once, while the drain lets it.
        await self.sleeper.until(self.clock.wall() + spread)
        try:
            claim = await self.claimer.claim(
                exc.job,
                exc.slot,
                deadline,
                attempt=exc.attempt,
                msg_id=exc.msg_id,
                extra={**(exc.extra or {}), "skipped": REASON},
                trigger=exc.trigger,
                token=exc.token,
            )
        except Exception as again:  # NATS away for that long too: said, not recorded
            log.warning(
                "job %s slot %s: its claim got no answer in time, nor did the question of "
                "its fate since; not recorded: %s",
                exc.job,
                when,
                again,
            )
            return False
        if not claim.won:
            # Another claim is the slot's fate; if it is a run whose sidecar died
            # before its lease, the claim window's judges record it lost.
            log.debug(
                "job %s slot %s: its fate is another claim (seq %d)", exc.job, when, claim.seq
            )
            if job.run_on != EVERY:  # an instance's own id: no other runner to judge
                self.lost_claim(job, claim)
            return False
        # This sidecar's own claim is the stored one. While it was away (frozen, cut
        # off past the deadline, its presence gone), a loser's claim-window judge may
        # have recorded that run lost: that record is the slot's fate, not a second.
        # (A judge that looks after this record is stored finds it and stands down.)
        try:
            judged, _ = await has_result(
                self.js, self.stream, self.prefix, exc.job, exc.token, claim.seq
            )
        except Exception as again:  # the stream unread: no second fate risked
            log.warning(
                "job %s slot %s: its claim got no answer in time, and its results could not "
                "be read since; not recorded: %r",
                exc.job,
                when,
                again,
            )
            return False
        if judged:
            log.info("job %s slot %s: its claim, given up, was recorded already", exc.job, when)
            return False
        why = (
            f"{REASON}: not run: its claim got no definite answer from JetStream before "
            f"due time + max_late ({job.max_late:g}s)"
        )
        # The stored claim is this sidecar's, as it asked (same job, slot, token,
        # attempt and trigger). Never sent: runs_skipped_total, no run.
        outcome = not_sent(claim, SKIPPED, why, self.clock.wall(), REASON, run=False)
        return bool(await self.recorder.record(job, outcome))
