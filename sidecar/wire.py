"""What other implementations see: the wire, pure (no I/O, no nats-py).

Each section is one part of the contract of SPEC.md and FLEET.md; nothing
here may change what a 0.1.0 sidecar reads (tests/test_upgrade.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Final, Literal

from sidecar.due import lost_msg_id
from sidecar.tracing import trace_id_of

# --- records and statuses ---------------------------------------------------
#
# A result message (``<prefix><job>.results``) is one ``ResultRecord``; its
# ``status`` is one of RESULT_STATUSES. A claim without a result reads as
# RUNNING in history (never stored). The kinds of a run's ``Outcome``
# (sidecar/record.py) are exactly the stored statuses.

SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
SKIPPED: Final = "skipped"  # won or kept from running, nothing sent: error says why
LOST: Final = "lost"  # its lease expired: the runner stopped renewing (FLEET.md)
RUNNING: Final = "running"  # history only: a claim with no result yet
RESULT_STATUSES: Final = (SUCCEEDED, FAILED, SKIPPED, LOST)
# The statuses of a run whose request went out, or may have (pings, notify).
RAN_STATUSES: Final = (SUCCEEDED, FAILED, LOST)
# The statuses a further attempt may follow (retry, on_lost: rerun).
FAILED_STATUSES: Final = (FAILED, LOST)

OutcomeKind = Literal["succeeded", "failed", "skipped", "lost"]


@dataclass(frozen=True)
class ResultRecord:
    """The body of a result message. Built only by sidecar/record.py."""

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

    def to_json(self) -> bytes:
        """The body; ``attempt`` only after the first (absent means 1), ``trigger`` and
        ``anomaly`` only when set; ``trace_id`` always (sidecar/tracing.py)."""
        data = asdict(self)
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


def result_subject(prefix: str, job: str) -> str:
    """The subject of a job's results."""
    return f"{prefix}{job}.results"
