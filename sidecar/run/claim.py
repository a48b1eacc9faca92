"""Claim a slot in JetStream; decide won or lost.

Every instance publishes ``<prefix><job>.claims`` with ``Nats-Msg-Id:
<job>:<slot>``. The stream stores the first message with that id and answers
every later one with ``duplicate: true`` and the original's sequence. An
instance won when its ack is not a duplicate, or when it is a duplicate and the
stored message carries its own token (its own retry).

A claim is never decided by a guess: a publish that timed out may still have
been stored (nats-py can flush a buffered publish after its timeout fired), so
it is retried with the same token and id until a definite answer or the
deadline. On a clustered stream a concurrent copy may be answered with API
error 10158 ("duplicate message id is in process"); that too is retried. A
claim given up at the deadline raises ``ClaimUnanswered``, which says what it
was: it may be stored all the same, and its slot's fate is asked for later
under the same id and token (sidecar/run/unanswered.py).

Only a retried claim reads the stored message: tokens are new per claim, so
a duplicate answer to the first publish means the stored claim is somebody
else's, and the claim is lost without a second request. N replicas cost N
JetStream requests per slot (plus the winner's result), not 2N-1.

The publishes of one sidecar's claims are pipelined (sidecar/store/pipe.py):
at most ``Claimer.window`` in flight, acks gathered, each claim's ack timeout
counted from when it went out. A burst (thousands of slots due at one instant,
docs/PERFORMANCE.md) used to send every claim as its own ``js.publish``, all
at once: the last ones waited longer than ``nats.ack_timeout`` for an answer
that was only queued, and were asked again and had their stored claim read.
The claims have a pipe of their own, apart from the runs' writes
(``writes_of``), so that a run's lease and result never wait behind them.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from sidecar.core import failpoints
from sidecar.core.backoff import Backoff
from sidecar.core.clock import Clock, rfc3339
from sidecar.core.errors import ClaimDisconnected, ClaimError, ClaimForeign, ClaimUnanswered
from sidecar.core.natspy import api_prefix, api_request, request_timeout
from sidecar.core.wire import ERR_DUPLICATE_IN_PROCESS, claims_subject, msg_get_subject, new_token
from sidecar.core.wire import MSG_ID as MSG_ID  # re-exported: the run's ending uses it
from sidecar.core.wire import TRANSIENT as TRANSIENT  # re-exported: the run's ending uses it
from sidecar.core.wire import claim_msg_id as claim_msg_id  # re-exported
from sidecar.store.pipe import WINDOW, Pipe

log = logging.getLogger(__name__)

# Between two publishes of one claim: short (a claim has a deadline of seconds),
# jittered so that the replicas that timed out together do not ask together.
PUBLISH_RETRY_START = 0.02
PUBLISH_RETRY_CAP = 1.0
PUBLISH_RETRY_JITTER = 0.5


@functools.lru_cache(maxsize=1024)
def _json_str(text: str) -> str:
    """A string as a JSON string literal, as json.dumps writes it."""
    return json.dumps(text)


@functools.lru_cache(maxsize=64)
def _scheduled_at(slot: int) -> str:
    """A slot's ``scheduled_at``: the claims of a burst share their slot's instant,
    formatted once for all of them rather than once per claim."""
    return rfc3339(slot / 1000)


def decide(duplicate: bool | None, stored_token: str | None, token: str) -> bool:
    """Won or lost, from the ack's duplicate flag and, for a duplicate, the stored token.

    nats-py reports a first publish as ``duplicate=None``, not ``False``.
    """
    if not duplicate:
        return True
    return stored_token == token


def must_read_stored(duplicate: bool | None, retried: bool) -> bool:
    """Whether an ack leaves the claim open until the stored claim's token is read.

    ============== ========================================= =========================
    ack            an earlier attempt of this claim was sent  decision
    ============== ========================================= =========================
    not duplicate  either                                     won
    duplicate      no                                         lost (the stored claim
                                                              has another token)
    duplicate      yes (a timeout, 10158, a reconnect)        read the stored claim:
                                                              won if its token is ours
    ============== ========================================= =========================
    """
    return bool(duplicate) and retried


def token_of(data: bytes) -> str | None:
    """The token of a stored claim, None for anything that is not one of ours."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):  # nesting too deep for json
        return None
    token = value.get("token") if isinstance(value, dict) else None
    return token if isinstance(token, str) else None


@dataclass(frozen=True)
class Claim:
    """What was claimed and how it was decided."""

    job: str
    slot: int
    token: str
    won: bool
    seq: int
    publish_tries: int  # publishes of this claim (1: answered at the first)
    duplicate_acks: int
    ack_seconds: float
    manual: bool = False
    attempt: int = 1
    trigger: str = "scheduled"  # X-Anarchon-Trigger of its run
    # When its first publish went out (the clock's monotonic scale); None for a
    # claim made elsewhere. A winner whose lease came much later asks whether
    # it was judged lost meanwhile (sidecar/run/claimwindow.py).
    sent_at: float | None = None
    # The run id this run follows (``after``: sidecar/run/chains.py); None: none.
    after_run: str | None = None


