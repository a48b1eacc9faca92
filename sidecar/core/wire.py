"""The wire, in one pure module: what other programs see of the sidecar.

Subjects, message ids, state-bucket key names, NATS and trigger headers, the
compact JSON every record is written in, the result record and its
statuses, and the NATS error codes and transient errors every caller tells
apart. Nothing here does I/O or holds a connection: names and values only,
so that a change to the wire is a change to this file (docs/TRIGGER.md, docs/CLI.md and
SECURITY.md's key table describe it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from dataclasses import dataclass, fields
from typing import Any, Final, Literal

from nats.errors import ConnectionReconnectingError, NoRespondersError
from nats.js.errors import (
    APIError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    ServiceUnavailableError,
)

from sidecar import __version__
from sidecar.core.excerpt import Excerpt

# --- subjects, ids, keys, headers ---

# NATS headers.
MSG_ID = "Nats-Msg-Id"  # JetStream de-duplicates on it within the duplicate window
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"  # a compare-and-set

# Every request the sidecar sends (the trigger, pings, webhooks, spans) says
# who sends it, and which release (docs/TRIGGER.md).
USER_AGENT = f"anarchon-sidecar/{__version__}"

# Trigger request headers (docs/TRIGGER.md).
JOB_HEADER = "X-Anarchon-Job"
SLOT_HEADER = "X-Anarchon-Slot"
RUN_ID_HEADER = "X-Anarchon-Run-Id"
SCHEDULED_AT_HEADER = "X-Anarchon-Scheduled-At"
INSTANCE_HEADER = "X-Anarchon-Instance"
ATTEMPT_HEADER = "X-Anarchon-Attempt"
FENCE_HEADER = "X-Anarchon-Fence"
TRIGGER_HEADER = "X-Anarchon-Trigger"
PREVIOUS_HEADER = "X-Anarchon-Previous-Scheduled-At"
SIGNATURE_HEADER = "X-Anarchon-Signature"
# A run of a job with ``after`` (trigger ``after``): the run id of the run it follows.
AFTER_RUN_HEADER = "X-Anarchon-After-Run"

# X-Anarchon-Trigger (and a record's ``trigger``): why a request was sent.
SCHEDULED, CATCHUP, MANUAL, RETRY, RERUN, BACKFILL, AT, AFTER = (
    "scheduled",
    "catchup",
    "manual",
    "retry",
    "rerun",
    "backfill",
    "at",
    "after",
)
TRIGGERS = (SCHEDULED, CATCHUP, MANUAL, RETRY, RERUN, BACKFILL, AT, AFTER)

# W3C trace context, sent with every trigger (sidecar/obs/tracing.py exports the span).
TRACEPARENT = "traceparent"


def new_token() -> str:
    """A token unique per instance and claim: 128 random bits, hex."""
    return secrets.token_hex(16)


def trace_id_of(token: str) -> str:
    """The run's 32-hex trace id (never all zeros), derived from its token."""
    digest = hashlib.sha256(b"anarchon-trace:" + token.encode()).hexdigest()[:32]
    return digest if digest.strip("0") else "1" * 32


def span_id_of(token: str) -> str:
    """The 16-hex id of the sidecar's span of the run: the app's spans' parent."""
    digest = hashlib.sha256(b"anarchon-span:" + token.encode()).hexdigest()[:16]
    return digest if digest.strip("0") else "1" * 16


def traceparent(token: str) -> str:
    """``00-<trace id>-<span id>-01``: version 00, sampled."""
    return f"00-{trace_id_of(token)}-{span_id_of(token)}-01"


def claims_subject(prefix: str, job: str) -> str:
    return f"{prefix}{job}.claims"


def results_subject(prefix: str, job: str) -> str:
    return f"{prefix}{job}.results"


def kv_subject(bucket: str, key: str) -> str:
    """The subject a KV put of `key` in `bucket` is published on."""
    return f"$KV.{bucket}.{key}"


def kv_stream(bucket: str) -> str:
    """The stream behind KV bucket `bucket`."""
    return f"KV_{bucket}"


def msg_get_subject(api_prefix: str, stream: str) -> str:
    """JetStream's API subject that reads one stored message of `stream`."""
    return f"{api_prefix}.STREAM.MSG.GET.{stream}"


