"""A watch's initial values that reach the client after the server's other answers.

nats-py ends a new watch's initial values with a None, and puts it first when the
consumer's info says nothing is pending and no value has arrived yet. The server
counts a value as delivered once its consumer has sent it, so on a loaded machine
its answer to the info request can overtake the values: CI saw ``status`` show an
empty bucket (0 live instances, none of 400 jobs). The proxy here holds back every
value the state bucket's consumers send (the ``$JS.ACK.KV_...`` replies) while
every other answer passes, which is that ordering every time. Every initial read
must still see every key (sidecar/core/natspy.py ``read_initial``): the daemon's
watch, ``status``'s read and ``job import``'s count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS

from sidecar.admin.jobwrite import count_jobs
from sidecar.config.load import parse_config
from sidecar.store.kv import put_json
from sidecar.store.state import View, ensure_bucket, read_view, state_spec
from sidecar.store.watch import Watch
from tests.reliability.proxy import CRLF, AckProxy, _frames
from tests.support import NatsServer, until

CONFIG = parse_config(
    {
        "nats": {"servers": ["nats://127.0.0.1:1"]},
        "jobs": [{"name": "sync", "schedule": "0 0 * * *"}],
    },
    {},
)
SPEC = state_spec(CONFIG)
HOLD = 1.0
KEYS = 40


class LateValuesProxy(AckProxy):
    """Every value a consumer of the state bucket sends reaches the client `hold`
    seconds late, in order; every other frame passes at once (and so overtakes)."""

    held: int = 0

    async def _server_to_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        late: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver_late() -> None:
            while True:
                due, frame = await late.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(frame)
                await writer.drain()

        pump = asyncio.create_task(deliver_late())
        slow: set[bytes] = set()
        buf = bytearray()
        try:
            while chunk := await reader.read(65536):
                buf += chunk
                for op, line, payload in _frames(buf):
                    parts = line.split()
                    with_reply = (op == b"MSG" and len(parts) == 5) or len(parts) == 6
                    reply = parts[3] if op in (b"MSG", b"HMSG") and with_reply else b""
                    if reply.startswith(f"$JS.ACK.KV_{SPEC.bucket}.".encode()):
                        slow.add(parts[2])  # a consumer's subscription: all of it late,
                        self.held += 1  # its heartbeats and flow control too, in order
                    if op in (b"MSG", b"HMSG") and parts[2] in slow:
                        late.put_nowait((time.monotonic() + self.hold, line + CRLF + payload))
                    else:
                        writer.write(line + CRLF + payload)
                await writer.drain()
        finally:
            pump.cancel()


@pytest.fixture
async def slow_values(nats_server: NatsServer) -> AsyncIterator[tuple[NATS, LateValuesProxy]]:
    proxy = LateValuesProxy(nats_server.port, hold=HOLD).start()
    conn = await nats.connect(proxy.url)
    try:
        yield conn, proxy
    finally:
        with contextlib.suppress(Exception):
            await conn.close()
        proxy.stop()


async def filled(nc: NATS) -> None:
    """KEYS jobs (one of them deleted since), a pause and a live instance."""
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    for i in range(KEYS):
        await bucket.kv.put(f"job.t{i}", json.dumps({"schedule": "@daily"}).encode())
    await bucket.kv.delete("job.t7")
    await put_json(bucket.kv, "paused.sync", {"by": "ops"})
    await put_json(bucket.kv, "instance.a", {"id": "a"})


async def test_status_read_sees_every_key_when_the_values_come_after_the_consumers_info(
    nc: NATS, slow_values: tuple[NATS, LateValuesProxy]
) -> None:
    await filled(nc)
    slow, proxy = slow_values
    view = await read_view(slow.jetstream(), CONFIG)
    assert view is not None and proxy.held >= KEYS  # the values did come late
    assert sum(k.startswith("job.") for k in view.keys) == KEYS - 1
    assert "paused.sync" in view.keys and "instance.a" in view.keys

    # job import's count of the bucket's jobs: the deleted one is not counted.
    kv = await slow.jetstream().key_value(SPEC.bucket)
    assert await count_jobs(kv) == KEYS - 1


async def test_an_empty_bucket_is_read_as_empty_at_once_through_the_same_link(
    nc: NATS, slow_values: tuple[NATS, LateValuesProxy]
) -> None:
    await ensure_bucket(nc.jetstream(), SPEC)
    slow, _ = slow_values
    started = time.monotonic()
    view = await read_view(slow.jetstream(), CONFIG)
    assert view is not None and view.keys == {}
    assert time.monotonic() - started < HOLD  # nats-py's end marker is trusted then
    kv = await slow.jetstream().key_value(SPEC.bucket)
    assert await count_jobs(kv) == 0


async def test_the_daemons_watch_is_synced_only_with_every_key_in_its_view(
    nc: NATS, slow_values: tuple[NATS, LateValuesProxy]
) -> None:
    await filled(nc)
    slow, proxy = slow_values
    bucket = await ensure_bucket(slow.jetstream(), SPEC)
    # A connection's first watch here gets its values before the consumer's info
    # (its consumer is slower to make); the daemon reads again on every reconnect.
    await read_view(slow.jetstream(), CONFIG)
    changes: list[str] = []
    view = View(on_change=changes.append)
    watch = Watch(bucket, view)
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: view.synced, 20, what="the first read")
        # At the moment it says it has read the bucket, the pause is in it: a job
        # is never run as not paused in between (the start-up wait ends on synced).
        assert "paused.sync" in view.keys and "instance.a" in view.keys
        assert sum(k.startswith("job.") for k in view.keys) == KEYS - 1
        assert proxy.held >= KEYS
        assert "paused.sync" in changes and "" in changes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
