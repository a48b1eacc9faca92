"""The one place that reaches into nats-py's private attributes.

Every use says why nats-py (2.9 to 2.16, the range pyproject.toml allows)
leaves no public way (here too the raw JetStream API request, for answers
nats-py's calls parse too slowly or drop a field of), and which upstream
issue or change it waits for where one exists. A nats-py release that
renames one of these fails here, in one module, and tests/test_connection*.py,
test_claim.py, test_state.py and test_nats_versions.py show which.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError, StaleConnectionError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import APIError, ServiceUnavailableError
from nats.js.kv import KeyValue

from sidecar.core.errors import SidecarError

# ---------------------------------------------------------------------- JetStream contexts


def connection_of(js: JetStreamContext) -> NATS:
    """The connection behind a JetStream context (``js._nc``).

    JetStreamContext keeps its connection private and no upstream issue asks
    for an accessor; the sidecar needs it for core requests beside the
    context (advisories, STREAM.NAMES, the server's version) where the
    caller was handed only the context.
    """
    nc: NATS = js._nc
    return nc


def api_prefix(js: JetStreamContext) -> str:
    """The JetStream API prefix of a context (``$JS.API``, ``$JS.<domain>.API``).

    nats-py derives it from ``domain=`` and keeps it private (``js._prefix``);
    there is no upstream issue for a public one. The sidecar makes raw API
    requests with it: STREAM.NAMES with a subject filter (no nats-py call
    takes the filter) and the bare STREAM.MSG.GET of a stored claim.
    """
    prefix: str = js._prefix
    return prefix


async def api_request(nc: NATS, subject: str, payload: bytes, timeout: float) -> Any:
    """A JetStream API request made by hand: the decoded answer, or nats-py's errors.

    Its errors are those of nats-py's own API calls: the answer's error as the
    typed APIError, ServiceUnavailableError for no responders, and nats-py's
    TimeoutError after `timeout`.
    """
    try:
        reply = await nc.request(subject, payload, timeout=timeout)
    except NoRespondersError as exc:
        raise ServiceUnavailableError from exc
    answer = json.loads(reply.data)
    if isinstance(answer, dict) and "error" in answer:
        APIError.from_error(answer["error"])  # raises the typed error
    return answer


def request_timeout(js: JetStreamContext) -> float:
    """The timeout a context's API requests use (``js._timeout``; no accessor, no issue)."""
    timeout: float = js._timeout
    return timeout


def jetstream_of(kv: KeyValue) -> JetStreamContext:
    """The JetStream context behind a KV bucket (``kv._js``).

    ``KeyValue.put`` takes no per-message TTL in nats-py (only ``create`` and
    ``update`` do since nats-io/nats.py PR #783), and a plain put that expires
    (presence, leases) is a publish with ``msg_ttl`` on the bucket's subject;
    the stream info of the bucket's stream is read through it too.
    """
    js: JetStreamContext = kv._js
    return js


# ---------------------------------------------------------------------- KV watchers

# ``queued_update``'s answer when nothing is queued (None is the end marker).
NOTHING_QUEUED: Any = object()


def queued_update(watcher: KeyValue.KeyWatcher) -> Any:
    """The watcher's next update if one is queued already, else ``NOTHING_QUEUED``
    (``watcher._updates``, an asyncio.Queue in every nats-py the sidecar allows).

    ``KeyWatcher.updates(timeout)`` wraps every ``get`` in ``asyncio.wait_for``: a
    task and a timer per entry, a fifth of the start's CPU when the watch reads
    100,000 keys (docs/PERFORMANCE.md "100,000 jobs"). No public non-blocking
    get exists; a nats-py without the queue reads one update at a time again.
    """
    queue = getattr(watcher, "_updates", None)
    if not isinstance(queue, asyncio.Queue):
        return NOTHING_QUEUED
    try:
        return queue.get_nowait()
    except asyncio.QueueEmpty:
        return NOTHING_QUEUED


async def read_initial(
    watcher: KeyValue.KeyWatcher, take: Callable[[KeyValue.Entry], object], timeout: float
) -> None:
    """Give `take` each of a new watch's initial values, in order, and return once
    the last one is taken; ``TimeoutError`` when `timeout` passes without news.

    nats-py (2.9 to 2.16, ``KeyValue.watch``) ends the initial values with a None.
    It puts that None *first* when the new consumer's info says nothing is pending
    and no message has reached the client yet. But the server counts a value as
    delivered once its consumer has sent it, and its answer to the info request can
    reach the client before the values do (seen on a loaded CI machine: ``status``
    showed an empty bucket, 0 instances and none of 400 jobs). A None before any
    value is therefore trusted only when the consumer says it has delivered nothing
    (``watcher._sub``: nats-py keeps the subscription private). Otherwise the
    values are still on their way, and the last of them is the one that left
    nothing pending behind it (``Entry.delta``, the message's ``num_pending``); or,
    should that one never be handed over (nats-py skips a marker of a reason it
    does not know), the read ends once the consumer has nothing pending and every
    message it sent has reached the client.
    """
    sub: Any = watcher._sub
    first = True
    while True:
        entry = queued_update(watcher)
        if entry is NOTHING_QUEUED:
            entry = await watcher.updates(timeout=timeout)  # type: ignore[no-untyped-call]
        if entry is None:
            if first:
                info = await sub.consumer_info()
                if not nothing_sent(info):  # the values are on their way
                    await _read_after_early_marker(watcher, take, timeout, str(info.name))
            return
        take(entry)
        first = False


async def _read_after_early_marker(
    watcher: KeyValue.KeyWatcher,
    take: Callable[[KeyValue.Entry], object],
    timeout: float,
    consumer: str,
) -> None:
    """``read_initial`` once nats-py's None came before values `consumer` had sent:
    up to the value that left nothing pending, or until all it sent has arrived at
    two idle steps in a row with nothing in between (nats-py handed over what it
    would: a message is counted on arrival, and handed over by the subscription's
    task after)."""
    sub: Any = watcher._sub
    waited = 0.0
    arrived = -1  # messages received at the last idle step that found all of them in
    while True:
        entry = queued_update(watcher)
        if entry is NOTHING_QUEUED:
            try:
                entry = await watcher.updates(timeout=EARLY_STEP)  # type: ignore[no-untyped-call]
            except NatsTimeoutError:
                waited += EARLY_STEP
                now = await _all_arrived(sub, consumer)
                if now >= 0 and now == arrived:
                    return
                arrived = now
                if waited >= timeout:
                    raise
                continue
        waited, arrived = 0.0, -1
        if entry is not None:  # nats-py puts no second None: none is skipped here
            take(entry)
            if entry.delta == 0:
                return


# How long an early read waits for a value before it asks the consumer again.
EARLY_STEP = 0.5


async def _all_arrived(sub: Any, consumer: str) -> int:
    """How many messages the client has received when `consumer` has nothing pending
    and all it sent has arrived; else -1. The count is the subscription's: its
    heartbeats and flow control come after the values sent before them. An ordered
    consumer made again since (a gap, a slow client's drop) counts from 1 while the
    subscription's count goes on: then never (the read ends by a value or times out).
    """
    info = await sub.consumer_info()
    if str(info.name) != consumer:
        return -1
    received = int(sub.delivered)
    if int(info.num_pending or 0) == 0 and received >= int(info.delivered.consumer_seq or 0):
        return received
    return -1


async def delivered_nothing(sub: Any) -> bool:
    """Whether a new consumer has sent nothing and has nothing to send: no message
    on its subjects (`sub`: a JetStream push subscription).

    Not ``delivered.stream_seq``: a consumer whose filter no message matches starts
    past the stream's last message; its consumer sequence counts what it sent.
    """
    return nothing_sent(await sub.consumer_info())


def nothing_sent(info: Any) -> bool:
    """Whether a consumer's info says it has sent nothing and has nothing to send."""
    return int(info.num_pending or 0) == 0 and int(info.delivered.consumer_seq or 0) == 0


def restartable_from_time(sub: Any) -> bool:
    """Let nats-py make again an ordered consumer that began at a start time; False
    when this nats-py keeps its request elsewhere (then nothing is changed).

    nats-py (2.9 to 2.16, ``_JSI.reset_ordered_consumer``) makes a lost ordered
    consumer again (the nats-server restarted and lost it, a gap, missed
    heartbeats) by changing the request it first sent: deliver by start sequence,
    from the one after the last message it handed over. It leaves
    ``opt_start_time`` set, and the server refuses that pair every time (10094,
    "optional start time is also set"): the subscription never delivers again
    (chains stopped for good after a server restart: tests/run/test_chains.py).
    The start time has done its work once the consumer exists; it is cleared
    from the kept request (``sub._sub._jsi._ccreq``), which only the reset reads.
    """
    request = getattr(getattr(getattr(sub, "_sub", None), "_jsi", None), "_ccreq", None)
    if request is None or not hasattr(request, "opt_start_time"):
        return False
    request.opt_start_time = None
    return True


# ---------------------------------------------------------------------- the connection


def rotate_to_next_server(nc: NATS) -> bool:
    """Move the connected server to the end of the pool, so the next reconnect goes to
    the next one; False when there is no other server (or the pool is not a list).

    nats-py 2.9-2.16 picks the next server from its private ``_server_pool``
    and ``_current_server``. Later nats-py adds a public
    ``reconnect_to_server_handler`` and ``server_pool`` (nats-io/nats.py PR
    #829, after nats.go's ReconnectToServer, ADR-40); this goes once the
    oldest supported release has them.
    """
    current = getattr(nc, "_current_server", None)
    pool = getattr(nc, "_server_pool", None)
    if not isinstance(pool, list) or current not in pool or len(pool) < 2:
        return False
    pool.remove(current)
    pool.append(current)
    return True


def force_reconnect(nc: NATS) -> asyncio.Future[None]:
    """Leave the connected server now, reconnecting as after a stale connection.

    ``force_reconnect`` is public from nats-py 2.10; on 2.9 the same is done
    with the private ``_process_op_err`` (no issue: it is what 2.10 added).
    """
    force = getattr(nc, "force_reconnect", None)
    hop: asyncio.Future[None] = asyncio.ensure_future(
        force() if force is not None else nc._process_op_err(StaleConnectionError())
    )
    return hop


class PlaintextRefused(SidecarError, NatsError):
    """TLS is configured but the server's connection was not encrypted; nothing was sent."""

    def __str__(self) -> str:
        return str(self.args[0])


class Client(NATS):
    """nats-py's client with guards on each connection attempt, reconnects included.

    nats-py reads the server's INFO in clear, upgrades to TLS only when INFO
    says ``tls_required``, then writes CONNECT. With ``require_tls`` (the
    config asks for TLS) two hooks, present with this shape from nats-py 2.9
    to 2.16, make that "only over TLS":

    - ``_process_info(info, initial_connection=True)`` runs after INFO is read
      and before the upgrade: a server that offers TLS without requiring it
      (``tls_available``, nats-server's ``allow_non_tls``) is treated as
      requiring it, so nats-py upgrades, as nats.go does for a secure client.
      It is async from 2.10 and sync in 2.9: the override returns whatever
      the parent returns, which the caller awaits or not.
    - ``_connect_command()`` builds CONNECT right before it is written: it
      raises PlaintextRefused unless the socket really is TLS. This is the
      guarantee; if a nats-py release moved the socket, it fails closed.

    Upstream, the client intent to use TLS is enforced only in the new client
    (nats-io/nats.py PR #912, "Enforce TLS intent against server
    capabilities", and PR #907 for reconnects); nats.aio.client of 2.x does
    not, hence these private hooks.

    Always: after a failed attempt the socket is closed and dropped here.
    nats-py would wait forever for the plain socket to close after a failed
    TLS handshake (its start_tls took the socket over; nats-py issue 718, as
    first noted here and not re-checked since),
    so a wrong CA hung the first connect instead of failing it.
    """

    def __init__(self, require_tls: bool) -> None:
        super().__init__()
        self.require_tls = require_tls

    def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> Any:
        if (
            self.require_tls
            and initial_connection
            and info.get("tls_available")
            and not info.get("tls_required")
        ):
            info["tls_required"] = True  # the same dict as self._server_info
        return super()._process_info(info, initial_connection)

    @property
    def cluster(self) -> str | None:
        """The cluster of the server connected to, from its INFO; None outside one.

        nats-py parses INFO into the private ``_server_info`` and exposes no
        field of it but a few (``connected_server_version``, ``client_id``,
        ``max_payload``); no upstream issue asks for the cluster.
        """
        return (self._server_info or {}).get("cluster") or None

    def _connect_command(self) -> bytes:
        writer = getattr(self._transport, "_io_writer", None)
        if self.require_tls and (writer is None or writer.get_extra_info("ssl_object") is None):
            server = self._current_server.uri.netloc if self._current_server else "?"
            raise PlaintextRefused(
                f"server {server} did not offer TLS; refusing to send credentials or data in clear"
            )
        command: bytes = super()._connect_command()
        return command

    async def _process_connect_init(self) -> None:
        try:
            await super()._process_connect_init()
        except BaseException:
            writer = getattr(self._transport, "_io_writer", None)
            if writer is not None:
                writer.close()
            self._transport = None  # the next attempt makes a new one
            raise
