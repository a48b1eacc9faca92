"""The state bucket's one writer (its keys: SECURITY.md's table): single keys by CAS, with TTLs.

Writes are plain publishes on ``$KV.<bucket>.<key>`` with the headers set
here, pipelined with the connection's other writes (sidecar/store/pipe.py:
``js.publish``'s wire and answers, without a request and a timer each; a
burst's leases go out together). nats-py's ``kv.update`` has no TTL, and its
``kv.create`` does not see a server's ``MaxAge`` marker as a deleted key (it
refuses to create over an expired lease). A delete leaves a ``DEL`` marker
that itself expires, so the bucket does not keep one marker per run for ever.
A CAS conflict is ``CasConflict``; a create over a live key is ``KeyHeld``
with its value.
Leases (sidecar/run/lease.py), due keys (sidecar/run/retries.py), health and
presence all write through ``Keys``.

Keys without a TTL (pauses, skips, backfills, one-off runs, since bounds,
actions, the health reset) are written through nats-py's ``KeyValue`` by the functions at
the end of this module (``create_or_update``, ``put_json``, ``delete_at``,
``store_pause``): no other module writes the state bucket, and a lost
compare-and-set is ``CasConflict`` whichever way the key was written.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import APIError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from sidecar.core.backoff import Backoff
from sidecar.core.clock import Clock, parse_rfc3339
from sidecar.core.errors import CasConflict, KeyHeld, PermissionDenied, StreamError, Untimed
from sidecar.core.natspy import api_prefix, api_request, connection_of, jetstream_of
from sidecar.core.wire import (
    CAS_CONFLICT,
    ERR_NO_MESSAGE,
    EXPECTED_LAST_SUBJECT_SEQ,
    TRANSIENT,
    cas_conflict,
    compact,
    decode,
    kv_subject,
    paused_key,
)
from sidecar.store.pipe import writes_of
from sidecar.store.state import Bucket
from sidecar.when.pauses import pause_active

log = logging.getLogger(__name__)

EXPECTED_LAST = EXPECTED_LAST_SUBJECT_SEQ
KV_OPERATION = "KV-Operation"
MARKER_REASON = "Nats-Marker-Reason"
MSG_TTL = "Nats-TTL"
# A lock whose TTL is longer than this many lease_ttl (and than LOCK_TTL_FLOOR) is
# no sidecar's: each writes its own lease_ttl, renewed every third of it.
LOCK_TTL_LEASES = 10
LOCK_TTL_FLOOR = 3600.0
# A Go duration as nats-server reads Nats-TTL ("90s", "1h30m"), or whole seconds.
_GO_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h))+")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# How long a write may wait for its ack.
WRITE_TIMEOUT = 2.0
# ... when the server refused its subject lately (a permissions violation).
DENIED_TIMEOUT = 0.5


def _json(value: dict[str, Any]) -> bytes:
    return compact(value)


def _ttl(seconds: float) -> int:
    """Nats-TTL in whole seconds, at least 1 (nats-py sends int(msg_ttl))."""
    return max(1, math.ceil(seconds))


def ttl_of(text: str | None) -> float | None:
    """The seconds a ``Nats-TTL`` header gives a message; None for none, ``never``, 0,
    a negative or unreadable one (nats-server keeps such a message for ever)."""
    if text is None:
        return None
    text = text.strip()
    if text.isascii() and text.isdigit():
        return float(text) or None
    if not _GO_DURATION.fullmatch(text):
        return None
    seconds = sum(
        float(n) * _UNIT[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text)
    )
    return seconds if seconds >= 1.0 else None


def lock_ttl_limit(lease_ttl: float) -> float:
    """The longest TTL a sidecar's lock may carry (``Untimed`` beyond it)."""
    return max(LOCK_TTL_FLOOR, LOCK_TTL_LEASES * lease_ttl)


async def last_msg(js: JetStreamContext, stream: str, subject: str) -> RawStreamMsg | None:
    """The last message of `subject`; None when it has none."""
    try:
        return await js.get_last_msg(stream, subject)
    except NotFoundError:
        return None
    except APIError as exc:
        if exc.err_code == ERR_NO_MESSAGE:  # no message on the subject
            return None
        raise


async def stream_now(js: JetStreamContext, stream: str, timeout: float) -> tuple[int, float | None]:
    """`stream`'s last sequence and the server's time when it answered (epoch s).

    STREAM.INFO's ``ts`` is the server's clock; nats-py's StreamInfo drops it,
    so the request is made here. None for the time when the answer has none
    (or an unreadable one): the caller then cannot tell the server's time.
    """
    subject = f"{api_prefix(js)}.STREAM.INFO.{stream}"
    data = await api_request(connection_of(js), subject, b"", timeout)
    if not isinstance(data, dict):
        raise StreamError(f"stream {stream}: an answer that is not an object")
    state = data.get("state")
    last = state.get("last_seq") if isinstance(state, dict) else None
    if not isinstance(last, int) or isinstance(last, bool):
        raise StreamError(f"stream {stream}: no last sequence in its info")
    at = data.get("ts")
    try:
        return last, parse_rfc3339(at) if isinstance(at, str) else None
    except ValueError:
        return last, None


