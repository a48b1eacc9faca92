"""The one HTTP/1.1 client (sidecar/obs/http1.py), against a real socket: the
transport's framing wins over a caller's, Host and User-Agent are added when
missing, what is kept is capped, a 2xx answer is read to its end only when
asked, and an answer cut short is an error."""

from __future__ import annotations

import asyncio

import h11
import pytest

from sidecar.core.wire import USER_AGENT
from sidecar.obs import http1


async def serve(answer: bytes) -> tuple[asyncio.Server, int, list[bytes]]:
    """A server that reads one request head and writes `answer` (then closes)."""
    got: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        got.append(head)
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], got


async def exchange(answer: bytes, keep: int, whole_2xx: bool = True) -> tuple[http1.Answer, bytes]:
    server, port, got = await serve(answer)
    async with server:
        conn, data = http1.encode(
            "POST",
            "/jobs/x",
            f"127.0.0.1:{port}",
            [("Content-Length", "999"), ("Connection", "keep-alive"), ("X-A", "1")],
            b"",
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(data)
            await writer.drain()
            return await http1.read_answer(reader, conn, keep, whole_2xx), got[0] if got else b""
        finally:
            writer.close()


async def test_framing_is_the_transports_and_host_and_agent_are_added() -> None:
    answer, head = await exchange(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 100)
    assert answer == http1.Answer(200, b"ok", None)
    text = head.decode()
    assert "content-length: 0" in text.lower() and "999" not in text
    assert "connection: close" in text.lower() and "keep-alive" not in text
    assert text.lower().count("host:") == 1 and f"User-Agent: {USER_AGENT}" in text
    assert "X-A: 1" in text


async def test_the_kept_body_is_capped_and_a_failure_stops_at_the_cap() -> None:
    body = b"x" * 5000
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5000\r\n\r\n" + body
    answer, _ = await exchange(ok, 10)
    assert answer == http1.Answer(200, b"x" * 10, "text/plain")  # read to its end
    bad = b"HTTP/1.1 500 Boom\r\nContent-Length: 5000\r\n\r\n" + body
    answer, _ = await exchange(bad, 10)
    assert answer.status == 500 and answer.body == b"x" * 10
    answer, _ = await exchange(ok, 10, whole_2xx=False)  # a ping's answer: its start
    assert answer.body == b"x" * 10


async def test_an_answer_cut_short_is_an_error() -> None:
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this"
    with pytest.raises(h11.RemoteProtocolError):
        await exchange(cut, 100)
