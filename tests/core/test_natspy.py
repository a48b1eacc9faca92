"""The nats-py adapter against a real nats-server: each private reach still finds what
it reaches for, so a nats-py release that renames one fails here, by name."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client as NATS
from nats.js.api import KeyValueConfig

from sidecar.core import natspy
from tests.support import NatsServer, until


async def test_a_jetstream_context_gives_its_connection_prefix_and_timeout(nc: NATS) -> None:
    js = nc.jetstream(timeout=7.5)
    assert natspy.connection_of(js) is nc
    assert natspy.api_prefix(js) == "$JS.API"
    assert natspy.api_prefix(nc.jetstream(domain="hub")) == "$JS.hub.API"
    assert natspy.request_timeout(js) == 7.5


async def test_a_kv_bucket_gives_the_context_behind_it(nc: NATS) -> None:
    js = nc.jetstream()
    kv = await js.create_key_value(KeyValueConfig(bucket="ADAPTER", history=1))
    behind = natspy.jetstream_of(kv)
    assert natspy.connection_of(behind) is nc
    info = await behind.stream_info("KV_ADAPTER")
    assert info.config.name == "KV_ADAPTER"


async def test_rotating_moves_the_connected_server_to_the_end(tmp_path: Path) -> None:
    one, two = NatsServer(tmp_path / "a", name="a"), NatsServer(tmp_path / "b", name="b")
    one.start()
    two.start()
    nc = natspy.Client(require_tls=False)
    try:
        await nc.connect(servers=[one.url, two.url], dont_randomize=True)
        assert nc.connected_url is not None and nc.connected_url.port == one.port
        # Whatever order nats-py left the pool in, the connected server goes last.
        nc._server_pool.sort(key=lambda s: s.uri.port != one.port)
        assert natspy.rotate_to_next_server(nc)
        assert [s.uri.port for s in nc._server_pool] == [two.port, one.port]
        await natspy.force_reconnect(nc)

        def on_two() -> bool:
            url = nc.connected_url
            return nc.is_connected and url is not None and url.port == two.port

        await until(on_two, 10, "reconnected to the second server")
    finally:
        await nc.close()
        one.stop()
        two.stop()


async def test_one_server_is_nowhere_to_rotate_to(nats_server: NatsServer) -> None:
    nc = natspy.Client(require_tls=False)
    await nc.connect(servers=[nats_server.url])
    try:
        assert not natspy.rotate_to_next_server(nc)
        assert nc.cluster is None  # a lone server names no cluster
    finally:
        await nc.close()


def test_a_client_never_connected_has_no_pool_to_rotate() -> None:
    assert not natspy.rotate_to_next_server(natspy.Client(require_tls=False))


def test_plaintext_refused_reads_as_its_sentence() -> None:
    exc = natspy.PlaintextRefused("server 127.0.0.1:4222 did not offer TLS")
    assert str(exc) == "server 127.0.0.1:4222 did not offer TLS"
