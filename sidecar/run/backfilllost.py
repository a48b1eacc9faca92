"""A backfill's taker that died between its claim and its lease: judged like a slot's.

A backfill slot is taken by one sidecar (``running`` in ``backfill.<job>``,
sidecar/run/backfill.py) and claimed by it alone, so no loser's duplicate ack
names its claim. The sidecar that clears a stale ``running`` entry (its taker
left the fleet or restarted) looks for the taker's claim of that slot and tag
in the stream and hands it to the claim-window judge
(sidecar/run/claimwindow.py ``lost_claim``) as a loser would: when the run's
lease never came, the taker is judged dead on the same evidence and the run
recorded ``lost`` once; a taker that died before it claimed ran nothing and
leaves nothing to record.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sidecar.core.bounds import slot_ms
from sidecar.core.clock import rfc3339
from sidecar.core.wire import claims_subject
from sidecar.run.claim import Claim
from sidecar.store.runs import read_job_messages

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.claim import Claimer

log = logging.getLogger(__name__)

#: ``lost(job, claim)``: judge the winner of `claim` (claimwindow.py ``lost_claim``).
Lost = Callable[["JobConfig", Claim], None]


def taken_claim(
    messages: list[tuple[int, str, bytes]], prefix: str, job: str, slot: int, tag: str, taker: str
) -> tuple[int, dict[str, Any]] | None:
    """(sequence, body) of the last stored claim of `slot` under backfill `tag` by
    `taker`; None when there is none (read from NATS: every field is checked)."""
    subject = claims_subject(prefix, job)
    found = None
    for seq, subj, data in messages:
        if subj != subject:
            continue
        try:
            body = json.loads(data)
        except ValueError:
            continue
        if (
            isinstance(body, dict)
            and body.get("backfill") == tag
            and body.get("instance") == taker
            and slot_ms(body.get("slot")) == slot
        ):
            found = seq, body
    return found


async def judge_taken(
    claimer: Claimer, job: JobConfig, running: dict[str, Any], tag: str, lost: Lost
) -> None:
    """Hand the claim of a stale ``running`` slot to the judge (see the module doc)."""
    slot, taker = running["slot"], str(running.get("instance"))
    try:
        messages = await read_job_messages(claimer.js, claimer.stream, claimer.prefix, job.name)
    except Exception as exc:  # NATS away: its lease's expiry, if it made one, still tells
        log.warning("job %s: backfill slot %s's claim not read: %r", job.name, slot, exc)
        return
    found = taken_claim(messages, claimer.prefix, job.name, slot, tag, taker)
    if found is None:
        log.info(
            "job %s: backfill of %s: %s left before it claimed it; nothing ran",
            job.name,
            rfc3339(slot / 1000),
            taker[:100],
        )
        return
    seq, body = found
    trigger = body.get("trigger") if body.get("trigger") in ("backfill", "catchup") else "backfill"
    # As a loser's claim: the winner's sequence; the token is never read (its own).
    lost(job, Claim(job.name, slot, "", False, seq, 0, 0, 0.0, trigger=str(trigger)))
