"""Due attempts are acted on only when the job's own config and the stream back them.

A ``due.<job>.<slot>.<attempt>`` key is only a hint: anyone allowed to write
the state bucket can write one (SECURITY.md), and forged keys made a fleet run
an attempt of a slot that had succeeded, of a slot an hour ahead, and of an
instant not on the schedule, on a job without retries. Before a sidecar
competes for attempt N of a slot:

- the slot must be an instant of the job's schedule, not later than now plus
  the job's jitter;
- N must be within the job's budget: 2 <= N <= 1 + ``retry.max``;
- the stream must hold a result of attempt N-1 of that slot that ``failed``
  (or was ``lost``, for a job with ``on_lost: rerun``): read before the claim,
  at the sequence the key names (``result``) or, for a key without one, the
  job's newest result.

The time the attempt is due is computed here from the server's timestamp of
that result (plus the backoff for a retry), never taken from the key: a
recorder whose clock runs ahead cannot make an attempt unreachable, and a
forger cannot choose the time. A key that fails a check is hostile input: the
caller counts it, logs it once and deletes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from sidecar.core.bounds import attempt_no, epoch_s, seq_no, slot_ms
from sidecar.core.errors import Hostile
from sidecar.core.wire import FAILED_STATUSES, LOST, RETRY, results_subject
from sidecar.when.attempts import DueKey, retry_due_at

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.store.stream import StreamSpec


@dataclass(frozen=True)
class Backed:
    """A due attempt the stream backs: when it is due (epoch s, server's clock), and why."""

    due_at: float
    reason: str  # retry (attempt N-1 failed) or lost
    result_seq: int


def config_problem(job: JobConfig, due: DueKey, now: float) -> str | None:
    """Why the job's own config rules the due attempt out; None when it allows it."""
    if slot_ms(due.slot) is None:
        return f"slot {due.slot} is out of range"
    if due.attempt > 1 + job.retry.max:
        return f"attempt {due.attempt} is beyond the job's budget (retry.max {job.retry.max})"
    if due.slot / 1000 > now + job.jitter:
        return "its slot is in the future"
    if job.schedule.next_slot(due.slot - 1) != due.slot:
        return "its slot is not an instant of the job's schedule"
    return None


def judge_result(
    job: JobConfig, due: DueKey, data: bytes, stored_at: float | None
) -> tuple[float, str]:
    """(due_at, reason) when the stored result (of the job's results subject) backs the
    due attempt; Hostile otherwise. `stored_at`: the server's time of the result."""
    try:
        value: Any = json.loads(data or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise Hostile("the result it names is not one")
    attempt = attempt_no(value.get("attempt"), 1)
    if value.get("job") != job.name or value.get("slot") != due.slot:
        raise Hostile("the result it names is of another slot")
    if attempt != due.attempt - 1:
        raise Hostile(f"the result it names is not of attempt {due.attempt - 1}")
    if value.get("manual"):
        raise Hostile("the result it names is of a manual run (never retried)")
    status = value.get("status")
    if status not in FAILED_STATUSES:
        raise Hostile(f"attempt {due.attempt - 1} ended {status!r}, not failed or lost")
    if status == LOST and job.on_lost != "rerun":
        raise Hostile(f"attempt {due.attempt - 1} was lost and the job does not rerun lost runs")
    at = epoch_s(stored_at)
    if at is None:
        raise Hostile("the result it names has no usable time")
    if status == LOST:
        return at, LOST
    return retry_due_at(at, job.retry.backoff, due.attempt - 1), RETRY


async def backing(
    js: JetStreamContext, spec: StreamSpec, job: JobConfig, due: DueKey, value: dict[str, Any]
) -> Backed:
    """Read the result of attempt N-1 from the stream; Hostile when it does not back N.

    NATS errors other than "no such message" propagate: nothing was judged.
    """
    subject = results_subject(spec.prefix, job.name)
    hint = seq_no(value.get("result"))
    try:
        if hint is not None:
            msg = await js.get_msg(spec.name, hint)
        else:
            msg = await js.get_last_msg(spec.name, subject)
    except NotFoundError:
        raise Hostile(f"no failed or lost result of attempt {due.attempt - 1} found") from None
    if msg.subject != subject:
        raise Hostile("the message it names is not a result of the job")
    stored_at = msg.time.timestamp() if msg.time is not None else None
    due_at, reason = judge_result(job, due, msg.data or b"", stored_at)
    return Backed(due_at, reason, int(msg.seq or 0))
