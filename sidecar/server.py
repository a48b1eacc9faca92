"""The admin server: ``/metrics``, ``/healthz``, ``/readyz``.

``/healthz`` is 200 while the process works; ``/readyz`` is 200 only while
connected to NATS with the stream in place, else 503 with the reason.

Three fixed GET endpoints need no web framework: this is a minimal HTTP/1.1
responder on asyncio streams (one request per connection, bounded in size and
time). aiohttp's server alone would add about 2 MiB to every sidecar.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sidecar.errors import ConfigError

log = logging.getLogger(__name__)

# A request must arrive whole within this time, in at most this many header lines.
REQUEST_TIMEOUT = 10.0
MAX_HEADER_LINES = 100
TEXT = "text/plain; charset=utf-8"
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


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
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._handle, self.host, self.port, reuse_address=True
            )
        except OSError as exc:
            raise ConfigError(
                "metrics.listen", f"cannot listen on {self.host}:{self.port}: {exc.strerror}"
            ) from exc
        log.info("serving /metrics /healthz /readyz on %s:%s", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        """Status, content type and body for one request."""
        if path not in ("/metrics", "/healthz", "/readyz"):
            return 404, TEXT, b"not found\n"
        if method not in ("GET", "HEAD"):
            return 405, TEXT, b"method not allowed\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/healthz":
            return 200, TEXT, b"ok\n"
        reason = self.not_ready_reason()
        if reason is None:
            return 200, TEXT, b"ready\n"
        return 503, TEXT, f"not ready: {reason}\n".encode()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                request_line = await reader.readline()
                for _ in range(MAX_HEADER_LINES):
                    if await reader.readline() in (b"\r\n", b"\n", b""):
                        break
            parts = request_line.decode("latin-1").split()
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                status, ctype, body = 400, TEXT, b"bad request\n"
                method = "GET"
            else:
                method = parts[0]
                status, ctype, body = self.respond(method, parts[1].split("?", 1)[0])
            head = (
                f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            writer.write(head if method == "HEAD" else head + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):
            pass  # a client that is too slow, too big or gone gets nothing more
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await writer.wait_closed()
