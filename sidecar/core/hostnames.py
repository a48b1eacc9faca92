"""Host names looked up without loading the idna codec when they are plain ASCII.

asyncio resolves a host name (``nats://nats:4222``, a target's
``http://app:8080``) with ``socket.getaddrinfo`` in its default executor,
and CPython's ``getaddrinfo`` encodes a ``str`` host with the ``idna``
codec, whose module imports ``stringprep`` and ``unicodedata``: 0.45 MiB of
RSS for the life of the process, paid by every sidecar that names its NATS
server by name (docs/PERFORMANCE.md "The start's cost at 100 jobs"). For an
ASCII name that codec only checks the length of each label and returns the
same bytes, so ``ascii_host`` does the same check and gives ``getaddrinfo``
those bytes; any other name (beyond ASCII, or a label the codec refuses) is
handed on unchanged, to be encoded, or refused, as before. IP literals never
reach ``getaddrinfo`` (asyncio parses them itself).
"""

from __future__ import annotations

import asyncio
from typing import Any

# The idna codec's own limits for an ASCII name (encodings/idna.py): every
# label but the last 1-63 bytes, the last (empty after a trailing dot) below 64.
_MAX_LABEL = 63


def ascii_host(host: bytes | str | None) -> bytes | str | None:
    """`host` as the bytes the idna codec would make of it, or unchanged."""
    if not isinstance(host, str) or not host.isascii():
        return host
    labels = host.split(".")
    if all(0 < len(label) <= _MAX_LABEL for label in labels[:-1]) and (
        len(labels[-1]) <= _MAX_LABEL
    ):
        return host.encode("ascii")
    return host


def skip_idna(loop: asyncio.AbstractEventLoop) -> None:
    """Make `loop` (asyncio's own; uvloop resolves in C) look up ASCII names as bytes."""
    if not isinstance(loop, asyncio.BaseEventLoop):
        return
    lookup = loop.getaddrinfo

    async def getaddrinfo(
        host: bytes | str | None,
        port: bytes | str | int | None,
        *,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[Any]:
        return await lookup(
            ascii_host(host), port, family=family, type=type, proto=proto, flags=flags
        )

    # An attribute of this loop, read by its create_connection (asyncio calls
    # self.getaddrinfo): no subclass, so ANARCHON_EVENT_LOOP and the loop's
    # setup stay asyncio's.
    setattr(loop, "getaddrinfo", getaddrinfo)  # noqa: B010
