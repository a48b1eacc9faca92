"""JetStream publishes pipelined: many in flight on one connection, their acks gathered.

A burst (thousands of slots due at one instant, docs/PERFORMANCE.md) used to
send every JetStream write as its own ``js.publish``: a request each, with a
future and an ``asyncio.wait_for`` (a timer) each, all of them at once. The
server answers them in turn, so the last ones waited longer than their
timeout for an answer that was only queued: they timed out and were asked
again (and a claim had its stored copy read), several requests where one
would have done.

Here a publish is a core publish whose reply comes on one wildcard inbox of
the pipe (``_INBOX.<nuid>.*``, the inbox prefix a request uses too: no other
permission), each answer to its publish's future by the reply subject's last
token. The subject, headers and body are those ``js.publish`` sends (the
caller's headers, then ``Nats-Expected-Stream``, then ``Nats-TTL``): the wire
does not change. Not ``js.publish_async``, whose reply handler drops a
JetStream error such as 10158 or 10071 and leaves its future waiting. An
answer is read as ``js.publish`` reads it: the typed ``APIError`` of an
error answer (10071 wrong last sequence, 10164, 10158 ...), a ``PubAck``
whose ``duplicate`` is None for a first store, ``NoStreamResponseError`` for
"no responders", NATS's ``TimeoutError`` when none came in time.

At most ``window`` publishes of a ``Pipe`` are in flight at once (``Window``;
the caller holds a place while its publish is out): 256 claims, 4,096 writes.
A publish's timeout starts when it goes out, never while it waits for room;
the timeouts of the publishes in flight share one loop timer per ``GRAIN``
(``Expiry``), not one each. A waiter may ask to come ``behind`` the others
(the questions after claims given up, which have far longer than the claims
of slots due now). The claims (sidecar/run/claim.py) and the
state bucket's and results' writes (``writes_of``: sidecar/store/kv.py,
sidecar/run/record.py) each have a pipe of their own per connection, so that
a burst of one never waits for room behind the other.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import secrets
import weakref
from typing import TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import Header, PubAck
from nats.js.errors import APIError, NoStreamResponseError

T = TypeVar("T")

# Publishes of one pipe in flight at once. Enough to keep the server busy (a
# raw nats-py publisher gains nothing past about a hundred), few enough that the
# answer to the last one comes well within its timeout on a busy server.
WINDOW = 256
# The writes of one connection in flight at once (``writes_of``): far more than
# a burst's runs make at a time (``target.max_in_flight`` runs, a few writes
# each), so that a write is not held back here, as none was before the pipe
# (js.publish has no bound): the server answers a burst's writes at once (the
# burst's CPU is the sidecars'), and a write that waits its whole timeout for
# room is asked again. Bursts measured with 256 and with 4,096 did not differ
# beyond the shared machine's noise (docs/PERFORMANCE.md "The burst").
WRITES_WINDOW = 4096
# The timeouts of the publishes in flight are rounded up to this (seconds): one
# timer per GRAIN, never an answer given up on early.
GRAIN = 0.05
# The status header of a "no responders" answer (no stream holds the subject).
NO_RESPONDERS = "503"


class Expiry:
    """Futures given up on at their time, one loop timer per GRAIN for all of them."""

    def __init__(self) -> None:
        self._due: dict[int, list[asyncio.Future[object]]] = {}

    def __len__(self) -> int:
        return sum(len(futures) for futures in self._due.values())

    async def wait(self, future: asyncio.Future[T], timeout: float) -> T:
        """``await future``; NATS's TimeoutError when it is not done after `timeout` s
        (a little later, never earlier). Cancelling the wait cancels `future`."""
        loop = asyncio.get_running_loop()
        key = math.ceil((loop.time() + timeout) / GRAIN)
        due = self._due.get(key)
        if due is None:
            due = self._due[key] = []
            loop.call_at(key * GRAIN, self._expire, key)
        due.append(future)  # type: ignore[arg-type]
        return await future

    def _expire(self, key: int) -> None:
        for future in self._due.pop(key, ()):
            if not future.done():
                future.set_exception(NatsTimeoutError())


class Window:
    """At most `size` holders at once; a waiter gives up after its own wait.

    A waiter that asks to be ``behind`` is handed a place only while no other one
    waits: the questions after claims given up (sidecar/run/unanswered.py) have a
    minute to be asked, the claims of slots due now only ``max_late``; a backlog
    of questions never holds a fresh claim back longer than a full window of
    fresh claims would (measured: 3,000 questions queued ahead of it delayed a
    fresh claim by 2.0 s on an idle loopback server, tests/run/test_unanswered.py).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.held = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._behind: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        """Waiters not yet handed a place (some may have given up meanwhile)."""
        return len(self._waiters) + len(self._behind)

    async def acquire(self, wait: float, expiry: Expiry, behind: bool = False) -> bool:
        """Hold a place: True at once while there is room, else when one is freed
        within `wait` seconds; False when none was. `behind`: after every other
        waiter, even one that came later (the class's doc)."""
        if self.held < self.size and not self._waiters and not (behind and self._behind):
            self.held += 1
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._behind if behind else self._waiters).append(waiter)
        try:
            await expiry.wait(waiter, max(0.0, wait))
        except TimeoutError:  # NATS's TimeoutError is one
            return False
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release()  # handed a place just as it was cancelled: pass it on
            raise
        return True

    def release(self) -> None:
        """Free a place: handed to the longest waiter still waiting, one ``behind``
        only when no other waits."""
        for waiters in (self._waiters, self._behind):
            while waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the place passes on: `held` is unchanged
                    return
        self.held -= 1