def claim_msg_id(job: str, slot: int, token: str, manual: bool, attempt: int = 1) -> str:
    """The claim's ``Nats-Msg-Id``: the reference's for attempt 1."""
    if manual:
        return f"{job}:manual:{token}"
    return f"{job}:{slot}" if attempt <= 1 else f"{job}:{slot}:a{attempt}"


# ``jobs[].run_on: every`` (docs/GUARANTEES.md): each instance claims its own
# (job, slot, instance). The claim's body says so in this field, so that no
# reader takes it for the fleet's claim of the slot (whose id is ``<job>:<slot>``).
RUN_ON_FIELD = "run_on"
EVERY = "every"


def every_msg_id(job: str, slot: int, instance: str) -> str:
    """The claim id of `instance`'s own run of `slot` (``run_on: every``):
    ``<job>:<slot>:every:<instance>``. Never the fleet's ``<job>:<slot>`` nor an
    attempt's ``<job>:<slot>:a<n>``: a per-instance claim takes no one else's id,
    and a restarted instance finds its own (a duplicate: not run again)."""
    return f"{job}:{slot}:every:{instance}"


def after_msg_id(job: str, after: str, slot: int, token: str, manual: bool) -> str:
    """The claim id of `job`'s run after a run of job `after`: one per slot of
    `after` (all its attempts: a retried or lost run fires `job` once), or per run
    for a manual run of `after` (its slot is not one of its schedule's)."""
    return f"{job}:after:{after}:{f'manual:{token}' if manual else slot}"


def lost_msg_id(job: str, slot: int, attempt: int) -> str:
    """The id of a ``lost`` result: every sidecar publishes it, one is stored."""
    return f"{job}:{slot}:{attempt}:lost"


# State-bucket keys (SECURITY.md's key table).
def paused_key(job: str) -> str:
    return f"paused.{job}"


def skip_key(job: str) -> str:
    return f"skip.{job}"


def instance_key(instance: str) -> str:
    return f"instance.{instance}"


def since_key(job: str) -> str:
    return f"since.{job}"


def health_key(job: str) -> str:
    return f"health.{job}"


def event_key(job: str, run: str, event: str) -> str:
    """``event.<job>.<run>.<event>``; `run` must already be a key token."""
    return f"event.{job}.{run}.{event}"


def run_key(job: str, slot: int, attempt: int) -> str:
    """``run.<job>.<slot>`` for attempt 1, ``run.<job>.<slot>.<attempt>`` after."""
    return f"run.{job}.{slot}" if attempt <= 1 else f"run.{job}.{slot}.{attempt}"


def lock_key(job: str) -> str:
    return f"lock.{job}"


def due_key(job: str, slot: int, attempt: int) -> str:
    return f"due.{job}.{slot}.{attempt}"


def compact(value: Any) -> bytes:
    """`value` as compact JSON (no spaces), as every record and key value is written."""
    return json.dumps(value, separators=(",", ":")).encode()


def decode(value: bytes | None) -> dict[str, Any]:
    """A JSON object; an empty one for anything else (hostile input is not fatal)."""
    try:
        data = json.loads(value or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):  # nesting too deep for json
        return {}
    return data if isinstance(data, dict) else {}


# --- NATS errors ---

# JetStream API error codes (nats-server's errors.json) that callers tell apart.
ERR_NO_MESSAGE = 10037  # JSNoMessageFoundErr: no message on the subject / at the sequence
ERR_MESSAGE_TOO_LARGE = 10054  # JSStreamMessageExceedsMaximumErr: past the stream's max_msg_size
ERR_STREAM_NAME_IN_USE = 10058  # JSStreamNameExistErr: created by someone else meanwhile
ERR_STREAM_NOT_FOUND = 10059  # JSStreamNotFoundErr
ERR_SUBJECTS_OVERLAP = 10065  # JSStreamSubjectOverlapErr: another stream captures them
ERR_WRONG_LAST_SEQUENCE = 10071  # JSStreamWrongLastSequenceErrF: a compare-and-set lost
ERR_REPLICAS_NOT_SUPPORTED = 10074  # JSStreamReplicasNotSupportedErr: not clustered
ERR_DUPLICATE_IN_PROCESS = 10158  # JSStreamDuplicateMessageConflict: a copy is in flight
ERR_WRONG_LAST_SEQUENCE_CONSTANT = 10164  # JSStreamWrongLastSequenceConstantErr (R3 buckets)
# A compare-and-set that lost: R3 buckets answer 10164 as well as 10071.
CAS_CONFLICT = (ERR_WRONG_LAST_SEQUENCE, ERR_WRONG_LAST_SEQUENCE_CONSTANT)

