"""The admin server: ``/metrics``, ``/healthz``, ``/readyz``.

``/healthz`` is 200 while the process works; ``/readyz`` is 200 only while
connected to NATS with the stream in place, else 503 with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sidecar.errors import ConfigError

log = logging.getLogger(__name__)


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
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self.stop()
            raise ConfigError(
                "metrics.listen", f"cannot listen on {self.host}:{self.port}: {exc.strerror}"
            ) from exc
        log.info("serving /metrics /healthz /readyz on %s:%s", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        reason = self.not_ready_reason()
        if reason is None:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=f"not ready: {reason}\n")
