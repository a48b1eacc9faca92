"""The NATS connection: options from the config, the first connect, its state.

The first connect tries each server once and fails with ConnectError (the
CLI exits 3); after that the client reconnects forever, and the connection's
state is kept here for readiness, metrics and claims that wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import TYPE_CHECKING, Any

import nats
from nats.aio.client import Client as NATS

from sidecar.config import Config, Secrets
from sidecar.errors import ConnectError
from sidecar.ratelog import RateLimitedLog

if TYPE_CHECKING:  # the metrics (prometheus_client) are the daemon's, not the one-shot commands'
    from sidecar.metrics import Metrics

log = logging.getLogger(__name__)

# Seconds between reconnect attempts to one server once running.
RECONNECT_WAIT = 1.0


def tls_context(config: Config) -> ssl.SSLContext | None:
    tls = config.nats.tls
    wants_tls = tls is not None or any(s.startswith("tls://") for s in config.nats.servers)
    if not wants_tls:
        return None
    ctx = ssl.create_default_context(cafile=tls.ca_file if tls else None)
    if tls and tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def connect_options(config: Config, secrets: Secrets) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect``; secrets go only here."""
    n = config.nats
    opts: dict[str, Any] = {
        "servers": list(n.servers),
        "name": f"anarchon-sidecar {config.instance_id}",
        "connect_timeout": n.connect_timeout,
        # At start each server is tried twice, a quarter second apart (nats-py
        # counts attempts after the first); the CLI exits 3 if none answers.
        # Connect() then switches to reconnecting forever.
        "reconnect_time_wait": 0.25,
        "max_reconnect_attempts": 1,
        "allow_reconnect": True,
    }
    if n.user:
        opts["user"] = n.user
    if secrets.nats_password:
        opts["password"] = secrets.nats_password
    if secrets.nats_token:
        opts["token"] = secrets.nats_token
    if n.creds_file:
        opts["user_credentials"] = n.creds_file
    if n.nkey_seed_file:
        opts["nkeys_seed"] = n.nkey_seed_file
    ctx = tls_context(config)
    if ctx is not None:
        opts["tls"] = ctx
    return opts


class Connection:
    """One NATS connection and what the rest of the sidecar needs to know of it."""

    def __init__(self, config: Config, secrets: Secrets, metrics: Metrics | None = None) -> None:
        self.config = config
        self.secrets = secrets
        self.metrics = metrics
        self.nc: NATS | None = None
        self.connected = asyncio.Event()
        self.closing = False
        # NATS down means one error per reconnect attempt, every second: say it once a minute.
        self.warnings = RateLimitedLog(log)

    async def connect(self) -> NATS:
        """Connect once; ConnectError with a one-line reason when no server answers."""
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            if self.nc is None or not self.nc.is_connected:
                errors.append(_reason(exc))
            if self.nc is None:  # the first connect: its ConnectError says it, in one line
                log.debug("nats: %s", _reason(exc))
            else:
                self.warnings.warning("nats", "nats: %s", _reason(exc))

        try:
            nc = await nats.connect(
                **connect_options(self.config, self.secrets),
                error_cb=on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
                closed_cb=self._on_closed,
            )
        except Exception as exc:  # nats-py raises many kinds; all mean "cannot connect"
            servers = ", ".join(self.config.nats.servers)
            detail = errors[-1] if errors else _reason(exc)
            raise ConnectError(f"cannot connect to NATS at {servers}: {detail}") from exc
        nc.options["max_reconnect_attempts"] = -1  # from now on, reconnect forever
        nc.options["reconnect_time_wait"] = RECONNECT_WAIT
        self.nc = nc
        self._set_connected(True)
        assert nc.connected_url is not None
        log.info("connected to NATS at %s", nc.connected_url.netloc)
        return nc

    def _set_connected(self, up: bool) -> None:
        if up:
            self.connected.set()
        else:
            self.connected.clear()
        if self.metrics is not None:
            self.metrics.nats_connected.set(1 if up else 0)

    async def _on_disconnected(self) -> None:
        if self.connected.is_set() and not self.closing:
            log.warning("disconnected from NATS; reconnecting")
        self._set_connected(False)

    async def _on_reconnected(self) -> None:
        self.warnings.clear("nats")
        self._set_connected(True)
        if self.metrics is not None:
            self.metrics.nats_reconnects_total.inc()
        url = self.nc.connected_url.netloc if self.nc and self.nc.connected_url else "?"
        log.info("reconnected to NATS at %s", url)

    async def _on_closed(self) -> None:
        self._set_connected(False)

    async def wait_connected(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the connection; True when connected."""
        if self.connected.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.connected.wait(), timeout)
        return self.connected.is_set()

    async def close(self, drain: bool = True) -> None:
        if self.nc is None or self.nc.is_closed:
            return
        self.closing = True
        try:
            if drain and self.nc.is_connected:
                await self.nc.drain()
            else:
                await self.nc.close()
        except Exception as exc:  # closing is best effort
            log.debug("closing NATS connection: %r", exc)
            with contextlib.suppress(Exception):
                await self.nc.close()
        self._set_connected(False)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text and text != name else name
