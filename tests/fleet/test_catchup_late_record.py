"""A skip record that lands late, and ``resume --catchup`` meanwhile: still one fate.

docs/GUARANTEES.md, "One fate per slot", rules 1 and 5. A slot both paused
and chosen by ``skip`` is recorded ``skipped: skip`` and never caught up. A
skip record is asked for until long after the slot's decision window (its
claim's deadline is the slot + jitter + max_late + half of what is left of the
duplicate window, sidecar/run/skips.py), while ``resume --catchup`` looks at a
slot 2 s after that window. Here the only sidecar up at the slot's instant
judges it, and its skip record is held on the way to the server (a proxy keeps
every publish of that id) while the sidecar itself is frozen (SIGSTOP); a new
replica comes up, the operator runs ``resume --catchup``, and the new replica
takes the catch-up. Only then does the held record reach the server.

The slot must end with one fate: its skip record, and no call of the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sidecar.admin import skipwrite
from sidecar.cli.shared import load
from tests.reliability.proxy import CRLF, _frames, _msg_id
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    StoredMsg,
    base,
    cli_config,
    free_port,
    job,
    read_stream,
    run_cli,
    sidecars,
    wait_for,
)

pytestmark = pytest.mark.serial

JITTER, MAX_LATE = 0.2, 2.0


@dataclass
class HoldProxy:
    """A TCP proxy to NATS that keeps every publish whose ``Nats-Msg-Id`` is in
    `held_ids` (armed later) until ``release``: that message reaches the server
    late, everything else passes (a publish stuck on its way, as a frozen
    sidecar's or a lossy link's is, without stalling the rest)."""

    upstream_port: int
    port: int = field(default_factory=free_port)
    held_ids: set[str] = field(default_factory=set)
    held: list[tuple[asyncio.StreamWriter, bytes]] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def arm(self, msg_id: str) -> None:
        with self._lock:
            self.held_ids.add(msg_id)

    def holding(self) -> int:
        with self._lock:
            return len(self.held)

    async def _up(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buf = bytearray()
        while chunk := await reader.read(65536):
            buf += chunk
            for op, line, payload in _frames(buf):
                frame = line + CRLF + payload
                parts = line.split()
                if op == b"HPUB" and len(parts) == 5:
                    msg_id = _msg_id(payload[: int(parts[3])])
                    with self._lock:
                        if msg_id in self.held_ids:
                            self.held.append((writer, frame))
                            continue
                writer.write(frame)
            await writer.drain()

    async def _down(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        pumps = [asyncio.create_task(self._up(cr, sw)), asyncio.create_task(self._down(sr, cw))]
        try:
            with contextlib.suppress(Exception):
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            cw.close()
            sw.close()

    def release(self) -> int:
        """Send every held publish on to the server, in order; how many."""

        async def send() -> int:
            with self._lock:
                frames, self.held = self.held, []
                self.held_ids.clear()
            for writer, frame in frames:
                writer.write(frame)
                await writer.drain()
            return len(frames)

        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(send(), self._loop).result(10)

    @contextlib.contextmanager
    def running(self) -> Iterator[HoldProxy]:
        ready = threading.Event()
        loop = self._loop = asyncio.new_event_loop()
        servers: list[asyncio.Server] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            servers.append(
                loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
            )
            ready.set()
            loop.run_forever()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert ready.wait(10), "proxy did not start"
        try:
            yield self
        finally:

            async def shutdown() -> None:
                servers[0].close()
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


def fates(stored: list[StoredMsg], name: str, slot: int) -> list[StoredMsg]:
    """The slot's fate messages: its claims of attempt 1, neither manual nor a backfill."""
    return [
        m
        for m in stored
        if m.subject == f"cron.{name}.claims"
        and m.data.get("slot") == slot
        and "backfill" not in m.data
        and m.data.get("manual") is not True
        and m.data.get("attempt", 1) == 1
    ]