def same_owner(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two lease values are of one holder: the same instance and token."""
    return a.get("instance") == b.get("instance") and a.get("token") == b.get("token")


class Keys:
    """Writes and reads of single keys of the state bucket, markers understood."""

    def __init__(self, bucket: Bucket, denied: Callable[[str], bool] | None = None) -> None:
        self.bucket = bucket
        # Whether NATS refused a subject to this user lately (sidecar/store/permissions.py):
        # a write it refuses gets no answer, only an error on the connection.
        self.denied = denied
        # KeyValue's own put takes no per-message TTL and its create refuses to
        # write over a MaxAge marker: the state bucket is written here, by plain
        # publishes through its JetStream context (sidecar/core/natspy.py says why).
        self.js: JetStreamContext = jetstream_of(bucket.kv)
        self.stream = bucket.spec.stream
        # A delete marker lives as long as the server's own expiry markers.
        self.marker_ttl = bucket.spec.marker_ttl

    def subject(self, key: str) -> str:
        return kv_subject(self.bucket.spec.bucket, key)

    async def _publish(
        self, key: str, data: bytes, headers: dict[str, str], ttl: float | None
    ) -> int:
        subject = self.subject(key)
        refused = self.denied is not None and self.denied(subject)
        try:
            # Pipelined with this connection's other writes (sidecar/store/pipe.py):
            # what js.publish sends and answers, without a request and timer each.
            ack = await writes_of(connection_of(self.js)).send(
                subject,
                data,
                headers,
                self.stream,
                # Refused lately: the answer (if the permissions were fixed) is quick.
                DENIED_TIMEOUT if refused else WRITE_TIMEOUT,
                _ttl(ttl) if ttl is not None else None,
            )
        except APIError as exc:
            if exc.err_code in CAS_CONFLICT:
                raise CasConflict(key) from exc
            raise
        except TRANSIENT as exc:
            if self.denied is not None and self.denied(subject):
                # Not a slow server: asking again until the deadline changes nothing.
                raise PermissionDenied("publish", subject) from exc
            raise
        return int(ack.seq)

    async def last(self, key: str) -> tuple[int, dict[str, Any] | None] | None:
        """(revision, value) of the key's last message; value None for a marker.

        None when the subject has no message at all.
        """
        msg = await last_msg(self.js, self.stream, self.subject(key))
        if msg is None:
            return None
        headers = msg.headers or {}
        if headers.get(KV_OPERATION) or headers.get(MARKER_REASON):
            return int(msg.seq or 0), None
        return int(msg.seq or 0), decode(msg.data)

    async def create(
        self,
        key: str,
        value: dict[str, Any],
        ttl: float | None,
        expected: int = 0,
        max_ttl: float | None = None,
    ) -> int:
        """Create the key; KeyHeld when it is live. A marker (deleted, expired) is no owner.

        `expected`: the revision of the key's last marker when known (else 0).
        `max_ttl` (a lock): a live value without a TTL, or with one longer than this,
        is ``Untimed`` (a KeyHeld): no sidecar wrote it, and it would hold for ever.
        """
        data = _json(value)
        for _ in range(3):
            try:
                return await self._publish(key, data, {EXPECTED_LAST: str(expected)}, ttl)
            except CasConflict:
                msg = await last_msg(self.js, self.stream, self.subject(key))
                headers = (msg.headers or {}) if msg is not None else {}
                held = None
                if msg is not None and not (
                    headers.get(KV_OPERATION) or headers.get(MARKER_REASON)
                ):
                    held = decode(msg.data)
                if msg is not None and held is not None:
                    revision = int(msg.seq or 0)
                    if same_owner(held, value):
                        return revision  # our own create, answered late: asked again
                    if max_ttl is not None:
                        found = ttl_of(headers.get(MSG_TTL))
                        if found is None or found > max_ttl:
                            raise Untimed(key, held, revision, headers.get(MSG_TTL)) from None
                    raise KeyHeld(key, held) from None
                expected = int(msg.seq or 0) if msg is not None else 0
        raise KeyHeld(key, {})

    async def renew(self, key: str, value: dict[str, Any], revision: int, ttl: float) -> int:
        """Compare-and-set with a fresh TTL; CasConflict when the key moved on."""
        return await self._publish(key, _json(value), {EXPECTED_LAST: str(revision)}, ttl)

    async def update(self, key: str, value: dict[str, Any], revision: int) -> int:
        """Compare-and-set without a TTL (0: the key must have no message yet);
        CasConflict when the key moved on."""
        return await self._publish(key, _json(value), {EXPECTED_LAST: str(revision)}, None)

    async def put(self, key: str, value: dict[str, Any], ttl: float) -> int:
        """A plain put that expires ``ttl`` seconds after it was written (a MaxAge marker)."""
        return await self._publish(key, _json(value), {}, ttl)

    async def delete(self, key: str, revision: int | None) -> int:
        """Delete (by revision when given); the marker's revision. It expires after the
        markers' TTL."""
        headers = {KV_OPERATION: "DEL"}
        if revision:
            headers[EXPECTED_LAST] = str(revision)
        return await self._publish(key, b"", headers, self.marker_ttl)


async def until_answered(
    what: str, call: Callable[[], Awaitable[int]], clock: Clock, deadline: float
) -> int:
    """Ask again while NATS gives no definite answer, until `deadline` (monotonic)."""
    backoff = Backoff(start=0.05, cap=1.0)
    while True:
        try:
            return await call()
        except (*TRANSIENT, NoRespondersError) as exc:
            if clock.monotonic() + backoff.current > deadline:
                raise
            log.debug("%s: %r; asking again", what, exc)
        except APIError as exc:
            if exc.err_code in CAS_CONFLICT or clock.monotonic() + backoff.current > deadline:
                raise
            log.debug("%s: %r; asking again", what, exc)
        await backoff.sleep()


async def put_with_ttl(bucket: Bucket, key: str, value: dict[str, Any], ttl: float) -> None:
    """A plain put that expires ``ttl`` seconds after it was written (a MaxAge marker)."""
    await Keys(bucket).put(key, value, ttl)


# ------------------------------------------------------- keys without a TTL
#
# Written through nats-py's KeyValue (its create sees a deleted key as free,
# which these keys, never written with a TTL, rely on).


async def create_or_update(
    kv: KeyValue, key: str, value: bytes | dict[str, Any], revision: int | None
) -> int:
    """One compare-and-set step: create `key` when `revision` is None (it must not
    exist, or be deleted), else update it from `revision`; the new revision.

    `value` is stored as is when bytes, as compact JSON when a dict.
    CasConflict when someone else wrote first (read again and retry).
    """
    data = value if isinstance(value, bytes) else compact(value)
    try:
        if revision is None:
            return int(await kv.create(key, data))
        return int(await kv.update(key, data, last=revision))
    except Exception as exc:
        if cas_conflict(exc):
            raise CasConflict(key) from exc
        raise


async def put_json(kv: KeyValue, key: str, value: dict[str, Any]) -> int:
    """A plain put of `value` as compact JSON, whatever the key holds; its revision.

    StreamError, naming the key, when NATS refuses or does not answer.
    """
    try:
        return int(await kv.put(key, compact(value)))
    except Exception as exc:
        raise StreamError(f"cannot write {key} in state bucket: {exc!r}") from exc


async def delete_at(kv: KeyValue, key: str, revision: int | None = None) -> None:
    """Delete `key`; with `revision`, only if it is still the key's last one
    (CasConflict when it moved on). The delete marker stays (no TTL)."""
    try:
        await kv.delete(key, last=revision)
    except Exception as exc:
        if cas_conflict(exc):
            raise CasConflict(key) from exc
        raise


# What a pause does to a pause already stored for the job: "keep" one in force
# (the CLI's pause), "replace" it by compare-and-set reporting what it replaced
# (the CLI's pause --force), "overwrite" it with a plain put (the page's pause).
WhenPaused = Literal["keep", "replace", "overwrite"]
PAUSE_TRIES = 3
# An operator's one compare-and-set (a command, the page's or the API's act):
# tried this many times, then KeptChanging, nothing changed. A person waits
# for it, and only another person or a sidecar taking up the key conflicts.
COMMAND_CAS_TRIES = 8


@dataclass(frozen=True)
class Paused:
    """What a pause left: the pause in force, and whether this call stored it."""

    value: dict[str, Any]
    stored: bool
    replaced: dict[str, Any] | None = None  # the pause "replace" replaced


async def store_pause(
    kv: KeyValue, job: str, value: dict[str, Any], when_paused: WhenPaused
) -> Paused:
    """Store `value` as ``paused.<job>``, the pause already there treated as
    `when_paused` says (WhenPaused). A stored pause whose ``until`` has passed
    is not in force: "keep" replaces it. StreamError when the key kept changing
    (or, for "overwrite", when the put failed)."""
    key = paused_key(job)
    if when_paused == "overwrite":
        await put_json(kv, key, value)
        return Paused(value, stored=True)
    # sidecar.run.skips imports sidecar.run.record, which imports this module.

    for _ in range(PAUSE_TRIES):  # a resume between our create and our read: try again
        try:
            await create_or_update(kv, key, value, None)
            return Paused(value, stored=True)
        except CasConflict:
            pass
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            continue
        held = decode(entry.value)
        if when_paused == "keep" and pause_active(held, round(time.time() * 1000)):
            return Paused(held, stored=False)
        try:
            await create_or_update(kv, key, value, entry.revision)
        except CasConflict:
            continue
        return Paused(value, stored=True, replaced=held)
    raise StreamError(f"cannot store {key}: it kept changing under us")
