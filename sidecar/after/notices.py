"""Pure: what a run's aftermath says (sidecar/after/aftermath.py sends it).

The anomaly of a run against ``expect``, the trigger kind a ping or an event
names, a ping's body, a notification's message and its JSON payload. No I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.config.fields import format_duration
from sidecar.core.clock import rfc3339
from sidecar.core.wire import FAILED, SUCCEEDED, ResultRecord, trace_id_of

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig

# A ping body carries at most this much of the app's answer.
PING_ANSWER = 10 * 1024


def anomaly_of(job: JobConfig, status: str, duration_ms: int) -> str | None:
    """``short``: succeeded faster than expect.min; ``long``: ended slower than expect.max."""
    expect = job.expect
    if expect is None or status not in (SUCCEEDED, FAILED):
        return None
    seconds = duration_ms / 1000
    if status == SUCCEEDED and expect.min is not None and seconds < expect.min:
        return "short"
    if expect.max is not None and seconds > expect.max:
        return "long"
    return None


def trigger_kind(manual: bool, attempt: int, given: str | None = None) -> str:
    """How the run was started: the claim's own kind when it has one, else inferred."""
    if given:
        return given
    if manual:
        return "manual"
    return "retry" if attempt > 1 else "scheduled"


def ping_body(record: ResultRecord, trigger: str, answer: bytes) -> bytes:
    """The plain-text summary a ping carries."""
    lines = [
        f"status: {record.status}",
        f"job: {record.job}",
        f"slot: {rfc3339(record.slot / 1000)} ({record.slot})",
        f"attempt: {record.attempt}",
        f"trigger: {trigger}",
        f"duration_ms: {record.duration_ms}",
        f"instance: {record.instance}",
        f"run_id: {record.token}",
        f"trace_id: {trace_id_of(record.token)}",
    ]
    if record.http_status is not None:
        lines.append(f"http_status: {record.http_status}")
    if record.anomaly:
        lines.append(f"anomaly: {record.anomaly}")
    if record.error:
        lines.append(f"error: {record.error}")
    text = "\n".join(lines) + "\n"
    if answer:
        text += "\n" + answer[:PING_ANSWER].decode(errors="replace")
    return text.encode()


def message(event: str, job: JobConfig, record: ResultRecord, health: dict[str, Any]) -> str:
    """One line an on-call engineer reads first."""
    when = rfc3339(record.slot / 1000)
    run = f"slot {when}" + (f" attempt {record.attempt}" if record.attempt > 1 else "")
    took = format_duration(record.duration_ms / 1000)
    failures = health.get("failures", 0)
    error = f": {record.error}" if record.error else ""
    if event == "failing":
        return f"{job.name} is failing: {run} {record.status} on {record.instance}{error}"
    if event == "recovered":
        after = health.get("recovered_after")
        tail = f" after {after} failed or lost run(s)" if after else ""
        return f"{job.name} recovered: {run} succeeded on {record.instance}{tail}"
    if event == "lost":
        return f"{job.name}: {run} was lost (its runner {record.instance} stopped){error}"
    if event == "auto_paused":
        return (
            f"{job.name} paused on every sidecar after {failures} consecutive failed or lost "
            f"runs (pause_after: {job.pause_after}); `anarchon-sidecar resume {job.name}` "
            "resumes it"
        )
    expect = job.expect
    if record.anomaly == "short" and expect is not None and expect.min is not None:
        bound = f"shorter than expect.min {format_duration(expect.min)}"
    elif expect is not None and expect.max is not None:
        bound = f"longer than expect.max {format_duration(expect.max)}"
    else:
        bound = "outside its expectation"
    return f"{job.name}: {run} took {took}, {bound} ({record.status} on {record.instance})"


def event_payload(
    event: str,
    job: JobConfig,
    record: ResultRecord,
    trigger: str,
    health: dict[str, Any],
    instance: str,
) -> dict[str, Any]:
    """The ``format: json`` body (docs/CONFIG.md documents it)."""
    failures = health.get("failures")
    return {
        "event": event,
        "job": job.name,
        "slot": record.slot,
        "scheduled_at": rfc3339(record.slot / 1000),
        "status": record.status,
        "error": record.error,
        "instance": record.instance,
        "reported_by": instance,
        "run_id": record.token,
        "attempt": record.attempt,
        "trigger": trigger,
        "duration_ms": record.duration_ms,
        "consecutive_failures": failures if isinstance(failures, int) else None,
        "anomaly": record.anomaly,
        "trace_id": trace_id_of(record.token),
        "message": message(event, job, record, health),
    }
