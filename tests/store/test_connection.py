"""The NATS connection's messages: no URL credentials in errors or log lines.

The config refuses credentials in server URLs, so these build a Config past
that rule: whatever reaches the connection, its messages mask them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from sidecar.config.load import Config, Secrets, parse_config
from sidecar.core.errors import ConnectError
from sidecar.store.connection import DRAIN_TIMEOUT, MAX_OUTSTANDING_PINGS, PING_INTERVAL, Connection
from tests.support import NatsServer, free_port

PASSWORD = "Sup3rS3cret"


def config_with_servers(*servers: str) -> Config:
    cfg = parse_config(
        {
            "instance_id": "t",
            "nats": {"connect_timeout": "1s"},
            "jobs": [{"name": "j", "schedule": "* * * * *"}],
        },
        {},
    )
    return dataclasses.replace(cfg, nats=dataclasses.replace(cfg.nats, servers=servers))


async def test_connect_error_masks_credentials(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there
    conn = Connection(
        config_with_servers(
            f"nats://admin:{PASSWORD}@127.0.0.1:{port}", f"nats://{PASSWORD}@127.0.0.1:{port}"
        ),
        Secrets(),
    )
    with caplog.at_level(logging.DEBUG), pytest.raises(ConnectError) as info:
        await conn.connect()
    message = str(info.value)
    assert message.startswith(
        f"cannot connect to NATS at nats://admin:***@127.0.0.1:{port}, "
        f"nats://***@127.0.0.1:{port}: "
    ), message
    assert PASSWORD not in message
    assert PASSWORD not in caplog.text


async def test_connected_log_line_masks_credentials(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = NatsServer(
        tmp_path / "nats", extra_conf=f"authorization {{ user: admin, password: {PASSWORD} }}\n"
    )
    server.start()
    try:
        conn = Connection(
            config_with_servers(f"nats://admin:{PASSWORD}@127.0.0.1:{server.port}"), Secrets()
        )
        with caplog.at_level(logging.DEBUG, logger="sidecar"):
            nc = await conn.connect()
            assert nc.is_connected
            await conn.close()
    finally:
        server.stop()
    assert f"connected to NATS at admin:***@127.0.0.1:{server.port}" in caplog.text
    assert PASSWORD not in caplog.text


async def test_closing_is_bounded_when_a_subscription_stops_reading(
    nats_server: NatsServer,
) -> None:
    """A stop must fit in the orchestrator's grace period: nats-py's drain waits
    30 s by default for a subscription whose handler never returns."""
    conn = Connection(config_with_servers(nats_server.url), Secrets())
    nc = await conn.connect()
    stuck = asyncio.Event()

    async def handler(msg: Msg) -> None:
        stuck.set()
        await asyncio.Event().wait()  # never returns, like a watch that stopped reading

    await nc.subscribe("stuck", cb=handler)
    for _ in range(3):
        await nc.publish("stuck", b"x")
    await nc.flush()
    await asyncio.wait_for(stuck.wait(), 5)
    started = time.monotonic()
    await conn.close(drain=True)
    took = time.monotonic() - started
    assert nc.is_closed
    assert took < DRAIN_TIMEOUT + 3, took


async def test_a_server_that_stops_answering_is_left_for_another(tmp_path: Path) -> None:
    """A frozen server keeps the TCP connection open and answers nothing (as a
    black-holed route does): pings find it stale, and the client moves on."""
    servers = [NatsServer(tmp_path / "a"), NatsServer(tmp_path / "b")]
    for server in servers:
        server.start()
    frozen: NatsServer | None = None
    try:
        conn = Connection(config_with_servers(*(s.url for s in servers)), Secrets())
        nc = await conn.connect()
        assert nc.connected_url is not None
        frozen = next(s for s in servers if s.port == nc.connected_url.port)
        assert frozen.proc is not None
        frozen.proc.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        deadline = started + 20
        while not (
            conn.connected.is_set()
            and nc.connected_url is not None
            and nc.connected_url.port != frozen.port
        ):
            assert time.monotonic() < deadline, "still on the frozen server after 20 s"
            await asyncio.sleep(0.1)
        took = time.monotonic() - started
        assert took < 3 * PING_INTERVAL * (MAX_OUTSTANDING_PINGS + 1), took
        await conn.close(drain=False)
    finally:
        if frozen is not None and frozen.proc is not None:
            frozen.proc.send_signal(signal.SIGCONT)
        for server in servers:
            server.stop()
