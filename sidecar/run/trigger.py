"""The trigger request to the app, over TCP or a unix socket, through h11.

One request per won claim. A request that provably never reached the app (the
connection itself failed: refused, socket missing, no connection within the
timeout) is retried with backoff until the slot's deadline; one that reached
it is never resent, whatever happened next (timeout, reset, 5xx). Every
request goes over a fresh connection, so a stale keep-alive connection can
never blur that line.

HTTP/1.1 framing and parsing are h11's; this module only moves bytes between
h11 and an asyncio stream, bounded in time (the request's timeout covers
connecting, sending, the answer and its whole body) and in memory: of the
answer's body at most ``MAX_ANSWER_KEPT`` bytes are kept (the start of a
non-2xx answer is its error message, the start of any answer what its result
record keeps: sidecar/core/excerpt.py), the rest is discarded as it arrives,
and a non-2xx answer is not read past them. The values of the request's
headers that ``answer.redact`` names are redacted from what is kept before
anything sees it. Errors are translated
where they cross into our code: ``OSError`` while connecting becomes
TriggerUndelivered, the timeout TriggerTimeout, anything after the connection
was made (reset, a malformed answer, an early close) a TriggerError.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import h11

from sidecar.config import params
from sidecar.config.load import JobConfig, RequestConfig, base_url_of, unix_socket_of
from sidecar.core import failpoints
from sidecar.core.backoff import Backoff
from sidecar.core.clock import Clock, rfc3339
from sidecar.core.errors import (
    TriggerError,
    TriggerFailed,
    TriggerLate,
    TriggerTimeout,
    TriggerUndelivered,
)
from sidecar.core.excerpt import MAX_ANSWER_BYTES, redact
from sidecar.core.wire import (
    AFTER_RUN_HEADER,
    ATTEMPT_HEADER,
    FENCE_HEADER,
    INSTANCE_HEADER,
    JOB_HEADER,
    PREVIOUS_HEADER,
    RUN_ID_HEADER,
    SCHEDULED_AT_HEADER,
    SLOT_HEADER,
    TRACEPARENT,
    TRIGGER_HEADER,
    traceparent,
)
from sidecar.obs import http1
from sidecar.obs.http1 import Answer

if TYPE_CHECKING:  # signing's code is loaded only with a signer (sidecar/cli/daemon.py)
    from sidecar.after.signing import Signer

__all__ = ["Trigger", "TriggerResult"]

log = logging.getLogger(__name__)

# Only this much of an answer's body goes into the message of a non-2xx answer.
MAX_ERROR_BODY = 200
# Only this much of an answer's body is kept at all (for the run's ping and
# record); more than the record's cap, so that the record knows it was cut.
MAX_ANSWER_KEPT = MAX_ANSWER_BYTES + 2048
# Between two tries of a request the app did not receive (refused, no socket).
UNDELIVERED_RETRY_START = 0.1
UNDELIVERED_RETRY_CAP = 5.0


@dataclass(frozen=True)
class Why:
    """Why a request is sent (``X-Anarchon-Trigger``) and the schedule's instant
    before its slot (``X-Anarchon-Previous-Scheduled-At``, RFC 3339; None: none)."""

    trigger: str
    previous: str | None = None
    after_run: str | None = None  # X-Anarchon-After-Run: the run this one follows


def why_of(job: JobConfig, slot: int, trigger: str) -> Why:
    """The Why of a run of `slot`: its trigger and the schedule's previous instant."""
    previous = job.schedule.previous_slot(slot)
    return Why(trigger, rfc3339(previous / 1000) if previous is not None else None)


#: ``on_retry(delivery tries so far, why, seconds left before giving up)``
RetryReport = Callable[[int, TriggerUndelivered, float], None]


