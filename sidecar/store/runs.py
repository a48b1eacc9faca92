"""Run history: a job's claims and results read back from the stream and joined.

``<prefix><job>.results`` carries one JSON message per finished run, a
``ResultRecord`` (sidecar/core/wire.py; written only by sidecar/run/record.py).
History joins a job's claims and results by token, newest first; a claim
without a result reads as ``running``. It is read in one batch through an
ordered consumer filtered on ``<prefix><job>.*`` (the job's two subjects,
nothing of other jobs). Anything on those subjects that is not a well-formed
claim or result is skipped and counted, and so is a claim whose slot lies
further ahead than the duplicate window: no instance claims a slot that
early, so it is forged (or its clock is far off), and taken as the newest run
it would hide every real one from ``last-run`` for good.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import APIError

from sidecar.core.bounds import slot_ms
from sidecar.core.excerpt import MAX_ANSWER_BYTES, MAX_TYPE
from sidecar.core.wire import (
    ERR_NO_MESSAGE,
    ERR_STREAM_NOT_FOUND,
    EVERY,
    LOST,
    RESULT_STATUSES,
    RUN_ON_FIELD,
    RUNNING,
)
from sidecar.core.wire import claims_subject as wire_claims_subject
from sidecar.core.wire import results_subject as result_subject

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- history

RUN_FIELDS = (
    "job",
    "slot",
    "token",
    "instance",
    "manual",
    "attempt",
    "trigger",
    "status",
    "scheduled_at",
    "claimed_at",
    "started_at",
    "finished_at",
    "duration_ms",
    "http_status",
    "error",
    "anomaly",
    "trace_id",
    "answer",
    "answer_type",
    "answer_base64",
    "answer_cut",
)
# The longest excerpt a sidecar writes (base64 of the cap); a longer one read
# from the stream is forged and cut to this.
MAX_ANSWER_TEXT = 4 * ((MAX_ANSWER_BYTES + 2) // 3)


@dataclass(frozen=True)
class Run:
    """One run: a claim joined with its result, if any."""

    job: str
    slot: int
    token: str
    instance: str
    manual: bool
    status: str
    scheduled_at: str
    claimed_at: str
    started_at: str | None
    finished_at: str | None
    duration_ms: int | None
    http_status: int | None
    error: str | None
    seq: int = 0  # the claim's stream sequence, for ordering only
    attempt: int = 1
    trigger: str | None = None  # why it ran (X-Anarchon-Trigger); None: it did not
    anomaly: str | None = None
    trace_id: str | None = None  # from the result record (absent: none was sent)
    # One instance's own run of the slot (``run_on: every``): its claim says so.
    every: bool = False
    # The start of the app's answer (sidecar/core/excerpt.py); None: none kept.
    answer: str | None = None
    answer_type: str | None = None
    answer_base64: bool = False  # `answer` is base64: the bytes were not UTF-8
    answer_cut: bool = False  # the app's answer went on after `answer`

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in RUN_FIELDS}


@dataclass(frozen=True)
class History:
    runs: list[Run]
    skipped: int  # malformed, foreign or far-future messages on the job's subjects
    future: int = 0  # of those, claims with a slot beyond the reader's limit


def _claim_of(data: Any, job: str) -> dict[str, Any] | None:
    if not isinstance(data, dict) or data.get("job") != job:
        return None
    ok = (
        isinstance(data.get("token"), str)
        and slot_ms(data.get("slot")) is not None  # an int (not JSON true), in range
        and isinstance(data.get("instance"), str)
    )
    return data if ok else None


def _result_of(data: Any, job: str) -> dict[str, Any] | None:
    if not isinstance(data, dict) or data.get("job") != job:
        return None
    ok = isinstance(data.get("token"), str) and data.get("status") in RESULT_STATUSES
    return data if ok else None


def attempt_of(data: dict[str, Any]) -> int:
    """A claim's or result's attempt: absent (the reference's messages) means 1."""
    value = data.get("attempt", 1)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return 1


def trigger_of(claim: dict[str, Any], result: dict[str, Any]) -> str | None:
    """Why a run was made: its result's ``trigger``, else its claim's, else what the
    claim shows (older sidecars and the reference wrote none); None for a skipped slot."""
    for data in (result, claim):
        if isinstance(data.get("trigger"), str):
            return str(data["trigger"])
    if "skipped" in claim:
        return None
    if claim.get("manual") is True:
        return "manual"
    return "retry" if attempt_of(claim) > 1 else "scheduled"


def _opt(value: Any, kind: type) -> Any:
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


# JSONDecoder's own scanner (json's C one): (value, end) of the JSON value at an index.
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads(raw: bytes) -> Any:
    """``json.loads(raw)``, with the same answer and the same errors.

    A body that is exactly one JSON value in UTF-8 (what every sidecar and the
    reference write) goes straight to json's C scanner: ``json.loads`` of
    bytes first guesses the encoding and strips whitespace in Python, which
    was half the time of a history's decoding. Anything else (a BOM, UTF-16,
    whitespace around the value, an error) goes to ``json.loads`` itself.
    """
    try:
        text = raw.decode()
        value, end = _scan(text, 0)
        if end == len(text):
            return value
    except (UnicodeDecodeError, StopIteration, ValueError):
        pass
    return json.loads(raw)


def _answer_of(result: dict[str, Any]) -> dict[str, Any]:
    """A result's answer fields as Run takes them; hostile ones cut or dropped."""
    answer = _opt(result.get("answer"), str)
    if answer is None:
        return {}
    ctype = _opt(result.get("answer_type"), str)
    return {
        "answer": answer[:MAX_ANSWER_TEXT],
        "answer_type": ctype[:MAX_TYPE] if ctype is not None else None,
        "answer_base64": result.get("answer_base64") is True,
        "answer_cut": result.get("answer_cut") is True or len(answer) > MAX_ANSWER_TEXT,
    }


def join_runs(
    job: str,
    messages: list[tuple[int, str, bytes]],
    prefix: str,
    latest_slot: int | None = None,
) -> History:
    """Join claims and results (seq, subject, data) of one job into runs, newest first.

    A claim whose slot (epoch ms) is after ``latest_slot`` is skipped and
    counted in ``skipped`` and ``future``.
    """
    claims: list[tuple[int, dict[str, Any]]] = []
    results: dict[str, dict[str, Any]] = {}
    skipped = future = 0
    claims_subject = wire_claims_subject(prefix, job)
    results_subject = result_subject(prefix, job)
    for seq, subject, raw in messages:
        try:
            data = loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):  # nesting too deep for json
            data = None
        if subject == claims_subject and (claim := _claim_of(data, job)) is not None:
            if latest_slot is not None and claim["slot"] > latest_slot:
                future += 1
                skipped += 1
            else:
                claims.append((seq, claim))
        elif subject == results_subject and (result := _result_of(data, job)) is not None:
            # A real result wins over ``lost``: its runner came back and finished.
            known = results.get(result["token"])
            if known is None or result["status"] != LOST:
                results[result["token"]] = result
        else:
            skipped += 1
    runs = []
    for seq, c in claims:
        r = results.get(c["token"], {})
        runs.append(
            Run(
                job=job,
                slot=c["slot"],
                token=c["token"],
                instance=c["instance"],
                manual=c.get("manual") is True,
                attempt=attempt_of(c),
                status=r.get("status", RUNNING),
                scheduled_at=str(c.get("scheduled_at", "")),
                claimed_at=str(c.get("claimed_at", "")),
                started_at=_opt(r.get("started_at"), str),
                finished_at=_opt(r.get("finished_at"), str),
                duration_ms=_opt(r.get("duration_ms"), int),
                http_status=_opt(r.get("http_status"), int),
                error=_opt(r.get("error"), str),
                seq=seq,
                trigger=trigger_of(c, r),
                anomaly=_opt(r.get("anomaly"), str),
                trace_id=_opt(r.get("trace_id"), str),
                every=c.get(RUN_ON_FIELD) == EVERY,
                **_answer_of(r),
            )
        )
    runs.sort(key=lambda run: (run.slot, run.seq), reverse=True)
    return History(runs, skipped, future)


