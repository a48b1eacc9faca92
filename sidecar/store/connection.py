"""The NATS connection: options from the config, the first connect, its state.

The first connect tries each server once and fails with ConnectError (the
CLI exits 3); after that the client reconnects forever, and the connection's
state is kept here for readiness, metrics and claims that wait for it.

When the config asks for TLS, every connection attempt (first connect and
reconnects) refuses a server that does not encrypt before anything is sent
(Client, in sidecar/core/natspy.py): nats-py on its own upgrades only when the
server's INFO says ``tls_required``, so a server or a man in the middle that
leaves it out would otherwise receive CONNECT, credentials included, in clear.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from sidecar.config.addresses import redact_url
from sidecar.config.load import Config, Secrets
from sidecar.core.errors import ConnectError
from sidecar.core.natspy import Client as Client  # re-exported: the client with its TLS guards
from sidecar.core.natspy import PlaintextRefused, force_reconnect, rotate_to_next_server
from sidecar.obs.ratelog import RateLimitedLog
from sidecar.store.permissions import Denials

if TYPE_CHECKING:  # the metrics (prometheus_client) are the daemon's, not the one-shot commands'
    from sidecar.obs.metrics import Metrics

log = logging.getLogger(__name__)

# Seconds between reconnect attempts to one server once running.
RECONNECT_WAIT = 1.0
# On exit, how long subscriptions may take to drain (nats-py waits 30 s by
# default): results are already acknowledged by then, and a stop must fit in
# the orchestrator's grace period, also when a watch stopped reading.
DRAIN_TIMEOUT = 3.0
# A server that stops answering without closing the connection (a black-holed
# route, a frozen node) is left after about this many seconds times 3: a PING
# every 2 s, the connection stale when 2 are still unanswered at the third.
# nats-py's default (120 s, 2) kept a sidecar on a dead server for minutes
# while the other servers could have taken its claims.
PING_INTERVAL = 2
MAX_OUTSTANDING_PINGS = 2
# A server that answers PINGs but not JetStream (cut from the stream's leader
# while the other servers reach it: a bridge), or a black hole the pings have
# not caught yet (4-6 s, as long as a slot's max_late), is left as soon as a
# claim went unanswered for its whole ack timeout (``Connection.unanswered``),
# for the next server in the list; at most once in this many seconds, so that
# an election, when no server can answer, costs a hop or two, not a storm.
HOP_EVERY = 5.0


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
        "drain_timeout": DRAIN_TIMEOUT,
        "ping_interval": PING_INTERVAL,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
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


def jetstream(nc: NATS, config: Config, timeout: float | None = None) -> JetStreamContext:
    """The JetStream context of the configured domain (``nats.domain``), for every call."""
    if timeout is None:
        return nc.jetstream(domain=config.nats.domain)
    return nc.jetstream(domain=config.nats.domain, timeout=timeout)


class Connection:
    """One NATS connection and what the rest of the sidecar needs to know of it."""

    def __init__(self, config: Config, secrets: Secrets, metrics: Metrics | None = None) -> None:
        self.config = config
        self.secrets = secrets
        self.metrics = metrics
        self.nc: NATS | None = None
        self.connected = asyncio.Event()
        self.closing = False
        # Called after every reconnect: what may have been missed is read again.
        self.on_reconnect: list[Callable[[], None]] = []
        # NATS down means one error per reconnect attempt, every second: say it once a minute.
        self.warnings = RateLimitedLog(log)
        self._hopped = -HOP_EVERY  # monotonic time of the last hop (``unanswered``)
        self._hop: asyncio.Future[None] | None = None
        # Permissions violations: a reason for /readyz, a metric, one line a minute.
        self.denials = Denials(metrics, config.nats.user)

    async def connect(self) -> NATS:
        """Connect once; ConnectError with a one-line reason when no server answers."""
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            if self.denials.report(str(exc)):
                return  # not a connection problem: said by Denials, once a minute
            if self.nc is None or not self.nc.is_connected:
                errors.append(_reason(exc))
            if self.nc is None:  # the first connect: its ConnectError says it, in one line
                log.debug("nats: %s", _reason(exc))
            else:
                # One kind a distinct reason (per server): a TLS refusal is not
                # hidden behind an EOF, nor one server's refusal behind another's.
                reason = _reason(exc)
                self.warnings.warning(f"nats:{reason}", "nats: %s", reason)

        options = connect_options(self.config, self.secrets)
        nc = Client(require_tls="tls" in options)
        try:
            await nc.connect(
                **options,
                error_cb=on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
                closed_cb=self._on_closed,
            )
        except Exception as exc:  # nats-py raises many kinds; all mean "cannot connect"
            servers = ", ".join(redact_url(url) for url in self.config.nats.servers)
            detail = errors[-1] if errors else _reason(exc)
            raise ConnectError(f"cannot connect to NATS at {servers}: {detail}") from exc
        nc.options["max_reconnect_attempts"] = -1  # from now on, reconnect forever
        nc.options["reconnect_time_wait"] = RECONNECT_WAIT
        self.nc = nc
        self._set_connected(True)
        assert nc.connected_url is not None
        log.info("connected to NATS at %s", redact_url(nc.connected_url.netloc))
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

    def unanswered(self) -> None:
        """A claim got no answer for its whole ack timeout while connected: leave
        this server for the next one (see HOP_EVERY). Safe: a claim is asked again
        with the same id and token wherever it goes, and only a stored one wins."""
        nc = self.nc
        if nc is None or self.closing or not nc.is_connected:
            return
        now = time.monotonic()
        if now - self._hopped < HOP_EVERY:
            return
        # The next server, not a shuffle that may pick this one again.
        if not rotate_to_next_server(nc):
            return  # one server: nowhere else to go (the pings judge it)
        self._hopped = now
        nc.options["dont_randomize"] = True  # until reconnected
        url = nc.connected_url.netloc if nc.connected_url else "?"
        log.warning(
            "NATS at %s did not answer a claim within nats.ack_timeout; trying another server",
            redact_url(url),
        )
        self._hop = force_reconnect(nc)

    async def _on_reconnected(self) -> None:
        if self.nc is not None:
            self.nc.options["dont_randomize"] = False
        self.warnings.clear_prefix("nats:")
        self._set_connected(True)
        if self.metrics is not None:
            self.metrics.nats_reconnects_total.inc()
        url = self.nc.connected_url.netloc if self.nc and self.nc.connected_url else "?"
        log.info("reconnected to NATS at %s", redact_url(url))
        for hook in self.on_reconnect:
            hook()

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
                # drain() also flushes and closes; bounded as a whole.
                await asyncio.wait_for(self.nc.drain(), DRAIN_TIMEOUT + 2)
            else:
                await self.nc.close()
        except Exception as exc:  # closing is best effort
            log.debug("closing NATS connection: %r", exc)
            with contextlib.suppress(Exception):
                await self.nc.close()
        self._set_connected(False)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, PlaintextRefused):  # already a sentence of ours
        return text
    name = type(exc).__name__
    return f"{name}: {text}" if text and text != name else name


# A one-shot command's JetStream requests wait this long for an answer.
ONE_SHOT_TIMEOUT = 10.0


@contextlib.asynccontextmanager
async def connected(config: Config, secrets: Secrets) -> AsyncIterator[Connection]:
    """A connection for one command (``status``, ``pause``, ``job add``...), closed after."""
    conn = Connection(config, secrets)
    await conn.connect()
    try:
        yield conn
    finally:
        await conn.close(drain=False)


def one_shot_js(conn: Connection) -> JetStreamContext:
    """The JetStream context of a one-shot command's connection."""
    assert conn.nc is not None
    return jetstream(conn.nc, conn.config, ONE_SHOT_TIMEOUT)
