"""Whether ``resume --catchup`` may run a slot: its fate, read, and settled if need be.

docs/GUARANTEES.md, "One fate per slot", rules 1 and 5. A slot's fate message
is the claim stored with its own id ``<job>:<slot>``: a run's claim or a skip
record. ``resume --catchup`` runs a slot (claim ``<job>:<slot>:b``, another id)
only when that message is a skip record of a pause, never a run or a skip for
another reason (a slot both paused and chosen by ``skip`` is recorded
``skipped: skip``).

Reading the stream once the slot's decision window closed is not enough: a
skip record is no run, and its sidecar asks for it until long after that
window (the slot + jitter + max_late + half of what is left of the duplicate
window: sidecar/run/skips.py, sidecar/run/unanswered.py). A record held on its
way (a sidecar frozen, a link that stalls) can land after the catch-up read
found nothing, and the slot then had two fates: a ``skipped: skip`` record and
a catch-up run (tests/fleet/test_catchup_late_record.py). So, while such a
record may still come, a slot without a fate message has it **settled** before
it is caught up: the catch-up's taker judges the slot as every sidecar does
(its calendar's exclusions, then the state bucket at the slot's instant,
``Fleet.blocked`` and ``Fleet.skipped``) and publishes the same skip record under the same id. By
JetStream's de-duplication exactly one record of the slot is stored, the
taker's or the late one; the stored one is read again and decides. When the
taker's view cannot tell what the bucket held at the instant, it waits until
no record can come any more, then reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sidecar.core.backoff import Backoff
from sidecar.core.clock import rfc3339
from sidecar.run.skips import EXCLUDED
from sidecar.run.unanswered import asked_for
from sidecar.store.runs import read_job_messages
from sidecar.when.pauses import PAUSED, SKIP

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.context import Context
    from sidecar.run.skips import SkipRecorder

log = logging.getLogger(__name__)

# A slot is looked at this long after its decision window (instant + jitter +
# max_late) closed: a claim sent before its deadline is stored by then.
FATE_SETTLE = 2.0
# ... and its fate is read again for this long while the stream does not answer.
FATE_READ_FOR = 60.0
# How long (s) the taker waits for its view to be known whole up to a slot's instant
# (Fleet.caught_up) before it judges the slot; else it is not known here.
VIEW_WAIT = 2.0
# A slot is settled only while its settling record's claim has at least this long
# (s) before the records' deadline; closer, it is read once no record can come.
SETTLE_LEAST = 1.0

Messages = list[tuple[int, str, bytes]]


def claims_of(messages: Messages, prefix: str, job: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The job's claims among its stored `messages`, in their order: (slot, body) of
    each that is a JSON object naming a slot; anything else (hostile) is passed over."""
    subject = f"{prefix}{job}.claims"
    for _seq, at_subject, raw in messages:
        if at_subject != subject:
            continue
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if not isinstance(data, dict):
            continue
        at = data.get("slot")
        if isinstance(at, int) and not isinstance(at, bool):
            yield at, data


def fate_message(
    messages: Messages, prefix: str, job: str, slot: int
) -> tuple[dict[str, Any] | None, int | None]:
    """The slot's fate message (its claim of attempt 1, neither manual nor a
    backfill), and the oldest slot any claim of the job names."""
    oldest: int | None = None
    for at, data in claims_of(messages, prefix, job):
        oldest = at if oldest is None else min(oldest, at)
        if at != slot or data.get("manual") is True or "backfill" in data:
            continue
        if data.get("attempt", 1) != 1:
            continue
        return data, oldest
    return None, oldest


def fate_verdict(messages: Messages, prefix: str, job: str, slot: int) -> str | None:
    """Why a slot whose decision window closed must not be caught up; None when it may.

    A skip record of a pause may be caught up, a run or another skip never.
    Without a fate message it may, unless the claims stored start after the
    slot (its fate may have been trimmed: at most once wins).
    """
    data, oldest = fate_message(messages, prefix, job, slot)
    if data is not None:
        skipped = data.get("skipped")
        if skipped == PAUSED:
            return None
        if skipped is not None:
            return f"it was skipped ({skipped})"
        return "it ran (or was claimed) as scheduled"
    if oldest is not None and oldest > slot:
        return "its record may have been trimmed from the stream"
    return None


def records_end(job: JobConfig, slot: int, duplicate_window: float) -> float:
    """When (epoch s) no sidecar asks for a record of `slot` any more: the deadline
    of a skip record and of an unanswered claim's question, and FATE_SETTLE for its
    last answer and the clocks."""
    return slot / 1000 + job.jitter + job.max_late + asked_for(job, duplicate_window) + FATE_SETTLE


