"""The admin server's bounds for what the fleet page added: bodies, event streams.

A request body beyond MAX_BODY is refused with 413; an event stream outlives
EXCHANGE_TIMEOUT; at most MAX_STREAMS are open at once (the next gets 503, and
/metrics still answers); a viewer that stops reading is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

import sidecar.admin.server as server_module
from sidecar.admin.server import AdminServer, Answer, Request, Stream
from tests.support import free_port, until


async def ticks(stop: asyncio.Event, size: int = 16) -> AsyncIterator[bytes]:
    while not stop.is_set():
        yield b"data: " + b"x" * size + b"\n\n"
        await asyncio.sleep(0.05)


@pytest.fixture
async def app_server() -> AsyncIterator[tuple[AdminServer, asyncio.Event, list[Request]]]:
    stop = asyncio.Event()
    seen: list[Request] = []
    srv = AdminServer(CollectorRegistry(), "127.0.0.1", free_port(), lambda: None)

    async def app(req: Request) -> Answer | Stream | None:
        seen.append(req)
        if req.path == "/events":
            return Stream(ticks(stop))
        if req.path == "/big-events":
            return Stream(ticks(stop, 256 * 1024))
        if req.path == "/echo":
            return Answer(200, "text/plain", req.body)
        return None

    srv.app = app
    await srv.start()
    yield srv, stop, seen
    stop.set()
    await srv.stop()


async def http(port: int, raw: bytes, read: int = 1 << 16) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(read), 5)
    writer.close()
    return data


async def test_bodies_are_read_and_bounded(
    app_server: tuple[AdminServer, asyncio.Event, list[Request]],
) -> None:
    srv, _, seen = app_server
    body = b"reason=db+migration"
    answer = await http(
        srv.port,
        b"POST /echo?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
    )
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(body)
    assert seen[-1].query == "x=1" and seen[-1].headers["host"] == "h"
    big = b"x" * (server_module.MAX_BODY + 1)
    answer = await http(
        srv.port,
        b"POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big),
    )
    assert answer.startswith(b"HTTP/1.1 413")
    assert (await http(srv.port, b"GET /nothing HTTP/1.1\r\nHost: h\r\n\r\n")).startswith(
        b"HTTP/1.1 404"
    )


async def test_event_streams_outlive_the_exchange_bound_and_are_capped(
    app_server: tuple[AdminServer, asyncio.Event, list[Request]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    srv, _, _ = app_server
    monkeypatch.setattr(server_module, "EXCHANGE_TIMEOUT", 0.5)
    monkeypatch.setattr(server_module, "MAX_STREAMS", 2)
    readers = []
    for _ in range(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"GET /events HTTP/1.1\r\nHost: h\r\n\r\n")
        readers.append((reader, writer))
    for reader, _ in readers:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
    await asyncio.sleep(1.0)  # twice the exchange bound: still streaming
    for reader, _ in readers:
        assert b"data: " in await asyncio.wait_for(reader.read(1024), 5)
    assert srv.streams == 2
    refused = await http(srv.port, b"GET /events HTTP/1.1\r\nHost: h\r\n\r\n")
    assert refused.startswith(b"HTTP/1.1 503")
    metrics = await http(srv.port, b"GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n")
    assert metrics.startswith(b"HTTP/1.1 200")
    for _, writer in readers:
        writer.close()


async def test_a_viewer_that_stops_reading_is_dropped(
    app_server: tuple[AdminServer, asyncio.Event, list[Request]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    srv, _, _ = app_server
    monkeypatch.setattr(server_module, "STREAM_WRITE_TIMEOUT", 0.5)
    _, writer = await asyncio.open_connection("127.0.0.1", srv.port, limit=1024)
    writer.transport.pause_reading()  # type: ignore[attr-defined]
    writer.write(b"GET /big-events HTTP/1.1\r\nHost: h\r\n\r\n")
    await until(lambda: srv.streams == 1, 5, "the stream open")
    await until(lambda: srv.streams == 0 and srv.connections == 0, 10, "the viewer dropped")
    writer.close()
