"""One-shot commands on the stream: history, last-run, run-now, stream, pause, resume.

Each connects once (ConnectError when NATS is unreachable: exit 3), does its
work and closes. ``history``, ``last-run`` and ``stream`` only read; they
raise StreamNotFound when there is no stream yet. ``run-now`` creates the
stream when it is missing and otherwise leaves it exactly as it is (the
stream is shared: only ``run`` raises it, and only ``stream --lower`` lowers
it), claims a manual run (msg id ``<job>:manual:<token>``), triggers the app
from this process and records the result. ``check_stream`` is ``check
--connect``: it reads, and says what ``run`` would do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyNotFoundError,
)

from sidecar.after.aftermath import Aftermath
from sidecar.after.health import reset
from sidecar.after.signing import signer_for
from sidecar.config.load import Config, Secrets
from sidecar.core.clock import Clock, rfc3339
from sidecar.core.errors import StreamError, StreamNotFound, UnknownJob
from sidecar.core.natspy import api_prefix
from sidecar.core.wire import ERR_STREAM_NOT_FOUND, EVERY, MANUAL, TRANSIENT, paused_key
from sidecar.run.claim import Claimer
from sidecar.run.record import Recorder, sent
from sidecar.run.since import since_key
from sidecar.run.trigger import RetryReport, Trigger, TriggerResult, why_of
from sidecar.store.connection import Client, connected, one_shot_js
from sidecar.store.kv import Keys, Paused, delete_at, put_json, store_pause
from sidecar.store.missed import with_missed
from sidecar.store.runs import History, read_history, stream_job_names
from sidecar.store.state import decode, ensure_bucket, state_spec
from sidecar.store.stream import (
    Lowering,
    StreamState,
    answering_domain,
    conflict_error,
    create_if_missing,
    lower_stream,
    overlapping_streams,
    plan_lowering,
    read_stream,
    state_of,
    stream_spec,
)
from sidecar.store.streamfit import coverage, raised_state

# How long a one-shot command waits for JetStream answers.
READ_TIMEOUT = 10.0


@contextlib.contextmanager
def answered(
    what: str = "JetStream did not answer", also: tuple[type[Exception], ...] = ()
) -> Iterator[None]:
    """No answer from JetStream (a transient error, or one of `also`) as a StreamError
    saying `what`: a one-shot command reports it and exits, it does not retry."""
    try:
        yield
    except TRANSIENT + also as exc:
        raise StreamError(f"{what}: {exc!r}") from exc


_js = one_shot_js  # the commands' name for it (ops, atops)


@dataclass(frozen=True)
class StreamRead:
    """The stream's state (None: not created yet) and the JetStream that answered."""

    state: StreamState | None
    domain: str | None
    cluster: str | None


async def stream_state(config: Config, secrets: Secrets) -> StreamRead:
    """The stream's state with the domain (and cluster) of the JetStream that answered."""
    async with connected(config, secrets) as conn:
        js = _js(conn)
        domain = await answering_domain(js)
        cluster = conn.nc.cluster if isinstance(conn.nc, Client) else None
        try:
            state = await _read(read_stream(js, stream_spec(config)))
        except StreamNotFound:
            return StreamRead(None, domain, cluster)
        return StreamRead(dataclasses.replace(state, domain=domain), domain, state.cluster)


async def history(
    config: Config, secrets: Secrets, job: str, clock: Clock | None = None
) -> History:
    """The runs of `job`, a job of the config or of another scheduler sharing the stream.

    Claims of slots beyond now + nats.duplicate_window are skipped. UnknownJob
    when the name is in neither: a typo must not read as "never ran".
    """
    spec = stream_spec(config)
    async with connected(config, secrets) as conn:
        js = _js(conn)
        await _read(read_stream(js, spec))  # StreamNotFound, plainly
        # No instance claims a slot earlier than that (its clock would have to
        # run ahead by more than the window that de-duplicates it).
        now_ms = (clock or Clock()).wall_ms()
        latest = now_ms + round(config.nats.duplicate_window * 1000)
        with answered(f"cannot read the history of {job}", also=(APIError,)):
            hist = await read_history(js, spec.name, spec.prefix, job, latest)
            if hist.runs and job in config.job_names and config.job(job).run_on == EVERY:
                late_ms = round(config.job(job).max_late * 1000)
                hist = dataclasses.replace(hist, runs=with_missed(hist.runs, now_ms, late_ms))
            if hist.runs or hist.skipped or job in config.job_names:
                return hist
            in_stream = await stream_job_names(js, spec.name, spec.prefix)
        if job in in_stream:
            return hist
        known = config.job_names + tuple(n for n in in_stream if n not in config.job_names)
        raise UnknownJob(job, known)


