"""A run's ending, in one place: one ``Outcome`` becomes one result record.

Every path of a run ends in an ``Outcome`` (succeeded, failed, skipped with a
reason, lost; with its error, times, attempt and trigger kind): the job loop
(sidecar/run/job_loop.py), a slot kept from running (sidecar/run/skips.py), lost-run
judging (sidecar/run/lostruns.py), ``run-now`` (sidecar/ops/streamops.py) and a run
started from the page (sidecar/admin/actions.py). ``Recorder.record`` turns it into
the ``ResultRecord`` (built nowhere else), publishes it, counts it, writes the
run line and calls the aftermath's hooks (pings, notifications, health,
spans: sidecar/after/aftermath.py). A later feature that must hear of every ending
hangs here, in one call. Every result, a lost record included, is published by
``publish_with_retry``: the one publish loop of results (pipelined with the
connection's other writes: sidecar/store/pipe.py), told by a ``Retry``
how long to go on (a run's result: until stored; a lost record: 10 s, since
every sidecar publishes one).

What follows an ending (a retry made due, a lost run rerun) is not decided
here: sidecar/run/retries.py does that with the sequence ``record`` returns.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError

from sidecar.core import failpoints
from sidecar.core.backoff import Backoff
from sidecar.core.clock import rfc3339
from sidecar.core.excerpt import excerpt
from sidecar.core.natspy import connection_of
from sidecar.core.wire import (
    CAS_CONFLICT,
    ERR_MESSAGE_TOO_LARGE,
    EXPECTED_LAST_SUBJECT_SEQ,
    FAILED,
    LOST,
    MSG_ID,
    SKIPPED,
    SUCCEEDED,
    TRANSIENT,
    OutcomeKind,
    ResultRecord,
    results_subject,
)
from sidecar.store.kv import WRITE_TIMEOUT
from sidecar.store.pipe import writes_of

if TYPE_CHECKING:
    from sidecar.after.aftermath import Aftermath
    from sidecar.config.load import JobConfig
    from sidecar.obs.metrics import Metrics
    from sidecar.run.claim import Claim
    from sidecar.run.trigger import TriggerResult

# Every ending is recorded here, so the run line (docs/CLI.md shows it) always
# comes from this module's logger, ``sidecar.run.record``.
log = logging.getLogger(__name__)

# How many times a result's publish is tried (de-duplicated by its msg id).
PUBLISH_TRIES = 30


@dataclass(frozen=True)
class Outcome:
    """How one run (or a slot kept from running) ended; times are wall epoch seconds."""

    kind: OutcomeKind
    job: str
    slot: int
    token: str
    started_at: float
    finished_at: float
    attempt: int = 1
    trigger: str | None = None  # its kind (X-Anarchon-Trigger); None: not known (lost)
    sent: bool = False  # a request went out: the record carries trigger and http_status
    manual: bool = False
    error: str | None = None
    http_status: int | None = None
    reason: str | None = None  # skipped: why (runs_skipped_total's reason label)
    duration: float | None = None  # measured seconds (monotonic); None: not measured
    answer: bytes = b""  # the start of the app's answer (redacted), for pings and the record
    content_type: str | None = None  # the answer's Content-Type
    instance: str | None = None  # who ran it; None: this sidecar
    run: bool = True  # False: a slot kept from running (skips.py), no run to count


def sent(claim: Claim, result: TriggerResult) -> Outcome:
    """The outcome of a request that went out (or was cut off by the drain)."""
    return Outcome(
        kind=SUCCEEDED if result.ok else FAILED,
        job=claim.job,
        slot=claim.slot,
        token=claim.token,
        started_at=result.started_at,
        finished_at=result.finished_at,
        attempt=claim.attempt,
        trigger=claim.trigger,
        sent=True,
        manual=claim.manual,
        error=result.error,
        http_status=result.http_status,
        duration=result.duration,
        answer=result.answer,
        content_type=result.content_type,
    )


def not_sent(
    claim: Claim,
    kind: OutcomeKind,
    error: str,
    at: float,
    reason: str | None = None,
    *,
    run: bool = True,
) -> Outcome:
    """A won claim whose request never went out (skipped, or failed before it);
    `run` False: a slot that was never a run (``Outcome.run``)."""
    return Outcome(
        kind=kind,
        job=claim.job,
        slot=claim.slot,
        token=claim.token,
        started_at=at,
        finished_at=at,
        attempt=claim.attempt,
        trigger=claim.trigger,
        manual=claim.manual,
        error=error,
        reason=reason,
        run=run,
    )


@dataclass(frozen=True)
class Retry:
    """How a result's publish is tried again. A retry never stores it twice (its msg id
    de-duplicates it). At most `tries` publishes (None: no count), or until `give_up`
    seconds have passed (None: no limit); waits from `start` doubling to `cap`
    between them. Only the errors in `on` are tried again, any other is raised at
    once; each failed try is said at `level`."""

    tries: int | None
    give_up: float | None
    start: float
    cap: float
    on: tuple[type[Exception], ...]
    level: int = logging.WARNING


# A run's result: asked until stored, whatever JetStream answers meanwhile.
RESULT_RETRY = Retry(PUBLISH_TRIES, None, 0.05, 2.0, (*TRANSIENT, APIError))
# A lost record: every sidecar publishes one, so each gives up sooner; an answer
# that is not transient (the compare-and-set lost: a result came in) is raised.
LOST_RETRY = Retry(None, 10.0, 0.1, 1.0, TRANSIENT, logging.DEBUG)


def too_large(exc: Exception) -> bool:
    """Whether `exc` says a message is larger than the server or the stream takes."""
    return isinstance(exc, MaxPayloadError) or (
        isinstance(exc, APIError) and exc.err_code == ERR_MESSAGE_TOO_LARGE
    )


async def publish_with_retry(
    js: JetStreamContext,
    stream: str,
    prefix: str,
    record: ResultRecord,
    retry: Retry,
    headers: dict[str, str] | None = None,
    timeout: float = WRITE_TIMEOUT,
) -> PubAck:
    """Publish result `record` (with its msg id and `headers`), tried again as `retry`
    says: the one publish loop of results. Raises the last error when it gives up."""
    loop = asyncio.get_running_loop()
    deadline = None if retry.give_up is None else loop.time() + retry.give_up
    backoff = Backoff(start=retry.start, cap=retry.cap)
    subject = results_subject(prefix, record.job)
    payload = record.to_json()
    sent_headers = {MSG_ID: record.msg_id, **(headers or {})}
    writes = writes_of(connection_of(js))
    tries = 0
    while True:
        tries += 1
        try:
            # Pipelined with this connection's other writes (sidecar/store/pipe.py):
            # what js.publish sends and answers, without a request and timer each.
            return await writes.send(subject, payload, sent_headers, stream, timeout)
        except Exception as exc:
            if record.excerpt is not None and too_large(exc):
                # The server's max_payload or the stream's max_msg_size is below a
                # record with the app's answer (docs/TRIGGER.md): the run's result
                # matters more than its answer, so it goes without it.
                log.warning(
                    "job %s slot %s: the result with the app's answer is too large for "
                    "NATS (%r); recorded without the answer",
                    record.job,
                    record.slot,
                    exc,
                )
                record = replace(record, excerpt=None)
                payload = record.to_json()
                continue
            if not isinstance(exc, retry.on):
                raise
            log.log(
                retry.level,
                "job %s slot %s: recording the result failed (try %d): %r",
                record.job,
                record.slot,
                tries,
                exc,
            )
            if (retry.tries is not None and tries >= retry.tries) or (
                deadline is not None and loop.time() > deadline
            ):
                raise
        await backoff.sleep()


async def publish_result(
    js: JetStreamContext,
    stream: str,
    prefix: str,
    record: ResultRecord,
    timeout: float = WRITE_TIMEOUT,
    publish_tries: int = PUBLISH_TRIES,
) -> int:
    """Publish a result; retried (de-duplicated by its msg id).

    Returns the stored result's sequence (a due key of the next attempt names
    it), or 0 when it could not be recorded; the run then reads as
    ``running`` in history, which is what a lost result means.
    """
    retry = replace(RESULT_RETRY, tries=publish_tries)
    try:
        ack = await publish_with_retry(js, stream, prefix, record, retry, timeout=timeout)
    except retry.on:
        return 0
    return int(ack.seq)


class Recorder:
    """Turns outcomes into records, publishes, counts, says and tells (module doc)."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        prefix: str,
        instance: str,
        metrics: Metrics | None = None,
        aftermath: Aftermath | None = None,
        publish_tries: int = PUBLISH_TRIES,
        say: bool = True,
    ) -> None:
        self.js = js
        self.stream = stream
        self.prefix = prefix
        self.instance = instance
        self.metrics = metrics  # None: manual runs (run-now, the page) are not counted
        self.aftermath = aftermath
        self.publish_tries = publish_tries
        self.say = say  # False: run-now prints its own outcome

    def record_of(self, job: JobConfig | None, outcome: Outcome) -> ResultRecord:
        """The one place a ``ResultRecord`` is built."""
        record = ResultRecord(
            job=outcome.job,
            slot=outcome.slot,
            token=outcome.token,
            instance=outcome.instance if outcome.instance is not None else self.instance,
            status=outcome.kind,
            started_at=rfc3339(outcome.started_at),
            finished_at=rfc3339(outcome.finished_at),
            duration_ms=max(0, round((outcome.finished_at - outcome.started_at) * 1000)),
            http_status=outcome.http_status,
            error=outcome.error,
            manual=outcome.manual,
            attempt=outcome.attempt,
            trigger=outcome.trigger if outcome.sent else None,
            # The start of the app's answer (docs/TRIGGER.md); none for a run that
            # got none (timeout, lost, skipped).
            excerpt=excerpt(outcome.answer, job.answer.size, outcome.content_type)
            if outcome.sent and job is not None
            else None,
        )
        if outcome.sent and job is not None and self.aftermath is not None:
            record = self.aftermath.marked(job, record)  # its anomaly (expect)
        return record

    async def record(self, job: JobConfig, outcome: Outcome) -> int:
        """Count, say and publish `outcome`, then tell the aftermath; the stored
        result's sequence, 0 when it could not be recorded."""
        record = self.record_of(job, outcome)
        self._count(outcome)
        self._say(outcome, record)
        seq = await publish_result(
            self.js, self.stream, self.prefix, record, publish_tries=self.publish_tries
        )
        if not seq:
            log.error("job %s slot %s: result not recorded", outcome.job, outcome.slot)
        elif failpoints.ENABLED and outcome.sent:
            await failpoints.hit("record.published")
        if outcome.run and self.aftermath is not None:
            self.aftermath.after_outcome(job, record, outcome.answer, outcome.trigger)
        return seq

    async def record_lost(
        self, job: JobConfig | None, outcome: Outcome, last: int, give_up: float = 10.0
    ) -> int | None:
        """Publish a ``lost`` outcome expecting `last` as the job's last result.

        Every sidecar publishes it, one copy is stored (its msg id is the
        attempt's). Its sequence when this copy was stored (then counted, said
        and told, `job` None for a job not in this config), 0 when another
        sidecar's was; None when a result was stored since `last` was read.
        """
        record = self.record_of(job, outcome)
        retry = replace(LOST_RETRY, give_up=give_up)
        expect = {EXPECTED_LAST_SUBJECT_SEQ: str(last)}
        try:
            ack = await publish_with_retry(self.js, self.stream, self.prefix, record, retry, expect)
        except APIError as exc:
            if exc.err_code in CAS_CONFLICT:
                return None
            raise
        if ack.duplicate:
            return 0
        if job is not None and self.aftermath is not None:
            self.aftermath.after_outcome(job, record, b"", outcome.trigger)
        self._count(outcome)
        self._say(outcome, record)
        return int(ack.seq)

    def _count(self, outcome: Outcome) -> None:
        m = self.metrics
        if m is None:
            return
        name = outcome.job
        if outcome.kind == SKIPPED:
            m.runs_skipped_total.labels(job=name, reason=outcome.reason or "").inc()
        elif outcome.kind == LOST:
            m.runs_lost_total.labels(job=name).inc()
        if not outcome.run:
            return  # kept from running: no run
        m.runs_total.labels(job=name, status=outcome.kind).inc()
        if outcome.sent and outcome.duration is not None:
            m.run_duration_seconds.labels(job=name).observe(outcome.duration)
        if outcome.kind == SUCCEEDED:
            m.job_last_success_timestamp_seconds.labels(job=name).set(outcome.finished_at)

    def _say(self, outcome: Outcome, record: ResultRecord) -> None:
        """The run line: ``run job=… slot=… status=…``, one per ending."""
        if not self.say:
            return
        kind = outcome.kind
        parts = [f"run job={outcome.job} slot={rfc3339(outcome.slot / 1000)}"]
        if outcome.attempt > 1 or kind == LOST:
            parts.append(f"attempt={outcome.attempt}")
        if outcome.manual:
            parts.append(f"run={outcome.token}")
        parts.append(f"status={kind}")
        if outcome.sent:
            parts.append(f"http_status={outcome.http_status} duration_ms={record.duration_ms}")
        if kind == LOST:
            # docs/RUNBOOK.md quotes it: ``status=lost instance=...: its lease ... expired``.
            parts.append(f"instance={record.instance}: its {outcome.error}")
        elif outcome.error:
            parts.append(f"error={outcome.error!r}")
        line = " ".join(parts)
        if kind == LOST:
            log.error("%s: the runner died, hung or lost NATS", line)
        elif kind == SUCCEEDED or not outcome.run:
            log.info("%s", line)
        else:
            log.warning("%s", line)