@dataclass
class Claimer:
    """Publishes claims for one instance."""

    nc: NATS
    js: JetStreamContext
    stream: str
    prefix: str
    instance: str
    clock: Clock
    ack_timeout: float = 2.0
    # Awaited while disconnected; returns when connected (or raises on timeout).
    wait_connected: Callable[[float], Awaitable[bool]] | None = None
    # The JetStream domain every ack must name, once known (``check_domain``).
    domain: str | None = None
    check_domain: bool = False
    # Told when a publish got no answer for the whole ack_timeout while connected
    # (``Connection.unanswered``: the server may not reach the stream's leader).
    on_unanswered: Callable[[], None] | None = None
    # Claims of this sidecar in flight at once (sidecar/store/pipe.py).
    window: int = WINDOW
    _pipe: Pipe | None = field(default=None, init=False, repr=False)

    @property
    def pipe(self) -> Pipe:
        """The claims in flight, made on the first claim (inside the running loop)."""
        if self._pipe is None or not self._pipe.serves(self.nc):
            self._pipe = Pipe(self.nc, self.window)
        return self._pipe

    def subject(self, job: str) -> str:
        return claims_subject(self.prefix, job)

    def body(
        self,
        job: str,
        slot: int,
        token: str,
        now: float,
        manual: bool,
        attempt: int = 1,
        extra: dict[str, str] | None = None,
    ) -> bytes:
        """The claim's JSON, byte for byte what ``json.dumps(..., separators=(",", ":"))``
        gives for these fields, written out directly: it is built on every claim's
        path, where the generic encoder cost about as much as a tenth of the
        publish round trip. The strings that could need escaping (job, instance)
        go through json.dumps (cached); the token is hex (``new_token``), the
        times are RFC 3339. Attempt 1 is the reference's body; a later attempt
        adds ``"attempt":N`` at the end, and ``extra`` (string fields: ``trigger``,
        ``skipped``) follows.
        """
        more = f',"attempt":{attempt:d}' if attempt > 1 else ""
        if extra:
            more += "".join(f",{_json_str(k)}:{_json_str(v)}" for k, v in extra.items())
        return (
            f'{{"job":{_json_str(job)},"slot":{slot:d},"token":"{token}",'
            f'"instance":{_json_str(self.instance)},"scheduled_at":"{_scheduled_at(slot)}",'
            f'"claimed_at":"{rfc3339(now)}","manual":{"true" if manual else "false"}{more}}}'
        ).encode()

    async def claim(
        self,
        job: str,
        slot: int,
        deadline: float,
        manual: bool = False,
        attempt: int = 1,
        msg_id: str | None = None,
        extra: dict[str, str] | None = None,
        trigger: str = "scheduled",
        token: str | None = None,
    ) -> Claim:
        """Claim attempt `attempt` of `slot` of `job`; `deadline` is on the clock's monotonic
        scale, which counts suspended time: no publish goes out after it.

        `msg_id` replaces the usual id (a skipped slot's record, a backfill);
        `extra` adds string fields to the body. `trigger` says why the run is
        made; the body carries it when it is not ``scheduled`` or ``manual``
        (so a scheduled claim stays byte for byte the reference's).

        `token` asks again for a claim given up before (``ClaimUnanswered``), under
        its id and token: that claim may be the one stored, so even the first
        duplicate answer is read, and the stored claim is won if its token is this.

        Returns the decided Claim; raises ClaimDisconnected when NATS was down
        the whole time, ClaimUnanswered when no definite answer came in time
        while connected, ClaimError when JetStream refused it.
        """
        asked_before = token is not None
        token = token or new_token()
        if manual:
            trigger = "manual"
        elif trigger != "scheduled":
            extra = {**(extra or {}), "trigger": trigger}
        body = self.body(job, slot, token, self.clock.wall(), manual, attempt, extra)
        msg_id = msg_id or claim_msg_id(job, slot, token, manual, attempt)
        subject = self.subject(job)
        publish_tries = 0
        duplicate_acks = 0
        backoff = Backoff(PUBLISH_RETRY_START, PUBLISH_RETRY_CAP, jitter=PUBLISH_RETRY_JITTER)
        ever_connected = False
        last_error = "no attempt"
        sent_at = self.clock.monotonic()

        def given_up(why: str) -> ClaimUnanswered:
            """Given up while connected: what it was, to ask again (the class's doc)."""
            return ClaimUnanswered(
                f"{msg_id}: {why}",
                job=job,
                slot=slot,
                msg_id=msg_id,
                token=token,
                attempt=attempt,
                trigger=trigger,
                extra=extra,
                deadline=deadline,
            )

        while True:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                if not ever_connected:
                    raise ClaimDisconnected(f"{msg_id}: NATS disconnected until the deadline")
                raise given_up(f"no definite answer before the deadline: {last_error}")
            if (
                not self.nc.is_connected
                and self.wait_connected is not None
                and not await self.wait_connected(remaining)
            ):
                continue
            ever_connected = True
            pipe = self.pipe
            # Room among the claims in flight (a burst: thousands due at once); the
            # ack timeout starts when the claim goes out, not while it waits here.
            # A question after a claim given up waits behind the claims of slots due
            # now: it has until its slot's id may leave JetStream's memory, they
            # only max_late (sidecar/store/pipe.py, Window).
            if not await pipe.window.acquire(remaining, pipe.expiry, behind=asked_before):
                last_error = f"{pipe.window.size} claims of this sidecar still in flight"
                continue
            started = self.clock.monotonic()
            remaining = deadline - started
            if remaining <= 0:  # the room came too late: nothing goes out after the deadline
                pipe.window.release()
                continue
            publish_tries += 1
            timeout = max(0.001, min(self.ack_timeout, remaining))
            try:
                try:
                    ack = await pipe.publish(subject, body, {MSG_ID: msg_id}, self.stream, timeout)
                finally:
                    pipe.window.release()
                if failpoints.ENABLED:
                    await failpoints.hit("claim.after_publish")
            except APIError as exc:
                if exc.err_code != ERR_DUPLICATE_IN_PROCESS and not isinstance(exc, TRANSIENT):
                    raise ClaimError(f"{msg_id}: JetStream refused the claim: {exc}") from exc
                last_error = f"{type(exc).__name__} (err_code {exc.err_code})"
            except TRANSIENT as exc:
                last_error = type(exc).__name__
                unanswered = isinstance(exc, (NatsTimeoutError, asyncio.TimeoutError))
                if unanswered and timeout >= self.ack_timeout and self.on_unanswered is not None:
                    self.on_unanswered()
            else:
                ack_seconds = self.clock.monotonic() - started
                if foreign := self.foreign(ack.stream, ack.domain):
                    raise ClaimForeign(f"{msg_id}: {foreign}; not run")
                stored = None
                if ack.duplicate:
                    duplicate_acks += 1
                # Any earlier attempt may have been stored (even one that failed:
                # nats-py can send a buffered publish after giving up on it).
                if must_read_stored(ack.duplicate, retried=publish_tries > 1 or asked_before):
                    stored = await self._stored_token(ack.seq, deadline, msg_id, given_up)
                won = decide(ack.duplicate, stored, token)
                return Claim(
                    job,
                    slot,
                    token,
                    won,
                    ack.seq,
                    publish_tries,
                    duplicate_acks,
                    ack_seconds,
                    manual,
                    attempt,
                    trigger,
                    sent_at,
                )
            log.debug("claim %s publish %d: %s; asking again", msg_id, publish_tries, last_error)
            if failpoints.ENABLED:
                await failpoints.hit("claim.before_retry")
            await backoff.sleep(at_most=remaining)

    def foreign(self, stream: str | None, domain: str | None) -> str | None:
        """Why an ack shows another JetStream stored the claim; None when it is ours.

        At a leaf node with a JetStream of its own, a stream of the same name
        there can answer first: a win in it is no win in the fleet's stream.
        """
        if stream != self.stream:
            return f"the claim was stored by stream {stream}, not {self.stream}"
        if self.check_domain and (domain or None) != self.domain:
            return (
                f"the claim was stored in JetStream domain {domain or '(none)'}, "
                f"not {self.domain or '(none)'}"
            )
        return None

    async def _stored_token(
        self, seq: int, deadline: float, msg_id: str, unanswered: Callable[[str], ClaimError]
    ) -> str | None:
        """The token of the stored claim at `seq`; retried until the deadline, then
        `unanswered` says what was not read (a claim is stored, perhaps this one)."""
        backoff = Backoff(PUBLISH_RETRY_START, PUBLISH_RETRY_CAP)
        while True:
            remaining = deadline - self.clock.monotonic()
            try:
                data = await self._stored_data(seq)
            except NotFoundError as exc:
                # Trimmed or deleted: we cannot know who won, so we did not.
                raise ClaimError(f"{msg_id}: stored claim {seq} is gone: {exc}") from exc
            except (*TRANSIENT, APIError) as exc:
                if remaining <= 0:
                    raise unanswered(f"cannot read stored claim {seq}: {exc!r}") from exc
                await backoff.sleep(at_most=remaining)
                continue
            return token_of(data)

    async def stored_claim(self, seq: int) -> dict[str, object] | None:
        """The stored claim at `seq` as its JSON object; None for anything else
        (sidecar/run/claimwindow.py reads the winner's from a loser's ack)."""
        try:
            value = json.loads(await self._stored_data(seq))
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        return value if isinstance(value, dict) else None

    async def _stored_data(self, seq: int) -> bytes:
        """The data of the stored message at `seq`: the request ``js.get_msg`` makes.

        Without get_msg's parsing of the stored headers (through the email
        package) and timestamp, which the decision never reads and which took
        about half of a lost claim's CPU time. Errors are get_msg's: the typed
        APIError of the answer, ServiceUnavailableError for no responders, and
        nats-py's TimeoutError after the JetStream context's timeout.
        """
        answer = await api_request(
            self.nc,
            msg_get_subject(api_prefix(self.js), self.stream),
            f'{{"seq":{seq:d}}}'.encode(),
            request_timeout(self.js),
        )
        return base64.b64decode(answer["message"].get("data") or "")