@pytest.mark.parametrize("reason", ["skip", "paused"])
def test_a_skip_record_held_past_the_window_and_resume_catchup_leave_one_fate(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, reason: str
) -> None:
    """`skip`: the slot paused and chosen by skip is never run (it failed before the
    fix: caught up, and its late record stored too). `paused`: a slot only paused is
    caught up once, with one record (the settling one, or the late one)."""
    name = "late"
    spec = job(
        name, schedule="*/2 * * * * *", jitter=f"{JITTER * 1000:g}ms", max_late=f"{MAX_LATE:g}s"
    )
    direct = base(nats_server, http_app, [spec])
    cfg = cli_config(tmp_path, direct)
    ld = load(cfg)
    proxy = HoldProxy(nats_server.port)
    with proxy.running():
        held_cfg = {**direct, "nats": {**direct["nats"], "servers": [proxy.url]}}
        with sidecars(tmp_path, [("s1", held_cfg, {})]) as (s1,):
            # Claims older than the slot in the stream: a slot with no fate message
            # is caught up only then (rule 5), as here.
            wait_for(lambda: http_app.requests_for(f"/jobs/{name}"), 20, what="a run")
            assert run_cli("pause", name, "-c", cfg).returncode == 0
            # Just after an instant: `skip` chooses the next slot, almost 2 s ahead.
            wait_for(lambda: time.time() % 2 < 0.3, 3, interval=0.01, what="an instant")
            if reason == "skip":
                added, _ = asyncio.run(
                    skipwrite.skip(ld.config, ld.secrets, ld.config.job(name), 1, "op", "")
                )
                (slot,) = added
            else:
                slot = (int(time.time()) // 2 + 1) * 2000
            assert slot / 1000 - time.time() > 0.5
            proxy.arm(f"{name}:{slot}")  # its skip record: held on its way
            wait_for(proxy.holding, slot / 1000 + 10 - time.time(), what="the skip record sent")
            assert s1.proc is not None
            os.kill(s1.proc.pid, signal.SIGSTOP)  # and its sidecar frozen
            try:
                # A replica started after the slot's window: it never judges the slot.
                wait_for(lambda: time.time() > slot / 1000 + JITTER + MAX_LATE, 10)
                s2 = Sidecar(tmp_path, "s2", direct, {}).start().wait_ready()
                try:
                    done = run_cli("resume", name, "-c", cfg, "--catchup")
                    assert done.returncode == 0, done.stderr
                    # The catch-up looks at the slot 2 s after its window; give it
                    # that, and a run time, before the held record lands.
                    until = slot / 1000 + JITTER + MAX_LATE + 2 + 4
                    wait_for(lambda: time.time() > until, until - time.time() + 5)
                    assert proxy.release() >= 1
                    stored = wait_for(
                        lambda: (s := read_stream(nats_server.url)) and fates(s, name, slot) and s,
                        10,
                        what="the slot's fate stored",
                    )
                    wait_for(lambda: not backfill_left(nats_server.url, name), 60, what="done")
                    stored = read_stream(nats_server.url)
                finally:
                    s2.terminate(30)
                    s2.kill()
            finally:
                os.kill(s1.proc.pid, signal.SIGCONT)
    calls = [
        r.headers.get("X-Anarchon-Trigger", "scheduled")
        for r in http_app.requests_for(f"/jobs/{name}")
        if int(r.headers["X-Anarchon-Slot"]) == slot
    ]
    fate = [m.data.get("skipped") for m in fates(stored, name, slot)]
    assert fate == [reason], f"fate messages of {slot}: {fate}"
    if reason == "skip":
        assert calls == [], f"slot {slot} chosen by skip was run: {calls} (its fate: {fate})"
    else:
        assert calls == ["catchup"], f"paused slot {slot} not caught up once: {calls}"


def backfill_left(url: str, name: str) -> bool:
    """Whether ``backfill.<name>`` (the catch-up queued) is still in the bucket."""

    async def read() -> bool:
        import nats
        from nats.js.errors import KeyNotFoundError

        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value("CRON_STATE")
            try:
                await kv.get(f"backfill.{name}")
            except KeyNotFoundError:
                return False
            return True
        finally:
            await nc.close()

    return asyncio.run(read())
