"""The admin server: ``/metrics``, ``/healthz``, ``/readyz``.

``/healthz`` is 200 while the process works; ``/readyz`` is 200 only while
connected to NATS with the stream in place, else 503 with the reason.

HTTP/1.1 through h11 on asyncio streams, one request per connection. The port
is often reachable by more than Prometheus, and the sidecar's job loops share
its event loop, so every cost a client can cause is bounded:

- time: the request must arrive within ``REQUEST_TIMEOUT`` and the whole
  exchange (reading, writing the answer, closing) end within
  ``EXCHANGE_TIMEOUT``; a slow reader is cut off, not waited for;
- size: request line and headers at most ``MAX_REQUEST_HEAD`` bytes (read in
  pieces of that size, so at most twice it is ever held); the
  answer is written in ``WRITE_CHUNK`` pieces, each drained before the next,
  so a slow reader holds one piece in memory, not a copy of the whole body;
- bandwidth: answers share ``SEND_RATE`` bytes a second after a burst of
  ``SEND_BURST`` (a scrape of a few MB goes out at once; clients scraping
  in a tight loop get that rate between them, not the loop's time);
- connections: at most ``MAX_CONNECTIONS`` at once. One more takes the place
  of the oldest connection still waiting for its request (an idle flood
  cannot lock Prometheus out: a real client sends at once and is answered);
  when every held connection is being answered, the new one is closed as
  soon as it is accepted. Either is logged at most once a minute;
- ``/metrics``: the body is rendered on the event loop in slices and reused
  while fresh (sidecar/obs/exposition.py): however many scrape it, rendering
  takes about a tenth of the loop's time.

Everything else (the fleet page, ``/api/v1/...``, its event stream) goes to
``app`` (sidecar/admin/api.py) when the page is on, under the same bounds, with
request bodies of at most ``MAX_BODY`` bytes. An event stream is the one
answer that outlives ``EXCHANGE_TIMEOUT``: it is written piece by piece, each
piece drained within ``STREAM_WRITE_TIMEOUT`` or the viewer is dropped, and
at most ``MAX_STREAMS`` are open at once (fewer than ``MAX_CONNECTIONS``, so
viewers can never lock Prometheus out).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import h11
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from sidecar.core.errors import ConfigError, ListenError
from sidecar.obs.exposition import MetricsCache

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 5.0
EXCHANGE_TIMEOUT = 10.0
MAX_REQUEST_HEAD = 8192
MAX_CONNECTIONS = 32
WRITE_CHUNK = 64 * 1024
SEND_RATE = 32 * 1024 * 1024
SEND_BURST = 8 * 1024 * 1024
MAX_BODY = 16 * 1024
MAX_STREAMS = 16
STREAM_WRITE_TIMEOUT = 10.0
# After refusing a request, its unread rest is discarded for at most this long.
LINGER = 2.0
# Refused connections are logged at most this often.
REFUSAL_LOG_INTERVAL = 60.0
TEXT = "text/plain; charset=utf-8"
REASONS = {
    200: b"OK",
    202: b"Accepted",
    303: b"See Other",
    304: b"Not Modified",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    409: b"Conflict",
    413: b"Content Too Large",
    415: b"Unsupported Media Type",
    431: b"Request Header Fields Too Large",
    501: b"Not Implemented",
    503: b"Service Unavailable",
}


@dataclass(frozen=True)
class Request:
    """One request as the app sees it (header names in lower case)."""

    method: str
    path: str
    query: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    peer: str = ""


@dataclass(frozen=True)
class Answer:
    status: int
    ctype: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Stream:
    """An answer written as it comes (server-sent events); ``chunks`` ends it by ending."""

    chunks: AsyncIterator[bytes]
    ctype: str = "text/event-stream; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


App = Callable[[Request], Awaitable[Answer | Stream | None]]
METRICS_PATHS = ("/metrics", "/healthz", "/readyz")


class Pacer:
    """A shared byte budget: `rate` a second, after a burst of `burst`."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._free_at = 0.0  # when the budget spent so far is paid back

    async def take(self, n: int) -> None:
        now = time.monotonic()
        start = max(self._free_at, now - self.burst / self.rate)
        self._free_at = start + n / self.rate
        if start > now:
            await asyncio.sleep(start - now)


