"""Requests the sidecar sends out on its own behalf: pings, webhooks, spans.

``post`` sends one POST over a fresh connection (HTTP/1.1 framed and read by
sidecar/obs/http1.py, the trigger's client too; TLS from the standard library
for ``https://``) and returns the status.
``Outbox`` runs such sends in the background with bounded retries and
backoff: nothing here ever delays a trigger, and the daemon's drain waits for
what is still queued for a bounded time.

Sends are bounded per receiver (scheme, host, port), not only in number: at
most MAX_CONNECTIONS of them hold a connection to one receiver at once (the
rest wait without a socket), at most MAX_QUEUED_PER_RECEIVER wait for one
receiver (more are dropped, said once a minute), and each send ends within
its `give_up` seconds, waits included. A receiver that accepts connections
and never answers cost one file descriptor per send until the queue's cap
(1,000): under a 256-file limit the app's triggers then failed with "Too
many open files". Now it costs MAX_CONNECTIONS. Every URL here is a secret (it holds
the check's or channel's key): messages name it only through ``mask_url``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any
from urllib.parse import urlsplit

import h11

from sidecar.config.alerting import mask_url
from sidecar.core.backoff import Backoff
from sidecar.core.errors import SendError
from sidecar.core.tasks import TaskSet, cancel_all
from sidecar.obs import http1
from sidecar.obs.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

# Of an answer only this much is read (for the message of a refusal).
MAX_ANSWER = 512
# The drain waits at most this long for queued sends before dropping them.
DRAIN_TIMEOUT = 5.0
# At most this many sends wait at once; more are dropped (receivers that hang).
MAX_QUEUED = 1000
# Per receiver: connections open at once, and sends waiting (more are dropped).
MAX_CONNECTIONS = 4
MAX_QUEUED_PER_RECEIVER = 200
# Each wait between two tries of a send is its doubled backoff times 0.8 to 1.2.
SEND_RETRY_JITTER = 0.2

_ssl: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    global _ssl
    if _ssl is None:
        _ssl = ssl.create_default_context()
    return _ssl


async def post(
    url: str, body: bytes, headers: Mapping[str, str], timeout: float
) -> tuple[int, bytes]:
    """POST `body` to `url`; (status, the first MAX_ANSWER bytes). SendError on failure."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or "localhost"
    port = parts.port or (443 if tls else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    try:
        conn, request = http1.encode("POST", target, host_header, headers.items(), body)
    except h11.LocalProtocolError as exc:
        raise SendError(f"cannot build the request: {exc}") from exc
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            try:
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=_ssl_context() if tls else None
                )
            except ssl.SSLCertVerificationError as exc:
                raise SendError(f"TLS certificate refused: {exc.verify_message}") from exc
            except OSError as exc:
                raise SendError(f"cannot connect: {exc.strerror or type(exc).__name__}") from exc
            writer.write(request)
            await writer.drain()
            # Only the start of any answer is kept, a 2xx one's too (a ping's
            # receiver answers "OK"; nothing waits on the rest).
            answer = await http1.read_answer(reader, conn, MAX_ANSWER, whole_2xx=False)
    except TimeoutError as exc:
        raise SendError(f"no answer within {timeout:g}s") from exc
    except (OSError, h11.RemoteProtocolError) as exc:
        raise SendError(f"request failed: {type(exc).__name__}") from exc
    finally:
        if writer is not None:
            writer.transport.abort()
    return answer.status, answer.body


async def _dropped(done: Callable[[bool], None] | None) -> bool:
    if done is not None:
        done(False)
    return False


