"""One HTTP/1.1 exchange over a fresh connection, framed by h11: the request's
bytes, and the answer read back with a cap on what is kept.

The one client of the sidecar: the trigger (sidecar/run/trigger.py) and the
requests the sidecar sends on its own behalf (sidecar/obs/outbound.py: pings,
webhooks, spans) both frame and read through here. Each request is sent with
``Connection: close``; the transport's own framing (``Content-Length``,
``Transfer-Encoding``, ``Connection``) is never taken from the caller's
headers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import NamedTuple

import h11

from sidecar.core.wire import USER_AGENT

# Header names the transport sets itself; a caller's are dropped.
FRAMING = frozenset({"content-length", "transfer-encoding", "connection"})
# One read from the socket at most.
READ_CHUNK = 64 * 1024


class Answer(NamedTuple):
    """An answer as kept: its status, at most the caller's cap of its body, and its
    Content-Type (None: none given)."""

    status: int
    body: bytes
    content_type: str | None = None


def encode(
    method: str, target: str, host: str, headers: Iterable[tuple[str, str]], body: bytes
) -> tuple[h11.Connection, bytes]:
    """The request as bytes, and the connection state to read its answer with.

    ``Host`` (`host`) and ``User-Agent`` are added when `headers` has none;
    ``Content-Length`` and ``Connection: close`` are always the transport's.
    Raises h11.LocalProtocolError for a request h11 will not frame."""
    given = list(headers)
    lowered = {name.lower() for name, _ in given}
    fields = [(name, value) for name, value in given if name.lower() not in FRAMING]
    if "host" not in lowered:
        fields.insert(0, ("Host", host))
    if "user-agent" not in lowered:
        fields.append(("User-Agent", USER_AGENT))
    fields += [("Content-Length", str(len(body))), ("Connection", "close")]
    conn = h11.Connection(h11.CLIENT)
    data = conn.send(h11.Request(method=method, target=target, headers=fields)) or b""
    if body:
        data += conn.send(h11.Data(data=body)) or b""
    return conn, data + (conn.send(h11.EndOfMessage()) or b"")


async def read_answer(
    reader: asyncio.StreamReader, conn: h11.Connection, keep: int, whole_2xx: bool = True
) -> Answer:
    """The status, at most `keep` bytes of the body and the content type.

    With `whole_2xx` a 2xx answer's body is read to its end (the rest discarded
    as it arrives: the app's run is over only then); any other answer's reading
    stops once `keep` bytes are kept. Raises h11.RemoteProtocolError for a
    malformed answer or one cut short.
    """
    status = 0
    kept = b""
    ctype: str | None = None
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(READ_CHUNK))
        elif isinstance(event, h11.Response):
            status = event.status_code
            for name, value in event.headers:  # h11 lowers the names
                if name == b"content-type":
                    ctype = value.decode("latin-1")
        elif isinstance(event, h11.Data):
            if len(kept) < keep:
                kept += bytes(event.data[: keep - len(kept)])
            if len(kept) >= keep and not (whole_2xx and 200 <= status < 300):
                return Answer(status, kept, ctype)
        elif isinstance(event, h11.EndOfMessage):
            return Answer(status, kept, ctype)
        elif isinstance(event, h11.ConnectionClosed):  # cannot come before EndOfMessage
            raise h11.RemoteProtocolError("connection closed before the answer")
        # h11.InformationalResponse (1xx): the real answer follows.
