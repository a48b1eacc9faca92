"""Run records: the result message a winner publishes after its trigger.

``<prefix><job>.results`` carries one JSON message per finished run with at
least ``job, slot, token, instance, status, started_at, finished_at,
duration_ms, http_status, error``. A claim without a result reads as
``running``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import APIError

from sidecar.claim import MSG_ID, TRANSIENT
from sidecar.clock import rfc3339

log = logging.getLogger(__name__)

SUCCEEDED = "succeeded"
FAILED = "failed"
RUNNING = "running"


@dataclass(frozen=True)
class ResultRecord:
    """The body of a result message."""

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

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def make(
        cls,
        *,
        job: str,
        slot: int,
        token: str,
        instance: str,
        ok: bool,
        started_at: float,
        finished_at: float,
        http_status: int | None,
        error: str | None,
        manual: bool = False,
    ) -> ResultRecord:
        return cls(
            job=job,
            slot=slot,
            token=token,
            instance=instance,
            status=SUCCEEDED if ok else FAILED,
            started_at=rfc3339(started_at),
            finished_at=rfc3339(finished_at),
            duration_ms=round((finished_at - started_at) * 1000),
            http_status=http_status,
            error=error,
            manual=manual,
        )


def result_subject(prefix: str, job: str) -> str:
    return f"{prefix}{job}.results"


async def publish_result(
    js: JetStreamContext,
    stream: str,
    prefix: str,
    record: ResultRecord,
    timeout: float = 2.0,
    attempts: int = 30,
) -> bool:
    """Record a run's result; retried (de-duplicated by a msg id per token).

    Returns False when it could not be recorded; the run then reads as
    ``running`` in history, which is what a lost result means.
    """
    headers_id = f"{record.job}:result:{record.token}"
    payload = record.to_json()
    backoff = 0.05
    for attempt in range(1, attempts + 1):
        try:
            await js.publish(
                result_subject(prefix, record.job),
                payload,
                timeout=timeout,
                stream=stream,
                headers={MSG_ID: headers_id},
            )
            return True
        except (*TRANSIENT, APIError) as exc:
            log.warning(
                "job %s slot %s: recording the result failed (attempt %d): %r",
                record.job,
                record.slot,
                attempt,
                exc,
            )
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 2.0)
    return False


def record_fields(record: ResultRecord) -> dict[str, Any]:
    return asdict(record)