async def read_job_messages(
    js: JetStreamContext, stream: str, prefix: str, job: str, timeout: float = 10.0
) -> list[tuple[int, str, bytes]]:
    """Every stored message on the job's two subjects, in one ordered-consumer pass."""
    subjects = f"{prefix}{job}.*"
    info = await js.stream_info(stream, subjects_filter=subjects)
    expected = sum((info.state.subjects or {}).values())
    if expected == 0:
        return []
    out: list[tuple[int, str, bytes]] = []
    done = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Msg) -> None:
        meta = msg.metadata
        out.append((meta.sequence.stream, msg.subject, msg.data))
        if meta.num_pending == 0 and not done.done():
            done.set_result(None)

    sub = await js.subscribe(
        subjects,
        stream=stream,
        cb=on_msg,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
        headers_only=False,
    )
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        await sub.unsubscribe()
    return out


async def stream_job_names(js: JetStreamContext, stream: str, prefix: str) -> list[str]:
    """Names of every job with messages in the stream (``<prefix><job>.<kind>``), sorted.

    Jobs of other schedulers sharing the stream are among them.
    """
    info = await js.stream_info(stream, subjects_filter=f"{prefix}*.*")
    return sorted({subject[len(prefix) :].split(".")[0] for subject in info.state.subjects or {}})


async def read_history(
    js: JetStreamContext, stream: str, prefix: str, job: str, latest_slot: int | None = None
) -> History:
    """The job's runs, newest first, and the count of skipped messages."""
    return join_runs(job, await read_job_messages(js, stream, prefix, job), prefix, latest_slot)


async def last_messages(
    js: JetStreamContext, stream: str, prefix: str, job: str
) -> list[tuple[int, str, bytes]]:
    """The newest claim and the newest result of `job` (one direct read each).

    What ``status`` and catch-up need without reading the whole history.
    """
    out: list[tuple[int, str, bytes]] = []
    for subject in (wire_claims_subject(prefix, job), result_subject(prefix, job)):
        try:
            msg = await js.get_last_msg(stream, subject)
        except APIError as exc:
            if exc.err_code in (ERR_NO_MESSAGE, ERR_STREAM_NOT_FOUND) or exc.code == 404:
                continue
            raise
        out.append((int(msg.seq or 0), subject, msg.data or b""))
    return out


def last_scheduled_slot(
    messages: list[tuple[int, str, bytes]], prefix: str, job: str
) -> int | None:
    """The slot of the newest claim when it is a scheduled (not manual) one, else None.

    A one-off run's claim (trigger ``at``, sidecar/run/atruns.py) names an instant off the
    schedule, maybe after a slot nobody claimed: it says nothing of the slots before it.
    """
    for _seq, subject, raw in messages:
        if subject != wire_claims_subject(prefix, job):
            continue
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        claim = _claim_of(data, job)
        if claim is None or claim.get("manual") is True or data.get("trigger") == "at":
            return None
        if claim.get(RUN_ON_FIELD) == EVERY:  # one instance's own run: not the fleet's claim
            return None
        return int(claim["slot"])
    return None