def receiver_of(url: str) -> str:
    """Who answers `url`: scheme, host and port (never the path, which holds the key)."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    try:
        port = parts.port or (443 if tls else 80)
    except ValueError:
        port = 0
    return f"{parts.scheme}://{parts.hostname or 'localhost'}:{port}"


def retryable(status: int) -> bool:
    """Whether an answer with this status may be asked again (5xx, 408, 429)."""
    return status >= 500 or status in (408, 429)


class Outbox:
    """Background sends with bounded retries; ``drain`` on shutdown.

    Each send is tried up to `attempts` times, waiting `backoff` doubled each
    time (with a little jitter) in between, and given up after `give_up`
    seconds in all; a 4xx other than 408/429 is not asked again.
    """

    def __init__(
        self, attempts: int = 5, backoff: float = 1.0, give_up: float = 120.0, timeout: float = 10.0
    ) -> None:
        self.attempts = attempts
        self.backoff = backoff
        self.give_up = give_up
        self.timeout = timeout
        self.tasks = TaskSet("a send", say=False)
        # Per receiver: the connections it may hold, and how many sends are queued for it.
        self._gates: dict[str, asyncio.Semaphore] = {}
        self._queued: dict[str, int] = {}
        self._said = RateLimitedLog(log)

    def send(
        self,
        what: str,
        url: str,
        body: bytes | Callable[[], bytes],
        headers: Mapping[str, str] | Callable[[bytes], Mapping[str, str]],
        done: Callable[[bool], None] | None = None,
        after: Awaitable[object] | None = None,
    ) -> asyncio.Task[bool]:
        """Queue a POST; `done(sent)` is told the outcome. `after`: awaited first (bounded).

        With MAX_QUEUED sends waiting already, it is dropped (`done(False)`).
        """
        receiver = receiver_of(url)
        queued = self._queued.get(receiver, 0)
        if len(self.tasks) >= MAX_QUEUED or queued >= MAX_QUEUED_PER_RECEIVER:
            self._said.warning(
                f"dropped:{receiver}",
                "%s to %s dropped: %d sends waiting (%d for that receiver)",
                what,
                mask_url(url),
                len(self.tasks),
                queued,
            )
            coro: Coroutine[Any, Any, bool] = _dropped(done)
        else:
            self._queued[receiver] = queued + 1
            coro = self._bounded(receiver, what, url, body, headers, done, after)
        return self.tasks.spawn(coro)

    async def _bounded(
        self,
        receiver: str,
        what: str,
        url: str,
        body: bytes | Callable[[], bytes],
        headers: Mapping[str, str] | Callable[[bytes], Mapping[str, str]],
        done: Callable[[bool], None] | None,
        after: Awaitable[object] | None,
    ) -> bool:
        """``_deliver`` within `give_up` seconds in all, through the receiver's gate."""
        gate = self._gates.get(receiver)
        if gate is None:
            gate = self._gates[receiver] = asyncio.Semaphore(MAX_CONNECTIONS)
        told: list[bool] = []

        def tell(sent: bool) -> None:
            told.append(sent)
            if done is not None:
                done(sent)

        try:
            async with asyncio.timeout(self.give_up):
                return await self._deliver(what, url, body, headers, tell, after, gate)
        except TimeoutError:
            log.warning(
                "%s to %s not delivered: not done within %gs (gave up)",
                what,
                mask_url(url),
                self.give_up,
            )
            if not told:
                tell(False)
            return False
        finally:
            left = self._queued.get(receiver, 1) - 1
            if left > 0:
                self._queued[receiver] = left
            else:  # nothing queued for it: forget the receiver
                self._queued.pop(receiver, None)
                self._gates.pop(receiver, None)

    async def _deliver(
        self,
        what: str,
        url: str,
        body: bytes | Callable[[], bytes],
        headers: Mapping[str, str] | Callable[[bytes], Mapping[str, str]],
        done: Callable[[bool], None] | None,
        after: Awaitable[object] | None,
        gate: asyncio.Semaphore,
    ) -> bool:
        loop = asyncio.get_running_loop()
        start = loop.time()
        if after is not None:
            # e.g. a run's /start before its end: in order, but never stuck behind it.
            try:
                async with asyncio.timeout(self.timeout):
                    await asyncio.shield(after)
            except Exception:
                pass
        data = body() if callable(body) else body
        backoff = Backoff(self.backoff, math.inf, jitter=SEND_RETRY_JITTER)
        sent = False
        why = ""
        for attempt in range(1, self.attempts + 1):
            try:
                # Signed per attempt: a signature's time is when it was sent.
                async with gate:  # a connection of the receiver's few, or wait for one
                    fields = headers(data) if callable(headers) else headers
                    status, answer = await post(url, data, fields, self.timeout)
            except SendError as exc:
                why = str(exc)
            else:
                if 200 <= status < 300:
                    sent = True
                    break
                detail = " ".join(answer.decode(errors="replace").split())[:120]
                why = f"HTTP {status}" + (f": {detail}" if detail else "")
                if not retryable(status):
                    break
            if attempt == self.attempts or loop.time() - start + backoff.current > self.give_up:
                break
            log.debug("%s to %s: %s; again in %.1fs", what, mask_url(url), why, backoff.current)
            await backoff.sleep()
        if not sent:
            log.warning("%s to %s not delivered: %s (gave up)", what, mask_url(url), why)
        if done is not None:
            done(sent)
        return sent

    async def drain(self, timeout: float = DRAIN_TIMEOUT) -> None:
        """Wait for queued sends up to `timeout`, then drop the rest (said in the log)."""
        if not self.tasks:
            return
        _, pending = await asyncio.wait(set(self.tasks), timeout=timeout)
        if pending:
            log.warning("%d ping(s) or notification(s) dropped at shutdown", len(pending))
            await cancel_all(pending)
