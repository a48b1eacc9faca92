"""The admin server over real sockets: endpoints, methods, bad and slow clients."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import sidecar.admin.server as server_module
from sidecar.admin.server import MAX_CONNECTIONS, AdminServer
from sidecar.core.errors import ConfigError, ListenError
from sidecar.obs.metrics import Metrics
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
async def server() -> AsyncIterator[AdminServer]:
    registry = CollectorRegistry()
    counter = Metrics(registry).claims_won_total.labels(job="j")
    counter.inc()
    state: dict[str, str | None] = {"reason": "not connected to NATS"}
    srv = AdminServer(registry, "127.0.0.1", free_port(), lambda: state["reason"])
    srv.state = state  # type: ignore[attr-defined]
    srv.counter = counter  # type: ignore[attr-defined]
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
    not_ready = await exchange(port, b"GET /readyz?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert not_ready.startswith(b"HTTP/1.1 503 Service Unavailable")
    assert not_ready.endswith(b"not ready: not connected to NATS\n")
    server.state["reason"] = None  # type: ignore[attr-defined]
    assert (await exchange(port, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")).endswith(
        b"\r\n\r\nready\n"
    )


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", b"404"),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", b"405"),
        (b"GET /healthz HTTP/1.1\r\n\r\n", b"400"),  # HTTP/1.1 without Host (RFC 9112)
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"y" * 20_000 + b"\r\n\r\n", b"431"),
        (b"garbage\r\n\r\n", b"400"),
        (b"GET /metrics\r\n\r\n", b"400"),
    ],
)
async def test_refusals(server: AdminServer, raw: bytes, status: bytes) -> None:
    assert (await exchange(server.port, raw)).startswith(b"HTTP/1.1 " + status)


async def test_head_has_no_body(server: AdminServer) -> None:
    reply = await exchange(server.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\r\n\r\n")


async def test_oversized_request_line_is_refused_and_server_keeps_serving(
    server: AdminServer,
) -> None:
    reply = await exchange(server.port, b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:100]
    assert (await exchange(server.port, b"GET /healthz HTTP/1.0\r\n\r\n")).endswith(b"ok\n")


async def test_port_in_use_is_not_a_config_error_and_names_port_and_key(
    server: AdminServer,
) -> None:
    other = AdminServer(CollectorRegistry(), "127.0.0.1", server.port, lambda: None)
    with pytest.raises(ListenError) as err:
        await other.start()
    assert not isinstance(err.value, ConfigError)
    assert str(err.value).startswith(
        f"cannot listen on 127.0.0.1:{server.port} (metrics.listen): address already in use: "
    )


async def test_a_host_name_that_does_not_resolve_is_a_config_error() -> None:
    other = AdminServer(CollectorRegistry(), "no-such-host.invalid", free_port(), lambda: None)
    with pytest.raises(ConfigError) as err:
        await other.start()
    assert err.value.key == "metrics.listen"


# --------------------------------------------------------------------------- limits


async def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


class BigCollector(Collector):
    """32 samples with 1 MB labels: a 32 MB body, more than any socket buffers hold."""

    def collect(self) -> Iterator[Metric]:
        big = GaugeMetricFamily("big", "Large.", labels=["pad"])
        for i in range(32):
            big.add_metric([f"{i}" + "p" * 1_000_000], i)
        yield big


@pytest.fixture
async def big_server() -> AsyncIterator[AdminServer]:
    """A server whose /metrics is larger than what the kernel buffers."""
    registry = CollectorRegistry()
    registry.register(BigCollector())
    srv = AdminServer(registry, "127.0.0.1", free_port(), lambda: None)
    await srv.start()
    yield srv
    await srv.stop()


async def slow_reader(port: int, path: bytes = b"/metrics") -> socket.socket:
    """A client that asks for `path` and never reads the answer (a tiny receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    sock.send(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the server has closed `sock` (EOF or reset after whatever was sent)."""
    try:
        while True:
            data = sock.recv(1 << 20)
            if not data:
                return True
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


async def test_slow_readers_are_cut_off_at_the_exchange_bound(
    big_server: AdminServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "EXCHANGE_TIMEOUT", 1.0)
    socks = [await slow_reader(big_server.port) for _ in range(5)]
    try:
        await wait_until(lambda: big_server.connections == 5, 10, "5 slow readers connected")
        started = time.monotonic()
        await wait_until(lambda: big_server.connections == 0, 10, "slow readers cut off")
        assert time.monotonic() - started < 3
        await wait_until(lambda: all(closed_by_peer(s) for s in socks), 5, "the sockets closed")
    finally:
        for s in socks:
            s.close()


async def test_idle_connections_are_closed_after_the_request_bound(
    server: AdminServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "REQUEST_TIMEOUT", 0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /healthz HTTP/1.1\r\n")  # and never the end of the head
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert time.monotonic() - started < 2
    writer.close()


async def test_a_request_beyond_the_cap_displaces_the_oldest_idle_connection(
    server: AdminServer, caplog: pytest.LogCaptureFixture
) -> None:
    """An idle flood cannot lock a scraper out: each newcomer displaces the oldest idle one."""
    caplog.set_level(logging.WARNING, logger="sidecar.admin.server")
    held = []
    for _ in range(MAX_CONNECTIONS):
        held.append(await asyncio.open_connection("127.0.0.1", server.port))
        await wait_until(lambda: server.connections == len(held), 10, "the held connection")
    try:
        for _ in range(10):
            answer = await exchange(server.port, b"GET /healthz HTTP/1.0\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"ok\n")
            held.append(await asyncio.open_connection("127.0.0.1", server.port))  # at the cap again
            await wait_until(lambda: server.connections == MAX_CONNECTIONS, 10, "the cap")
        # The ten oldest were closed on, at once; the others are still held.
        for reader, _ in held[:10]:
            with contextlib.suppress(ConnectionError):
                assert await asyncio.wait_for(reader.read(), 1) == b""
        assert not any(reader.at_eof() for reader, _ in held[10:])
        assert server.connections == MAX_CONNECTIONS
    finally:
        for _, writer in held:
            writer.close()
    refusals = [r for r in caplog.records if "the limit" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]
    await wait_until(lambda: server.connections == 0, 10, "the held connections to end")


async def test_connections_beyond_the_cap_of_busy_ones_are_closed_at_once(
    big_server: AdminServer,
) -> None:
    """Every held connection is being answered (slow readers): one more is closed at once."""
    socks = [await slow_reader(big_server.port) for _ in range(MAX_CONNECTIONS)]
    try:
        await wait_until(
            lambda: len(big_server._answering) == MAX_CONNECTIONS, 10, "the slow readers"
        )
        for _ in range(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", big_server.port)
            writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
            started = time.monotonic()
            with contextlib.suppress(ConnectionError):
                assert await asyncio.wait_for(reader.read(), 5) == b""
            assert time.monotonic() - started < 1
            writer.close()
        assert len(big_server._answering) == MAX_CONNECTIONS
    finally:
        for sock in socks:
            sock.close()
    await wait_until(lambda: big_server.connections == 0, 15, "the slow readers to end")


class CountingCollector(Collector):
    """A cheap collector that counts the renderings."""

    def __init__(self) -> None:
        self.renders = 0

    def collect(self) -> Iterator[Metric]:
        self.renders += 1
        yield GaugeMetricFamily("counting_collector", "Counts.", value=1)


async def test_metrics_render_in_slices_at_most_once_a_second_when_slow() -> None:
    """1,000 jobs: about 100 ms of rendering, in slices; one rendering for many scrapes."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.claims_won_total.labels(job="job-0999").inc()
    collector = CountingCollector()
    registry.register(collector)
    srv = AdminServer(registry, "127.0.0.1", free_port(), lambda: None)
    await srv.start()
    lags: list[float] = []

    async def ticker() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.001)
            lags.append(time.monotonic() - before - 0.001)

    tick = asyncio.create_task(ticker())
    try:
        await asyncio.sleep(0.05)
        # As the daemon does after start-up: the collector's full passes walk
        # the frozen objects no more (here: pytest's, about 50-80 ms a pass).
        gc.collect()
        gc.freeze()
        await asyncio.sleep(0.01)  # the tick that waited for gc.collect() is not ours
        lags.clear()
        started = time.monotonic()
        try:
            bodies = await asyncio.gather(*(srv.metrics.body() for _ in range(20)))
        finally:
            gc.unfreeze()
        took = time.monotonic() - started
        assert await srv.metrics.body() is bodies[0]  # still fresh
        assert collector.renders == 1  # twenty-one scrapes, one rendering
        # The loop kept running while it rendered: never held for long (in one
        # piece it holds the loop for the whole rendering, 100-600 ms here).
        assert max(lags) < 0.05, (max(lags), took)
        expected = generate_latest(registry)
        assert all(body == expected for body in bodies)
        assert b'anarchon_claims_won_total{job="job-0999"} 1.0' in expected
        raw = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        assert (await exchange(srv.port, raw)).endswith(b"\r\n\r\n" + expected)
        renders = collector.renders
        await asyncio.sleep(1.1)
        await srv.metrics.body()
        assert collector.renders == renders + 1  # at most a second old
    finally:
        tick.cancel()
        await srv.stop()


async def test_cheap_metrics_are_fresh_at_once(server: AdminServer) -> None:
    """A small registry renders in about a millisecond: reused for a few ms only."""
    raw = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    assert b'anarchon_claims_won_total{job="j"} 1.0' in await exchange(server.port, raw)
    server.counter.inc()  # type: ignore[attr-defined]
    await asyncio.sleep(0.1)
    assert b'anarchon_claims_won_total{job="j"} 2.0' in await exchange(server.port, raw)


async def test_answers_share_a_byte_rate_after_a_burst() -> None:
    pacer = server_module.Pacer(rate=1_000_000, burst=500_000)
    started = time.monotonic()
    await pacer.take(500_000)  # the burst: at once
    assert time.monotonic() - started < 0.2
    await pacer.take(300_000)  # beyond it: paid at the rate
    await pacer.take(100_000)  # goes once the 300,000 are paid
    assert time.monotonic() - started >= 0.29