class CatchUpFate:
    """Decides, for the sidecar that took a catch-up slot, whether it may run it."""

    def __init__(self, ctx: Context, skips: SkipRecorder | None) -> None:
        self.clock = ctx.clock
        self.claimer = ctx.claimer
        self.fleet = ctx.fleet
        self.stopping = ctx.stopping
        self.window = ctx.config.nats.duplicate_window
        # Publishes the settling skip record (None: the tests' parts without one).
        self.skips = skips

    async def refused(self, job: JobConfig, slot: int) -> str | None:
        """Why `slot` must not be caught up; None when it may (module doc)."""
        if not await self._until(slot / 1000 + job.jitter + job.max_late + FATE_SETTLE):
            return "the sidecar is stopping"
        messages = await self._read(job, slot)
        if isinstance(messages, str):
            return messages
        prefix = self.claimer.prefix
        end = records_end(job, slot, self.window)
        if (
            fate_message(messages, prefix, job.name, slot)[0] is not None
            or self.clock.wall() >= end
        ):
            return fate_verdict(messages, prefix, job.name, slot)
        # No fate yet, and a record of the slot may still land: settle it.
        # Judged only from a view known whole up to the slot's instant (rule 3): a
        # stalled watch may miss a `skip` stored before it, and the settling record
        # would be the wrong one, stored first. Not known whole: waited for instead.
        whole = await self.fleet.caught_up(slot / 1000, self.clock.monotonic() + VIEW_WAIT)
        judged = self._judged(job, slot) if whole else None
        if isinstance(judged, str):
            return judged
        # The settling record is a claim with the records' own deadline (skips.py):
        # too close to it, it could not be sent, and the slot would be dropped as
        # "not settled" though nothing can race it: read it once no record can come.
        settled = (
            judged is not None
            and self.skips is not None
            and self.clock.wall() < end - FATE_SETTLE - SETTLE_LEAST
        )
        if settled and judged is not None and self.skips is not None:
            reason, why = judged
            await self.skips.record_skip(job, slot, reason, why, count=False)
        else:
            log.info(
                "job %s: %s slot %s; its catch-up waits until no record of it can come (%s)",
                job.name,
                "no time is left to settle"
                if judged is not None
                else "what the state bucket held is not known here at",
                rfc3339(slot / 1000),
                rfc3339(end),
            )
            if not await self._until(end):
                return "the sidecar is stopping"
        messages = await self._read(job, slot)
        if isinstance(messages, str):
            return messages
        if fate_message(messages, prefix, job.name, slot)[0] is None and settled:
            # The settling record was not stored (NATS away): a late one may still come.
            return "its fate could not be settled; not run (at most once)"
        return fate_verdict(messages, prefix, job.name, slot)

    def _judged(self, job: JobConfig, slot: int) -> tuple[str, str] | str | None:
        """The skip record every sidecar makes of `slot` (reason, why), judged from the
        state bucket at its instant as the job loop does (sidecar/run/job_loop.py);
        a string: why it is not caught up (it was not paused); None: not known here."""
        if (excluded := job.schedule.excluded(slot)) is not None:
            # The job loop records an excluded slot so before it looks at a pause.
            return EXCLUDED, f"excluded: {excluded.text}"
        blocked = self.fleet.blocked(job.name, slot)
        if blocked is None:
            return "it was not paused at its instant"
        if blocked[0] != PAUSED:
            return None  # the bucket's past not known here, or the bucket unfit
        skipped = self.fleet.skipped(job.name, slot)
        if skipped is None:
            return blocked
        return skipped if skipped[0] == SKIP else None

    async def _until(self, at: float) -> bool:
        """Wait until wall time `at`; False when the sidecar stops first."""
        while (left := at - self.clock.wall()) > 0:
            if self.stopping.is_set():
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), left)
        return not self.stopping.is_set()

    async def _read(self, job: JobConfig, slot: int) -> Messages | str:
        """The job's stored messages; a string (why not caught up) when they cannot
        be read for FATE_READ_FOR."""
        claimer = self.claimer
        backoff = Backoff(start=0.5, cap=5.0)
        give_up = self.clock.monotonic() + FATE_READ_FOR
        while True:
            try:
                return await read_job_messages(claimer.js, claimer.stream, claimer.prefix, job.name)
            except Exception as exc:  # NATS away or electing: read again, bounded
                if self.stopping.is_set() or self.clock.monotonic() >= give_up:
                    return f"its fate could not be read ({exc!r}); not run (at most once)"
                log.debug("job %s: reading the fate of %s: %r", job.name, slot, exc)
                await backoff.sleep()