class Pipe:
    """Publishes of one connection in flight: ``publish`` sends one, ``send`` also
    holds a place of the window (at most ``window`` at once)."""

    def __init__(self, nc: NATS, window: int = WINDOW) -> None:
        # Weakly: ``writes_of`` keeps a pipe as long as its connection lives, and
        # a pipe that held its connection would keep both for ever.
        self._nc = weakref.ref(nc)
        self.expiry = Expiry()
        self.window = Window(window)
        self._inbox: str | None = None
        self._pending: dict[str, asyncio.Future[PubAck]] = {}
        self._subscribing = asyncio.Lock()

    def serves(self, nc: NATS) -> bool:
        """Whether this pipe publishes on `nc` (False once its own is gone)."""
        return self._nc() is nc

    @property
    def nc(self) -> NATS:
        """The connection; ConnectionClosedError once it is gone."""
        nc = self._nc()
        if nc is None:
            raise ConnectionClosedError
        return nc

    async def send(
        self,
        subject: str,
        body: bytes,
        headers: dict[str, str],
        stream: str,
        timeout: float,
        msg_ttl: int | None = None,
    ) -> PubAck:
        """``publish`` with a place of the window held while it is out: the place is
        waited for up to `timeout` (then NATS's TimeoutError, nothing sent, as for
        an answer that did not come), and the ack for `timeout` from when it went
        out."""
        if not await self.window.acquire(timeout, self.expiry):
            raise NatsTimeoutError
        try:
            return await self.publish(subject, body, headers, stream, timeout, msg_ttl)
        finally:
            self.window.release()

    async def publish(
        self,
        subject: str,
        body: bytes,
        headers: dict[str, str],
        stream: str,
        timeout: float,
        msg_ttl: int | None = None,
    ) -> PubAck:
        """What ``js.publish(subject, body, timeout=..., stream=..., headers=...,
        msg_ttl=...)`` sends and answers (the same errors: an APIError,
        NoStreamResponseError, NATS's TimeoutError), pipelined with the others of
        this pipe. The caller holds a place of the window (``window.acquire``) and
        releases it after (or calls ``send``)."""
        nc = self.nc
        if self._inbox is None:
            async with self._subscribing:  # the first publishes come together: one inbox
                if self._inbox is None:
                    inbox = nc.new_inbox() + "."
                    await nc.subscribe(inbox + "*", cb=self._answer)
                    self._inbox = inbox
        # Random, not a count: a client that learnt the inbox cannot guess the
        # next publish's reply subject to answer it first (SECURITY.md, forged acks).
        token = secrets.token_hex(8)
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self._pending[token] = future
        future.add_done_callback(lambda _: self._pending.pop(token, None))
        # The headers js.publish sends, in its order: the caller's, the stream
        # expected, the message's TTL (whole seconds, as str(int(msg_ttl))).
        headers = {**headers, Header.EXPECTED_STREAM: stream}
        if msg_ttl is not None:
            headers[Header.MSG_TTL] = str(int(msg_ttl))
        try:
            await nc.publish(subject, body, reply=self._inbox + token, headers=headers)
        except BaseException:
            del self._pending[token]  # never sent: nothing to wait for
            future.cancel()
            raise
        return await self.expiry.wait(future, timeout)

    async def _answer(self, msg: Msg) -> None:
        """An ack (or an error) for the publish its reply subject names; as js.publish
        reads it. A late one, for a publish given up on, is dropped."""
        future = self._pending.get(msg.subject.rpartition(".")[2])
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get(Header.STATUS) == NO_RESPONDERS:
            future.set_exception(NoStreamResponseError())
            return
        try:
            answer = json.loads(msg.data)
            if "error" in answer:
                # nats-py raises the typed error from here (BadRequestError, ...).
                raise APIError.from_error(answer["error"])
            future.set_result(PubAck.from_response(answer))
        except Exception as exc:  # the typed APIError, or an answer that is no ack
            future.set_exception(exc)


# The writes' pipe of each connection (``writes_of``); gone with its connection.
_writes: weakref.WeakKeyDictionary[NATS, Pipe] = weakref.WeakKeyDictionary()


def writes_of(nc: NATS) -> Pipe:
    """The pipe of `nc`'s JetStream writes other than claims (the state bucket's
    keys, the results): one per connection, made on its first write."""
    pipe = _writes.get(nc)
    if pipe is None:
        pipe = _writes[nc] = Pipe(nc, WRITES_WINDOW)
    return pipe