async def _read(aw: Awaitable[StreamState]) -> StreamState:
    """The stream's state; StreamNotFound as is, no answer as StreamError."""
    with answered():
        return await aw


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
        with answered("JetStream is not ready"):
            state = await create_if_missing(js, spec)
        if spec.subject not in state.subjects:
            raise StreamError(
                f"stream {spec.name} does not capture {spec.subject}: `run` adds it "
                "(run-now leaves the shared stream as it is)"
            )
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
        claim = await claimer.claim(job.name, slot, clock.monotonic() + READ_TIMEOUT, manual=True)
        if not claim.won:  # a manual msg id is unique: only a broken stream gets here
            raise StreamError(f"manual claim {claim.token} was not stored as ours")
        # A manual run retries an unreachable app for as long as a slot would,
        # or for --timeout.
        deadline = clock.monotonic() + (job.max_late if retry_for is None else retry_for)
        keys = await _keys(js, config)
        after = Aftermath(config, None, clock, lambda: keys, secrets.signing_secret)
        after.started(job, claim.token, clock.wall())
        async with Trigger(signer_for(config, secrets), clock, config.instance_id) as trigger:
            result = await trigger.fire(
                job,
                slot,
                claim.token,
                deadline,
                fence=claim.seq,
                on_retry=on_retry,
                why=why_of(job, slot, MANUAL),
            )
        # Not counted, not logged (run-now prints the outcome), told (sidecar/run/record.py).
        recorder = Recorder(
            js, spec.name, spec.prefix, config.instance_id, None, after, publish_tries=5, say=False
        )
        recorded = bool(await recorder.record(job, sent(claim, result)))
        await after.drain()  # its ping and notifications, bounded
        return ManualRun(claim.token, slot, result, recorded)


async def _keys(js: JetStreamContext, config: Config) -> Keys | None:
    """The state bucket's writer for run-now's health update; None when it cannot be had."""
    try:
        return Keys(await ensure_bucket(js, state_spec(config)))
    except Exception:  # no notifications or pause_after count for this run; said later
        return None


@dataclass(frozen=True)
class StreamCheck:
    """What ``check --connect`` found: the stream as it is and as ``run`` would leave it."""

    state: StreamState | None  # None: missing, `run` creates it
    after_run: StreamState | None
    uncovered: dict[str, str]  # jobs the stream would still not hold after `run`


async def check_stream(config: Config, secrets: Secrets) -> StreamCheck:
    """Read the stream and judge it; StreamConflict when another stream is in the way."""
    spec = stream_spec(config)
    async with connected(config, secrets) as conn:
        js = _js(conn)
        assert conn.nc is not None
        with answered():
            try:
                info = await js.stream_info(spec.name)
            except APIError as exc:
                if exc.err_code not in (ERR_STREAM_NOT_FOUND, None):
                    why = f"cannot read stream {spec.name}: {exc.description}"
                    raise StreamError(why) from exc
                info = None
        state = state_of(info) if info is not None else None
        if state is None or spec.subject not in state.subjects:
            others = await overlapping_streams(conn.nc, api_prefix(js), spec.subject)
            if set(others) - {spec.name}:
                raise conflict_error(spec, others)
        if state is None or info is None:
            return StreamCheck(None, None, {})
        after = raised_state(state, info.config, spec)
        weak = {job: why for job, why in coverage(after, spec, config.jobs).items() if why}
        return StreamCheck(state, after, weak)


async def lower(
    config: Config, secrets: Secrets, confirm: Callable[[Lowering], bool]
) -> tuple[Lowering, StreamState | None]:
    """Plan lowering the stream, ask `confirm`, lower when it says yes; one connection.

    The plan and the stream as lowered (None when nothing changes or it was
    not confirmed). StreamNotFound when there is no stream.
    """
    async with connected(config, secrets) as conn:
        js = _js(conn)
        with answered():
            plan = await plan_lowering(js, stream_spec(config))
            if not plan.changes or not confirm(plan):
                return plan, None
            return plan, await lower_stream(js, stream_spec(config))


# ---------------------------------------------------------------------- pause, resume


async def pause(
    config: Config,
    secrets: Secrets,
    job: str,
    reason: str,
    by: str,
    force: bool = False,
    until: float | None = None,
) -> Paused:
    """Store ``paused.<job>`` unless the job is paused already (the bucket is created
    when missing). A pause in force is kept; with `force` it is replaced. With
    `until` (epoch s) the pause ends by itself then; one whose end has passed is
    no longer in force and is replaced."""
    value = {"by": by, "at": rfc3339(time.time()), "reason": reason}
    if until is not None:
        value["until"] = rfc3339(until)
    async with connected(config, secrets) as conn:
        kv = (await ensure_bucket(_js(conn), state_spec(config))).kv
        return await store_pause(kv, job, value, "replace" if force else "keep")


async def resume(
    config: Config, secrets: Secrets, job: str, bound: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """Delete ``paused.<job>``; the pause it removed, None when the job was not paused.

    `bound` is stored first as ``since.<job>`` (sidecar/run/since.py): catch-up of a
    sidecar started later never reaches back into the pause.
    """
    async with connected(config, secrets) as conn:
        js = _js(conn)
        bucket = state_spec(config).bucket
        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError as exc:
            raise StreamNotFound(
                f"state bucket {bucket} does not exist (nats.state_bucket; no sidecar has run "
                f"with these NATS settings, or it was deleted): nothing is paused there"
            ) from exc
        try:
            entry = await kv.get(paused_key(job))
        except KeyNotFoundError:
            return None
        if bound is not None:  # first the bound: a sidecar starting in between is still paused
            await put_json(kv, since_key(job), bound)
        await delete_at(kv, paused_key(job), entry.revision)
        # A resumed job starts counting its failures (pause_after) from 0.
        await reset(Keys(await ensure_bucket(js, state_spec(config))), job)
        return decode(entry.value)


async def status(config: Config, secrets: Secrets, now_ms: int) -> dict[str, Any]:
    from sidecar.ops.fleetview import fleet_status

    async with connected(config, secrets) as conn:
        with answered():
            return await fleet_status(_js(conn), config, now_ms)