@dataclass(frozen=True)
class TriggerResult:
    """How one run went; times are wall-clock epoch seconds."""

    ok: bool
    started_at: float
    finished_at: float
    duration: float
    http_status: int | None
    error: str | None
    delivery_tries: int  # requests sent to deliver this run (1: delivered at the first)
    late: bool = False  # nothing was sent: the last instant it could go out had passed
    answer: bytes = b""  # at most MAX_ANSWER_KEPT bytes of the app's answer, redacted
    content_type: str | None = None  # the answer's Content-Type; None: none or no answer


def cut_off(started_at: float, ran: float, error: str) -> TriggerResult:
    """A run whose connection the sidecar closed after `ran` seconds (measured on the
    monotonic clock from `started_at`, when its request went out): failed, with
    `error`, its times those of the run itself, not of the moment it was cut."""
    return TriggerResult(False, started_at, started_at + ran, ran, None, error, 1)


def interrupted(started_at: float, ran: float, grace: float) -> TriggerResult:
    """A run cut off by the drain after `ran` seconds: failed, outcome unknown."""
    return cut_off(
        started_at,
        ran,
        f"interrupted: still running after the {grace:g}s shutdown grace period; outcome unknown",
    )


@dataclass(frozen=True)
class Address:
    """Where a request goes: a unix socket, or a host and port; parsed once per URL."""

    socket: str | None
    host: str
    port: int
    where: str  # for messages: the socket path or http://host:port
    host_header: str  # ``host:port`` (no port for 80), ``localhost`` on a socket


@functools.lru_cache(maxsize=256)
def address_of(url: str) -> Address:
    socket = unix_socket_of(url)
    base = base_url_of(url)
    if socket is not None:
        return Address(socket, "localhost", 0, socket, "localhost")
    parts = urlsplit(base)
    host = parts.hostname or "localhost"
    port = parts.port or 80
    bracketed = f"[{host}]" if ":" in host else host
    return Address(None, host, port, base, bracketed if port == 80 else f"{bracketed}:{port}")


def host_header(req: RequestConfig) -> str:
    """``Host`` as a browser sends it: ``host:port`` (no port for 80), ``localhost`` on a socket."""
    return address_of(req.url).host_header


def encode_request(
    req: RequestConfig, headers: Mapping[str, str], body: bytes
) -> tuple[h11.Connection, bytes]:
    """The whole request as bytes (sidecar/obs/http1.py's framing), and the state to
    read its answer with."""
    return http1.encode(req.method, req.path, host_header(req), headers.items(), body)


