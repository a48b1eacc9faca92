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
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
import pytest
from nats.aio.client import Client as NATS

from sidecar.admin.jobwrite import count_jobs
from sidecar.config.load import parse_config
from sidecar.core import natspy
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
ASK_LATE = 0.2
KEYS = 40


class LateValuesProxy(AckProxy):
    """Every value a consumer of the state bucket sends reaches the client `hold`
    seconds late, in order; every other frame passes at once (and so overtakes).
    A request for such a consumer's info reaches the server ASK_LATE seconds late:
    its consumer has then sent every value (and the race is there every time)."""

    held: int = 0

    async def _hold(self, op: bytes, parts: list[bytes], writer: asyncio.StreamWriter) -> None:
        info = f"$JS.API.CONSUMER.INFO.KV_{SPEC.bucket}.".encode()
        if op == b"PUB" and len(parts) > 1 and parts[1].startswith(info):
            await writer.drain()  # what came before it goes on first
            await asyncio.sleep(ASK_LATE)

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


@pytest.fixture
def early(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per read whose first update was nats-py's end marker: True when the
    consumer had sent nothing (the marker trusted), False when it had (the race)."""
    answers: list[bool] = []
    real = natspy.nothing_sent

    def recorded(info: object) -> bool:
        answers.append(real(info))
        return answers[-1]

    monkeypatch.setattr(natspy, "nothing_sent", recorded)
    return answers


async def raced(read: Callable[[], Awaitable[None]], early: list[bool]) -> None:
    """`read` (which checks what it read) until one read met the marker before the
    values (the proxy makes that every read's lot; tried a few times all the same,
    as a loaded machine may send the values even later)."""
    for _ in range(5):
        before = len(early)
        await read()
        if False in early[before:]:
            return
    raise AssertionError(f"the end marker never came before the values: {early}")


async def test_status_read_sees_every_key_when_the_values_come_after_the_consumers_info(
    nc: NATS, slow_values: tuple[NATS, LateValuesProxy], early: list[bool]
) -> None:
    await filled(nc)
    slow, proxy = slow_values

    async def status_read() -> None:
        view = await read_view(slow.jetstream(), CONFIG)
        assert view is not None
        assert sum(k.startswith("job.") for k in view.keys) == KEYS - 1
        assert "paused.sync" in view.keys and "instance.a" in view.keys

    await raced(status_read, early)

    # job import's count of the bucket's jobs: the deleted one is not counted.
    kv = await slow.jetstream().key_value(SPEC.bucket)

    async def counted() -> None:
        assert await count_jobs(kv) == KEYS - 1

    await raced(counted, early)
    assert proxy.held >= 2 * KEYS


async def test_a_read_whose_last_value_nats_py_skips_ends_once_all_arrived(
    nc: NATS, slow_values: tuple[NATS, LateValuesProxy], early: list[bool]
) -> None:
    """nats-py hands over no entry for some messages (a deletion to a watcher that
    ignores them; a marker of a reason it does not know): when that one is the last,
    no value says "nothing pending". The read still ends, with every other value."""
    await filled(nc)
    kv_fast = await nc.jetstream().key_value(SPEC.bucket)
    await kv_fast.delete("job.t39")  # the last message on job.> is a deletion
    slow, _ = slow_values
    kv = await slow.jetstream().key_value(SPEC.bucket)

    async def read() -> None:
        keys: list[str] = []
        watcher = await kv.watch("job.>", ignore_deletes=True)
        try:
            started = time.monotonic()
            await natspy.read_initial(watcher, lambda e: keys.append(e.key), 10.0)
            assert time.monotonic() - started < 8.0  # not the 10 s timeout
        finally:
            await watcher.stop()
        assert sorted(keys) == sorted(f"job.t{i}" for i in range(KEYS) if i not in (7, 39)), (
            early,
            time.monotonic() - started,
        )

    await raced(read, early)


async def test_an_empty_bucket_is_read_as_empty_at_once_through_the_same_link(
    nc: NATS, slow_values: tuple[NATS, LateValuesProxy], early: list[bool]
) -> None:
    await ensure_bucket(nc.jetstream(), SPEC)
    slow, _ = slow_values
    started = time.monotonic()
    view = await read_view(slow.jetstream(), CONFIG)
    assert view is not None and view.keys == {}
    kv = await slow.jetstream().key_value(SPEC.bucket)
    assert await count_jobs(kv) == 0
    # nats-py's end marker is trusted then: no wait for values (READ_TIMEOUT is 10 s).
    assert time.monotonic() - started < 5.0
    assert early == [True, True]


async def test_the_daemons_watch_is_synced_only_with_every_key_in_its_view(
    nc: NATS, slow_values: tuple[NATS, LateValuesProxy], early: list[bool]
) -> None:
    await filled(nc)
    slow, proxy = slow_values
    bucket = await ensure_bucket(slow.jetstream(), SPEC)
    changes: list[str] = []
    view = View(on_change=changes.append)
    watch = Watch(bucket, view)
    task = asyncio.create_task(watch.run())
    try:
        for _ in range(5):  # its first read, then re-reads as after a reconnect
            before = len(early)
            view.synced = False
            changes.clear()
            watch.resync()
            await until(lambda: view.synced, 20, what="a full read")
            # At the moment it says it has read the bucket, the pause is in it: a job
            # is never run as not paused in between (the start-up wait ends on synced).
            assert "paused.sync" in view.keys and "instance.a" in view.keys
            assert sum(k.startswith("job.") for k in view.keys) == KEYS - 1
            if not before:  # the first read tells every key, after they are all in
                assert "paused.sync" in changes and "" in changes, changes
            if False in early[before:]:
                break
        assert False in early, early  # the marker did come before the values
        assert proxy.held >= KEYS
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
