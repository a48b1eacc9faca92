"""Fixtures with real parts: a nats-server, recording apps, a work directory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from tests.support import NatsServer, RecordingApp


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A `nats-server -js` on a free loopback port with a temporary store."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    """A core NATS connection to `nats_server`."""
    conn = await nats.connect(nats_server.url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def http_app() -> Iterator[RecordingApp]:
    """A real HTTP app on loopback that records every request."""
    app = RecordingApp()
    app.start()
    try:
        yield app
    finally:
        app.stop()


@pytest.fixture
def unix_app(tmp_path: Path) -> Iterator[RecordingApp]:
    """A real HTTP app on a unix socket that records every request."""
    app = RecordingApp(socket_path=str(tmp_path / "app.sock"))
    app.start()
    try:
        yield app
    finally:
        app.stop()