class AdminServer:
    """Serves the registry and the health of one sidecar."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        not_ready_reason: Callable[[], str | None],
    ) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self.not_ready_reason = not_ready_reason
        # The fleet page and its API (sidecar/admin/api.py); None: only the three paths.
        self.app: App | None = None
        self.streams = 0
        self.metrics = MetricsCache(registry)
        self.pacer = Pacer(SEND_RATE, SEND_BURST)
        # Open connections: still waiting for their request (oldest first),
        # and being answered.
        self._waiting: dict[asyncio.WriteTransport, None] = {}
        self._answering: set[asyncio.WriteTransport] = set()
        self._refused = 0
        self._next_refusal_log = 0.0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._handle, self.host, self.port, reuse_address=True
            )
        except socket.gaierror as exc:  # a host name that does not resolve: the config
            raise ConfigError(
                "metrics.listen", f"cannot listen on {self.host}:{self.port}: {exc.strerror}"
            ) from exc
        except OSError as exc:  # the config is fine, this host is not: busy, not allowed
            raise ListenError(self.host, self.port, exc) from exc
        log.info("serving /metrics /healthz /readyz on %s:%s", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        """Status, content type and body for one request."""
        if path not in METRICS_PATHS:
            return 404, TEXT, b"not found\n"
        if method not in ("GET", "HEAD"):
            return 405, TEXT, b"method not allowed\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, await self.metrics.body()
        if path == "/healthz":
            return 200, TEXT, b"ok\n"
        reason = self.not_ready_reason()
        if reason is None:
            return 200, TEXT, b"ready\n"
        return 503, TEXT, f"not ready: {reason}\n".encode()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        if self.connections >= MAX_CONNECTIONS:
            self._log_refusal()
            if not self._waiting:
                transport.abort()
                return
            self._displace(next(iter(self._waiting)))
        self._waiting[transport] = None
        try:
            async with asyncio.timeout(EXCHANGE_TIMEOUT):
                streaming = await self._exchange(reader, writer)
                if streaming is None:
                    writer.close()
                    await writer.wait_closed()
            if streaming is not None:
                await self._pump(writer, *streaming)
        except (TimeoutError, OSError, h11.ProtocolError):
            pass  # a client that is too slow, too big or gone gets nothing more
        finally:
            self._waiting.pop(transport, None)
            self._answering.discard(transport)
            transport.abort()  # at once, whatever is still buffered

    @property
    def connections(self) -> int:
        return len(self._waiting) + len(self._answering)

    def _displace(self, transport: asyncio.WriteTransport) -> None:
        """Close a connection that has not sent its request, for a newer one."""
        del self._waiting[transport]
        transport.abort()

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[h11.Connection, Stream] | None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
        method, path, query = "GET", "", ""
        headers: dict[str, str] = {}
        body = bytearray()
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await reader.read(MAX_REQUEST_HEAD))
                    elif isinstance(event, h11.Request):
                        method = event.method.decode("ascii", "replace")
                        target = event.target.decode("ascii", "replace")
                        path, _, query = target.partition("?")
                        headers = {
                            k.decode("ascii", "replace"): v.decode("latin-1")
                            for k, v in event.headers
                        }
                    elif isinstance(event, h11.Data):
                        body += event.data
                        if len(body) > MAX_BODY:
                            await self._answer(
                                writer, conn, "GET", 413, TEXT, b"request body too large\n"
                            )
                            await self._linger(reader, writer)
                            return None
                    elif isinstance(event, h11.EndOfMessage):
                        self._waiting.pop(writer.transport, None)
                        self._answering.add(writer.transport)
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return None
            answer = await self._dispatch(
                Request(method, path, query, headers, bytes(body), _peer(writer))
            )
        except h11.RemoteProtocolError as exc:
            status, ctype, text = exc.error_status_hint, TEXT, b"bad request\n"
            if status not in REASONS:
                status = 400
            await self._answer(writer, conn, "GET", status, ctype, text)
            await self._linger(reader, writer)
            return None
        if isinstance(answer, Stream):
            if self.streams >= MAX_STREAMS:
                await self._answer(
                    writer, conn, method, 503, TEXT, b"too many event streams open\n"
                )
                return None
            return conn, answer
        await self._answer(
            writer, conn, method, answer.status, answer.ctype, answer.body, answer.headers
        )
        return None

    async def _dispatch(self, request: Request) -> Answer | Stream:
        if request.path in METRICS_PATHS or self.app is None:
            return Answer(*await self.respond(request.method, request.path))
        answer = await self.app(request)
        return answer if answer is not None else Answer(404, TEXT, b"not found\n")

    async def _pump(
        self, writer: asyncio.StreamWriter, conn: h11.Connection, stream: Stream
    ) -> None:
        """Write an event stream until it ends, the viewer goes, or a write stalls."""
        self.streams += 1
        try:
            head = h11.Response(
                status_code=200,
                reason=REASONS[200],
                headers=[("Content-Type", stream.ctype), *stream.headers],
            )
            writer.write(conn.send(head) or b"")
            async for chunk in stream.chunks:
                writer.write(conn.send(h11.Data(data=chunk)) or b"")
                async with asyncio.timeout(STREAM_WRITE_TIMEOUT):
                    await writer.drain()
        finally:
            self.streams -= 1
            aclose = getattr(stream.chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _answer(
        self,
        writer: asyncio.StreamWriter,
        conn: h11.Connection,
        method: str,
        status: int,
        ctype: str,
        body: bytes,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        head = h11.Response(
            status_code=status,
            reason=REASONS[status],
            headers=[
                ("Content-Type", ctype),
                ("Content-Length", str(len(body))),
                ("Connection", "close"),
                *extra,
            ],
        )
        writer.write(conn.send(head) or b"")
        if method != "HEAD":
            for start in range(0, len(body), WRITE_CHUNK):
                await writer.drain()
                await self.pacer.take(min(WRITE_CHUNK, len(body) - start))
                writer.write(conn.send(h11.Data(data=body[start : start + WRITE_CHUNK])) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """After refusing a request read only in part: end our side, discard the rest.

        Closing with unread input would reset the connection, and a client can
        lose the answer to that; the rest is read (and dropped) for a moment.
        """
        writer.write_eof()
        async with asyncio.timeout(LINGER):
            while await reader.read(WRITE_CHUNK):
                pass

    def _log_refusal(self) -> None:
        self._refused += 1
        now = time.monotonic()
        if now >= self._next_refusal_log:
            log.warning(
                "admin server: %d connections open, the limit; %d more came, each closing "
                "the oldest one still waiting for its request, or closed at once when "
                "none was (logged at most every %gs)",
                MAX_CONNECTIONS,
                self._refused,
                REFUSAL_LOG_INTERVAL,
            )
            self._refused = 0
            self._next_refusal_log = now + REFUSAL_LOG_INTERVAL


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer or "")
