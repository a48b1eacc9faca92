"""The admin server over real sockets: endpoints, methods, bad and slow clients."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from sidecar.errors import ConfigError
from sidecar.metrics import Metrics
from sidecar.server import AdminServer
from tests.support import free_port


async def exchange(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    try:
        data = await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:  # closed on us while we were still sending
        data = b""
    writer.close()
    return data


@pytest.fixture
async def server() -> AdminServer:
    registry = CollectorRegistry()
    Metrics(registry, ("j",)).claims_won_total.labels(job="j").inc()
    state: dict[str, str | None] = {"reason": "not connected to NATS"}
    srv = AdminServer(registry, "127.0.0.1", free_port(), lambda: state["reason"])
    srv.state = state  # type: ignore[attr-defined]
    await srv.start()
    yield srv
    await srv.stop()


async def test_endpoints(server: AdminServer) -> None:
    port = server.port
    metrics = await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n")
    head, body = metrics.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Type: text/plain; version=" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert b'anarchon_claims_won_total{job="j"} 1.0' in body
    assert (await exchange(port, b"GET /healthz HTTP/1.0\r\n\r\n")).endswith(b"\r\n\r\nok\n")
    not_ready = await exchange(port, b"GET /readyz?x=1 HTTP/1.1\r\n\r\n")
    assert not_ready.startswith(b"HTTP/1.1 503 Service Unavailable")
    assert not_ready.endswith(b"not ready: not connected to NATS\n")
    server.state["reason"] = None  # type: ignore[attr-defined]
    assert (await exchange(port, b"GET /readyz HTTP/1.1\r\n\r\n")).endswith(b"\r\n\r\nready\n")


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /nope HTTP/1.1\r\n\r\n", b"404"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405"),
        (b"garbage\r\n\r\n", b"400"),
        (b"GET /metrics\r\n\r\n", b"400"),
    ],
)
async def test_refusals(server: AdminServer, raw: bytes, status: bytes) -> None:
    assert (await exchange(server.port, raw)).startswith(b"HTTP/1.1 " + status)


async def test_head_has_no_body(server: AdminServer) -> None:
    reply = await exchange(server.port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\r\n\r\n")


async def test_oversized_request_line_is_dropped_and_server_keeps_serving(
    server: AdminServer,
) -> None:
    reply = await exchange(server.port, b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\n\r\n")
    assert reply == b""
    assert (await exchange(server.port, b"GET /healthz HTTP/1.1\r\n\r\n")).endswith(b"ok\n")


async def test_port_in_use_names_the_key(server: AdminServer) -> None:
    other = AdminServer(CollectorRegistry(), "127.0.0.1", server.port, lambda: None)
    with pytest.raises(ConfigError) as err:
        await other.start()
    assert err.value.key == "metrics.listen"
