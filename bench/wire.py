"""What the raw baselines send: the stream, the subjects and a claim-shaped body.

Standard library only, so that a baseline process can run in the runtime-only
environment (``bench.runtime``) with nothing but nats-py beside it.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

STREAM = "CRON"
PREFIX = "cron."
MSG_ID = "Nats-Msg-Id"


def _rfc3339(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def claim_body(job: str, slot: int, token: str) -> bytes:
    """A body shaped like the sidecar's claim, for the raw baseline."""
    return json.dumps(
        {
            "job": job,
            "slot": slot,
            "token": token,
            "instance": "bench-raw",
            "scheduled_at": _rfc3339(slot / 1000),
            "claimed_at": _rfc3339(time.time()),
            "manual": False,
        },
        separators=(",", ":"),
    ).encode()