class Trigger:
    """Sends trigger requests to the app; use as ``async with Trigger(...)``."""

    def __init__(
        self, signer: Signer | None, clock: Clock, instance: str = "", max_in_flight: int = 0
    ) -> None:
        self.signer = signer
        self.clock = clock
        self.instance = instance
        # target.max_in_flight (docs/CONFIG.md): 10,000 jobs due at one instant must
        # not open 10,000 connections to the app. 0: no bound (a one-shot command).
        self.max_in_flight = max_in_flight
        self._gate = asyncio.Semaphore(max_in_flight) if max_in_flight > 0 else None

    async def __aenter__(self) -> Trigger:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None  # nothing is kept between requests

    def headers(
        self,
        job: JobConfig,
        slot: int,
        token: str,
        body: bytes,
        attempt: int = 1,
        fence: int | None = None,
        why: Why | None = None,
    ) -> dict[str, str]:
        headers = dict(job.request.headers)
        headers.update(
            {
                JOB_HEADER: job.name,
                SLOT_HEADER: str(slot),
                RUN_ID_HEADER: token,
                SCHEDULED_AT_HEADER: rfc3339(slot / 1000),
            }
        )
        if self.instance:
            headers[INSTANCE_HEADER] = self.instance
        headers[ATTEMPT_HEADER] = str(attempt)
        # A trace per run (sidecar/obs/tracing.py); a configured tracestate passes as is.
        headers[TRACEPARENT] = traceparent(token)
        if fence is not None:
            # The won claim's stream sequence: it grows with every claim on
            # the stream, so an app can refuse a request older than one it ran.
            headers[FENCE_HEADER] = str(fence)
        if why is not None:
            headers[TRIGGER_HEADER] = why.trigger
            if why.previous is not None:
                headers[PREVIOUS_HEADER] = why.previous
            if why.after_run is not None:
                headers[AFTER_RUN_HEADER] = why.after_run
        if self.signer is not None:
            from sidecar.after.signing import SIGNATURE_HEADER, SignedFields

            req = job.request
            signed = SignedFields(
                req.method,
                req.path,
                job.name,
                slot,
                token,
                body,
                attempt=attempt,
                fence=fence,
                trigger=why.trigger if why is not None else None,
                previous=why.previous if why is not None else None,
            )
            headers[SIGNATURE_HEADER] = self.signer.header(int(self.clock.wall()), signed)
        return headers

    async def fire(
        self,
        job: JobConfig,
        slot: int,
        token: str,
        deadline: float,
        attempt: int = 1,
        fence: int | None = None,
        on_retry: RetryReport | None = None,
        send_by: float | None = None,
        why: Why | None = None,
    ) -> TriggerResult:
        """Run the job's request once; retry only while undelivered and before `deadline`.

        `deadline` and `send_by` are on the clock's monotonic (suspend-aware)
        scale. With `send_by` (a scheduled run: its slot + max_late) no
        request goes out after it, the first one included: a winner frozen
        between its claim and here (SIGSTOP, a long pause, a suspend) sends
        nothing and gets a result with ``late`` set. Never raises for the
        app's behaviour: the outcome is in the result. Each retry is logged
        (the first as a warning), or given to `on_retry` instead when there is
        one.
        """
        started_at = self.clock.wall()
        t0 = time.perf_counter()
        delivery_tries = 0
        backoff = Backoff(UNDELIVERED_RETRY_START, UNDELIVERED_RETRY_CAP)
        while True:
            delivery_tries += 1
            try:
                await self._enter(send_by)
                try:
                    answer = await self._send(job, slot, token, attempt, fence, send_by, why)
                finally:
                    if self._gate is not None:
                        self._gate.release()
            except TriggerLate as exc:
                return self._result(started_at, t0, None, str(exc), delivery_tries, late=True)
            except TriggerUndelivered as exc:
                remaining = deadline - self.clock.monotonic()
                if remaining <= backoff.current:
                    return self._result(started_at, t0, None, f"{exc} (gave up)", delivery_tries)
                if on_retry is not None:
                    on_retry(delivery_tries, exc, remaining)
                else:
                    (log.warning if delivery_tries == 1 else log.debug)(
                        "job %s slot %s: app not reachable (%s); retrying in %.1fs",
                        job.name,
                        slot,
                        exc,
                        backoff.current,
                    )
                await backoff.sleep()
                continue
            except TriggerError as exc:
                return self._result(
                    started_at,
                    t0,
                    exc.http_status,
                    str(exc),
                    delivery_tries,
                    answer=Answer(exc.http_status or 0, exc.answer, exc.content_type),
                )
            return self._result(started_at, t0, answer.status, None, delivery_tries, answer=answer)

    async def send_once(
        self,
        job: JobConfig,
        slot: int,
        token: str,
        attempt: int,
        fence: int | None,
        why: Why | None,
    ) -> tuple[int, bytes]:
        """One request of `job`'s request, never retried: the 2xx status and the start of
        the answer, or a TriggerError (the cancel request of sidecar/run/stoprequests.py)."""
        answer = await self._send(job, slot, token, attempt, fence, None, why)
        return answer.status, answer.body

    def _result(
        self,
        started_at: float,
        t0: float,
        status: int | None,
        error: str | None,
        delivery_tries: int,
        late: bool = False,
        answer: Answer | None = None,
    ) -> TriggerResult:
        duration = time.perf_counter() - t0
        return TriggerResult(
            ok=error is None,
            started_at=started_at,
            finished_at=started_at + duration,
            duration=duration,
            http_status=status,
            error=error,
            delivery_tries=delivery_tries,
            late=late,
            answer=answer.body if answer is not None else b"",
            content_type=answer.content_type if answer is not None else None,
        )

    async def _enter(self, send_by: float | None) -> None:
        """A place among the requests in flight (``max_in_flight``), waited for up to
        `send_by`; TriggerLate when none was free by then."""
        if self._gate is None:
            return
        if send_by is None:
            await self._gate.acquire()
            return
        self._too_late(send_by)
        if not self._gate.locked():
            await self._gate.acquire()
            return
        try:
            async with asyncio.timeout(send_by - self.clock.monotonic()):
                await self._gate.acquire()
        except TimeoutError:
            raise TriggerLate(
                f"late: not sent, {self.max_in_flight} requests to the app still in flight "
                "(target.max_in_flight) at slot + max_late"
            ) from None

    def _too_late(self, send_by: float | None) -> None:
        """TriggerLate when the last instant the request could go out has passed."""
        if send_by is not None and (late := self.clock.monotonic() - send_by) >= 0:
            raise TriggerLate(f"late: not sent, {late:.3f}s past slot + max_late")

    async def _send(
        self,
        job: JobConfig,
        slot: int,
        token: str,
        attempt: int,
        fence: int | None,
        send_by: float | None = None,
        why: Why | None = None,
    ) -> Answer:
        """One request over a fresh connection: the 2xx answer as kept, or a
        TriggerError."""
        self._too_late(send_by)
        if job.request.params:
            # Run parameters (docs/TRIGGER.md): the rendered request is the one
            # sent and signed. A job without them skips this.
            run = params.values(
                job.name,
                slot,
                token,
                attempt,
                why.trigger if why is not None else None,
                self.instance,
                rfc3339(slot / 1000),
            )
            job = dataclasses.replace(job, request=params.render_request(job.request, run))
        req = job.request
        body = req.body.encode()
        try:
            conn, request = encode_request(
                req, self.headers(job, slot, token, body, attempt, fence, why), body
            )
        except h11.LocalProtocolError as exc:  # config validation should make this unreachable
            raise TriggerError(f"cannot build the request: {exc}") from exc
        addr = address_of(req.url)
        where = addr.where
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(req.timeout):
                try:
                    if addr.socket is not None:
                        reader, writer = await asyncio.open_unix_connection(addr.socket)
                    else:
                        reader, writer = await asyncio.open_connection(addr.host, addr.port)
                except OSError as exc:
                    # The connection was never made: nothing reached the app.
                    raise TriggerUndelivered(f"cannot connect to {where}: {exc}") from exc
                if failpoints.ENABLED:
                    await failpoints.hit("trigger.before_send")
                # The last look at the time before the first byte goes out.
                self._too_late(send_by)
                writer.write(request)
                await writer.drain()
                answer = await http1.read_answer(reader, conn, MAX_ANSWER_KEPT)
        except TimeoutError as exc:
            if writer is None:
                raise TriggerUndelivered(
                    f"cannot connect to {where}: no connection within {req.timeout:g}s"
                ) from exc
            raise TriggerTimeout(f"no answer within {req.timeout:g}s") from exc
        except (OSError, h11.RemoteProtocolError) as exc:
            raise TriggerError(
                f"request failed after connecting: {type(exc).__name__} {exc}"
            ) from exc
        finally:
            if writer is not None:
                writer.transport.abort()
        # Before anything reads it (the error message, the record, pings): an app
        # that echoes the request's credentials does not put them in history.
        kept = redact(answer.body, job.answer.secrets(req.headers))
        status = answer.status
        if 200 <= status < 300:
            return answer._replace(body=kept)
        detail = " ".join(kept[:MAX_ERROR_BODY].decode(errors="replace").split())
        raise TriggerFailed(
            f"HTTP {status}" + (f": {detail}" if detail else ""), status, kept, answer.content_type
        )