# Errors after which asking again may give a definite answer: no answer in
# time (nats-py's TimeoutError is an asyncio.TimeoutError, and so is a
# wait_for around a request), no responders, JetStream not ready (cluster
# electing, meta leader unknown), or a connection between two servers.
TRANSIENT = (
    asyncio.TimeoutError,
    NoRespondersError,
    NoStreamResponseError,
    ServiceUnavailableError,
    ConnectionReconnectingError,
)


def cas_conflict(exc: BaseException) -> bool:
    """Whether `exc` says a compare-and-set lost (someone else wrote first)."""
    return isinstance(exc, KeyWrongLastSequenceError) or (
        isinstance(exc, APIError) and exc.err_code in CAS_CONFLICT
    )


# --- records and statuses ---
#
# A result message (``<prefix><job>.results``) is one ``ResultRecord``; its
# ``status`` is one of RESULT_STATUSES. A claim without a result reads as
# RUNNING in history (never stored). The kinds of a run's ``Outcome``
# (sidecar/run/record.py) are exactly the stored statuses.

SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
SKIPPED: Final = "skipped"  # won or kept from running, nothing sent: error says why
LOST: Final = "lost"  # its lease expired: the runner stopped renewing (docs/GUARANTEES.md)
RUNNING: Final = "running"  # history only: a claim with no result yet
RESULT_STATUSES: Final = (SUCCEEDED, FAILED, SKIPPED, LOST)
# The statuses of a run whose request went out, or may have (pings, notify).
RAN_STATUSES: Final = (SUCCEEDED, FAILED, LOST)
# The statuses a further attempt may follow (retry, on_lost: rerun).
FAILED_STATUSES: Final = (FAILED, LOST)

OutcomeKind = Literal["succeeded", "failed", "skipped", "lost"]


@dataclass(frozen=True)
class ResultRecord:
    """The body of a result message. Built only by sidecar/run/record.py."""

    job: str
    slot: int
    token: str
    instance: str
    status: str
    started_at: str
    finished_at: str
    duration_ms: int
    http_status: int | None
    error: str | None
    manual: bool = False
    attempt: int = 1
    trigger: str | None = None  # X-Anarchon-Trigger of the run; None: no request (skipped)
    anomaly: str | None = None  # short or long: outside the job's expect (min, max)
    excerpt: Excerpt | None = None  # the start of the app's answer (sidecar/core/excerpt.py)

    def to_json(self) -> bytes:
        """The body; ``attempt`` only after the first (absent means 1), ``trigger`` and
        ``anomaly`` only when set; ``trace_id`` always (sidecar/obs/tracing.py); the
        answer's fields (``answer``, ``answer_type``...) only when one was kept.

        Its fields read one by one (all plain values but the excerpt), not by
        ``dataclasses.asdict``, which copies each deeply: in a burst's profile that
        cost more than the rest of a result's publish together (docs/PERFORMANCE.md,
        "The burst's CPU per slot")."""
        data = {name: getattr(self, name) for name in _RECORD_FIELDS}
        if self.excerpt is not None:
            data.update(self.excerpt.fields())
        if self.attempt <= 1:
            del data["attempt"]
        if self.trigger is None:
            del data["trigger"]
        if self.anomaly is None:
            del data["anomaly"]
        data["trace_id"] = trace_id_of(self.token)
        return json.dumps(data, separators=(",", ":")).encode()

    @property
    def msg_id(self) -> str:
        """One stored result per run, and one ``lost`` result per attempt fleet-wide."""
        if self.status == LOST:
            return lost_msg_id(self.job, self.slot, self.attempt)
        return f"{self.job}:result:{self.token}"


# ResultRecord's fields in their order, but the excerpt (its own fields, flattened).
_RECORD_FIELDS: Final = tuple(f.name for f in fields(ResultRecord) if f.name != "excerpt")
