"""A TCP proxy between one NATS client and its server that loses or delays claim acks.

It reads the NATS protocol both ways. Client to server it notes, for every
``HPUB <prefix><job>.claims <reply> ...``, the reply inbox and the claim's
``Nats-Msg-Id``; server to client, the first PubAck for each of the first
``drop`` msg ids is dropped and the first for each of the next ``delay`` msg
ids is held back for ``hold`` seconds (holding everything behind it, as a
slow network would). Every other byte passes unchanged, a frame once whole
(``_forward`` may drop a client's frame).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field

from tests.support import free_port

CRLF = b"\r\n"


def _frames(buf: bytearray) -> list[tuple[bytes, bytes, bytes]]:
    """Complete protocol frames at the head of `buf` (removed from it): (op, line, payload)."""
    out = []
    while True:
        end = buf.find(CRLF)
        if end < 0:
            return out
        line = bytes(buf[:end])
        parts = line.split()
        op = parts[0].upper() if parts else b""
        size = 0
        if op in (b"MSG", b"PUB", b"HPUB", b"HMSG"):
            size = int(parts[-1]) + 2  # payload and its CRLF
        if len(buf) < end + 2 + size:
            return out
        payload = bytes(buf[end + 2 : end + 2 + size])
        del buf[: end + 2 + size]
        out.append((op, line, payload))


def _msg_id(headers: bytes) -> str | None:
    for raw in headers.split(CRLF)[1:]:
        name, _, value = raw.partition(b":")
        if name.strip().lower() == b"nats-msg-id":
            return value.strip().decode()
    return None


@dataclass
class AckProxy:
    """Listens on `port` (127.0.0.1) and forwards to `upstream_port`."""

    upstream_port: int
    drop: int = 0
    delay: int = 0
    hold: float = 1.0
    port: int = field(default_factory=free_port)
    dropped: list[str] = field(default_factory=list)
    delayed: list[str] = field(default_factory=list)
    _inboxes: dict[bytes, str] = field(default_factory=dict)
    _decided: set[str] = field(default_factory=set)
    _loop: asyncio.AbstractEventLoop | None = None
    _server: asyncio.Server | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def tampered(self) -> list[str]:
        with self._lock:
            return self.dropped + self.delayed

    async def _client_to_server(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        buf = bytearray()
        while chunk := await reader.read(65536):
            buf += chunk
            # Note the claim's inbox before the frame goes on.
            for op, line, payload in _frames(buf):
                parts = line.split()
                if op == b"HPUB" and len(parts) == 5 and parts[1].endswith(b".claims"):
                    msg_id = _msg_id(payload[: int(parts[3])])
                    if msg_id:
                        self._inboxes[parts[2]] = msg_id
                if self._forward(op, parts):
                    await self._hold(op, parts, writer)
                    writer.write(line + CRLF + payload)
            await writer.drain()

    def _forward(self, op: bytes, parts: list[bytes]) -> bool:
        """Whether a frame from the client goes on to the server (all do, here)."""
        return True

    async def _hold(self, op: bytes, parts: list[bytes], writer: asyncio.StreamWriter) -> None:
        """Where a frame from the client may be held back before it goes on to the
        server (and everything behind it with it); none is, here."""

    def _verdict(self, msg_id: str) -> str:
        with self._lock:
            if msg_id in self._decided:
                return "pass"
            self._decided.add(msg_id)
            if len(self.dropped) < self.drop:
                self.dropped.append(msg_id)
                return "drop"
            if len(self.delayed) < self.delay:
                self.delayed.append(msg_id)
                return "delay"
            return "pass"

    async def _server_to_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        buf = bytearray()
        while chunk := await reader.read(65536):
            buf += chunk
            for op, line, payload in _frames(buf):
                parts = line.split()
                msg_id = self._inboxes.pop(parts[1], None) if op in (b"MSG", b"HMSG") else None
                verdict = self._verdict(msg_id) if msg_id else "pass"
                if verdict == "drop":
                    continue
                if verdict == "delay":
                    await writer.drain()
                    await asyncio.sleep(self.hold)
                writer.write(line + CRLF + payload)
            await writer.drain()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        pumps = [
            asyncio.create_task(self._client_to_server(client_r, server_w)),
            asyncio.create_task(self._server_to_client(server_r, client_w)),
        ]
        try:
            with contextlib.suppress(Exception):
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:  # stop() cancels this too: the sockets are closed all the same
            for task in pumps:
                task.cancel()
            for w in (client_w, server_w):
                w.close()

    def start(self) -> AckProxy:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", self.port)
            )
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("proxy did not start")
        return self

    def stop(self) -> None:
        if not self._loop or not self._server:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)
        self._loop.close()
        self._server = None
