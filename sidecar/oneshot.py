"""One-shot commands: history, last-run, run-now, stream.

Each connects once (ConnectError when NATS is unreachable: exit 3), does its
work and closes. ``history``, ``last-run`` and ``stream`` only read; they
raise StreamNotFound when there is no stream yet. ``run-now`` creates or
updates the stream as ``run`` does, claims a manual run (msg id
``<job>:manual:<token>``), triggers the app from this process and records the
result.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import APIError

from sidecar.claim import Claimer
from sidecar.clock import Clock
from sidecar.config import Config, Secrets
from sidecar.connection import Connection
from sidecar.errors import StreamError, UnknownJob
from sidecar.runs import (
    History,
    ResultRecord,
    publish_result,
    read_history,
    stream_job_names,
)
from sidecar.stream import RETRYABLE, StreamState, ensure_stream, read_stream, stream_spec
from sidecar.trigger import RetryReport, Trigger, TriggerResult

# How long a one-shot command waits for JetStream answers.
READ_TIMEOUT = 10.0


@contextlib.asynccontextmanager
async def connected(config: Config, secrets: Secrets) -> AsyncIterator[Connection]:
    conn = Connection(config, secrets)
    await conn.connect()
    try:
        yield conn
    finally:
        await conn.close(drain=False)


def _js(conn: Connection) -> JetStreamContext:
    assert conn.nc is not None
    return conn.nc.jetstream(timeout=READ_TIMEOUT)


async def stream_state(config: Config, secrets: Secrets) -> StreamState:
    async with connected(config, secrets) as conn:
        return await _read(read_stream(_js(conn), stream_spec(config)))


async def history(config: Config, secrets: Secrets, job: str) -> History:
    """The runs of `job`, a job of the config or of another scheduler sharing the stream.

    UnknownJob when the name is in neither: a typo must not read as "never ran".
    """
    spec = stream_spec(config)
    async with connected(config, secrets) as conn:
        js = _js(conn)
        await _read(read_stream(js, spec))  # StreamNotFound, plainly
        try:
            hist = await read_history(js, spec.name, spec.prefix, job)
            if hist.runs or hist.skipped or job in config.job_names:
                return hist
            in_stream = await stream_job_names(js, spec.name, spec.prefix)
        except (*RETRYABLE, APIError, TimeoutError) as exc:
            raise StreamError(f"cannot read the history of {job}: {exc!r}") from exc
        if job in in_stream:
            return hist
        known = config.job_names + tuple(n for n in in_stream if n not in config.job_names)
        raise UnknownJob(job, known)


async def _read(aw: Awaitable[StreamState]) -> StreamState:
    """The stream's state; StreamNotFound as is, no answer as StreamError."""
    try:
        return await aw
    except (*RETRYABLE, TimeoutError) as exc:
        raise StreamError(f"JetStream did not answer: {exc!r}") from exc


@dataclass(frozen=True)
class ManualRun:
    token: str
    slot: int
    result: TriggerResult
    recorded: bool


async def run_now(
    config: Config,
    secrets: Secrets,
    job_name: str,
    clock: Clock,
    retry_for: float | None = None,
    on_retry: RetryReport | None = None,
) -> ManualRun:
    """Claim a manual run of `job_name`, trigger it here and record the result.

    An app that is not reachable is retried for `retry_for` seconds (default:
    the job's max_late, as a slot would be); `on_retry` hears of each retry.
    """
    job = config.job(job_name)
    spec = stream_spec(config)
    async with connected(config, secrets) as conn:
        assert conn.nc is not None
        js = _js(conn)
        try:
            await ensure_stream(js, spec)
        except (*RETRYABLE, TimeoutError) as exc:
            raise StreamError(f"JetStream is not ready: {exc!r}") from exc
        claimer = Claimer(
            conn.nc,
            js,
            spec.name,
            spec.prefix,
            config.instance_id,
            clock,
            config.nats.ack_timeout,
            conn.wait_connected,
        )
        slot = clock.wall_ms()
        claim = await claimer.claim(job.name, slot, time.monotonic() + READ_TIMEOUT, manual=True)
        if not claim.won:  # a manual msg id is unique: only a broken stream gets here
            raise StreamError(f"manual claim {claim.token} was not stored as ours")
        deadline = clock.monotonic() + (job.max_late if retry_for is None else retry_for)
        async with Trigger(secrets.signing_secret, clock, config.instance_id) as trigger:
            result = await trigger.fire(job, slot, claim.token, deadline, on_retry)
        record = ResultRecord.of(job.name, slot, claim.token, config.instance_id, result, True)
        recorded = await publish_result(js, spec.name, spec.prefix, record, attempts=5)
        return ManualRun(claim.token, slot, result, recorded)
