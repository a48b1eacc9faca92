"""The trigger request, against real HTTP apps over TCP and unix sockets."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import re
import socket
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sidecar.after.signing import Signer
from sidecar.config.load import JobConfig, parse_config
from sidecar.core.clock import Clock
from sidecar.run.trigger import Trigger, TriggerResult
from tests.support import RecordingApp, free_port, until

SLOT = 1_791_633_610_000
TOKEN = "0123456789abcdef0123456789abcdef"


def job_for(url: str, request: dict[str, Any] | None = None, **target: Any) -> JobConfig:
    """A job parsed from a config, so target defaults are merged as in production."""
    config = parse_config(
        {
            "target": {"url": url, **target},
            "jobs": [{"name": "sync", "schedule": "* * * * *", "request": request or {}}],
        },
        {},
    )
    return config.jobs[0]


async def fire(
    job: JobConfig, within: float = 10.0, secret: bytes | None = None, instance: str = "web-1"
) -> TriggerResult:
    async with Trigger(Signer.of(secret), Clock(), instance) as trigger:
        return await trigger.fire(job, SLOT, TOKEN, time.monotonic() + within)


@pytest.fixture(params=["tcp", "unix"])
def app(request: pytest.FixtureRequest) -> RecordingApp:
    """The recording app, once over TCP and once over a unix socket."""
    fixture = "http_app" if request.param == "tcp" else "unix_app"
    return request.getfixturevalue(fixture)  # type: ignore[no-any-return]


def lowered(headers: dict[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


async def test_request_carries_the_job(app: RecordingApp) -> None:
    job = job_for(
        app.url,
        {
            "method": "PUT",
            "path": "/internal/sync",
            "headers": {"x-env": "staging", "Content-Type": "application/json"},
            "body": '{"full": true, "name": "Zoë"}',
        },
        headers={"Authorization": "Bearer abc", "X-Env": "prod"},
    )
    before = time.time()
    result = await fire(job)
    assert (result.ok, result.http_status, result.error) == (True, 200, None)
    assert result.delivery_tries == 1
    assert before <= result.started_at <= result.finished_at <= time.time()
    assert result.duration >= 0
    (req,) = app.requests
    assert (req.method, req.path) == ("PUT", "/internal/sync")
    assert req.body == '{"full": true, "name": "Zoë"}'.encode()
    headers = lowered(req.headers)
    assert headers["authorization"] == "Bearer abc"  # from the target
    assert headers["x-env"] == "staging"  # the job's own wins, whatever its case
    assert headers["content-type"] == "application/json"
    assert headers["x-anarchon-job"] == "sync"
    assert headers["x-anarchon-slot"] == str(SLOT)
    assert headers["x-anarchon-run-id"] == TOKEN
    assert headers["x-anarchon-scheduled-at"] == "2026-10-10T12:00:10.000Z"
    assert headers["x-anarchon-instance"] == "web-1"
    assert "x-anarchon-signature" not in headers


async def test_default_request_is_a_post_to_the_jobs_path(http_app: RecordingApp) -> None:
    result = await fire(job_for(http_app.url))
    assert result.ok
    (req,) = http_app.requests
    assert (req.method, req.path, req.body) == ("POST", "/jobs/sync", b"")


@pytest.mark.parametrize("body", ["", '{"full": true}', "ünïcødé ✓"])
async def test_signature_verifies_independently(http_app: RecordingApp, body: str) -> None:
    secret = b"s3cret\x00\xffkey"
    before = int(time.time())
    result = await fire(job_for(http_app.url, {"body": body}), secret=secret)
    after = int(time.time())
    assert result.ok
    (req,) = http_app.requests
    header = lowered(req.headers)["x-anarchon-signature"]
    match = re.fullmatch(r"t=(\d+),v1=([0-9a-f]{64}),v2=([0-9a-f]{64})", header)
    assert match, header
    t, v1, v2 = int(match[1]), match[2], match[3]
    assert before <= t <= after
    expected = hmac.new(secret, str(t).encode() + b"." + req.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(v1, expected)
    wrong = hmac.new(b"other", str(t).encode() + b"." + req.body, hashlib.sha256).hexdigest()
    assert v1 != wrong
    # v2 binds the whole request (docs/TRIGGER.md, "Verifying the signature").
    digest = hashlib.sha256(req.body).hexdigest()
    message = f"anarchon-v2\n{t}\nPOST\n/jobs/sync\nsync\n{SLOT}\n{TOKEN}\n1\n\n{digest}"
    assert hmac.compare_digest(v2, hmac.new(secret, message.encode(), hashlib.sha256).hexdigest())


@pytest.mark.parametrize(
    ("status", "ok"), [(200, True), (201, True), (204, True), (302, False), (404, False)]
)
async def test_2xx_is_success_and_nothing_else(
    http_app: RecordingApp, status: int, ok: bool
) -> None:
    http_app.status["/jobs/sync"] = status
    result = await fire(job_for(http_app.url))
    assert (result.ok, result.http_status, result.delivery_tries) == (ok, status, 1)
    assert (result.error is None) is ok
    assert len(http_app.requests) == 1


async def test_500_is_a_failure_with_status_and_text(app: RecordingApp) -> None:
    app.status["/jobs/sync"] = 500
    result = await fire(job_for(app.url))
    assert not result.ok
    assert result.http_status == 500
    assert result.error == "HTTP 500: ok"  # the app's answer text
    assert result.delivery_tries == 1 and len(app.requests) == 1


@pytest.fixture
async def error_app() -> AsyncIterator[str]:
    """An app that answers 503 with a long, multi-line error text."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(status=503, text="database\n  is down:  " + "x" * 5000)

    app = web.Application()
    app.router.add_post("/jobs/sync", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_error_text_is_one_short_line(error_app: str) -> None:
    result = await fire(job_for(error_app))
    assert not result.ok and result.http_status == 503
    assert result.error is not None
    assert result.error.startswith("HTTP 503: database is down: xxx")
    assert "\n" not in result.error
    assert len(result.error) <= len("HTTP 503: ") + 200


async def test_timeout_fails_without_resending(app: RecordingApp) -> None:
    app.delay["/jobs/sync"] = 1.0
    started = time.monotonic()
    result = await fire(job_for(app.url, {"timeout": "200ms"}), within=30)
    took = time.monotonic() - started
    assert not result.ok
    assert (result.http_status, result.delivery_tries) == (None, 1)
    assert result.error == "no answer within 0.2s"
    assert 0.15 <= took < 0.9, took
    assert len(app.requests) == 1


def unstarted_app(kind: str, tmp_path: Path) -> RecordingApp:
    """An app whose address is known but which does not listen yet.

    ``stale`` leaves a socket file nobody listens on, as a crashed app does.
    """
    if kind == "tcp":
        return RecordingApp(port=free_port())
    path = str(tmp_path / "late.sock")
    if kind == "stale":
        with socket.socket(socket.AF_UNIX) as stale:
            stale.bind(path)
        assert Path(path).is_socket()
    return RecordingApp(socket_path=path)


@pytest.mark.parametrize("kind", ["tcp", "unix", "stale"])
async def test_undelivered_is_retried_until_the_app_listens(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sidecar.run.trigger")
    app = unstarted_app(kind, tmp_path)
    try:
        pending = asyncio.create_task(fire(job_for(app.url), within=20))
        await until(
            lambda: (
                pending.done() or any("app not reachable" in r.getMessage() for r in caplog.records)
            ),
            what="a refused attempt",
        )
        assert not pending.done()
        await asyncio.to_thread(app.start)
        result = await pending
    finally:
        app.stop()
    assert result.ok and result.http_status == 200
    assert result.delivery_tries >= 2
    assert len(app.requests) == 1


@pytest.mark.parametrize("kind", ["tcp", "unix", "stale"])
async def test_undelivered_gives_up_at_the_deadline(kind: str, tmp_path: Path) -> None:
    app = unstarted_app(kind, tmp_path)
    started = time.monotonic()
    result = await fire(job_for(app.url), within=0.8)
    took = time.monotonic() - started
    assert not result.ok and result.http_status is None
    assert result.error is not None
    assert result.error.startswith("cannot connect to ")
    assert result.error.endswith("(gave up)")
    assert (app.socket_path or "127.0.0.1") in result.error
    assert result.delivery_tries >= 3
    assert 0.25 <= took < 0.8 + 0.2, took  # retried for a while, never past the deadline


class HangUpApp:
    """A raw server that reads part or all of a request, then drops the connection."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.connections = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.how != "accept":
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            await reader.readexactly(int(length[1]) if length else 0)
            self.requests += 1
        if self.how == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("how", ["close", "reset", "accept"])
@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_app_hanging_up_is_a_failure_never_resent(
    transport: str, how: str, method: str, tmp_path: Path
) -> None:
    """Also for idempotent methods, which aiohttp by itself would send a second time."""
    hang = HangUpApp(how)
    if transport == "unix":
        path = str(tmp_path / "hang.sock")
        server = await asyncio.start_unix_server(hang.handle, path)
        url = f"unix://{path}"
    else:
        port = free_port()
        server = await asyncio.start_server(hang.handle, "127.0.0.1", port)
        url = f"http://127.0.0.1:{port}"
    async with server:
        result = await fire(job_for(url, {"method": method, "body": "payload"}), within=20)
    assert not result.ok and result.http_status is None
    assert result.error is not None
    assert result.error.startswith("request failed after connecting"), result.error
    assert result.delivery_tries == 1
    assert hang.connections == 1
    assert hang.requests == (0 if how == "accept" else 1)


class RawApp:
    """A raw server that reads the request, then writes `answer` and `chunk` forever (or not)."""

    def __init__(self, answer: bytes, chunk: bytes = b"") -> None:
        self.answer = answer
        self.chunk = chunk
        self.requests = 0
        self.sent = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            writer.write(self.answer)
            await writer.drain()
            while self.chunk:
                writer.write(self.chunk)
                await writer.drain()
                self.sent += len(self.chunk)
        except ConnectionError:
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def raw_app(app: RawApp) -> AsyncIterator[str]:
    port = free_port()
    server = await asyncio.start_server(app.handle, "127.0.0.1", port)
    async with server:
        yield f"http://127.0.0.1:{port}"


async def test_endless_2xx_body_is_discarded_until_the_timeout() -> None:
    """A 2xx answer is read to its end within the timeout, never kept whole."""
    app = RawApp(b"HTTP/1.1 200 OK\r\n\r\n", b"x" * 65536)  # no length: until close
    async with raw_app(app) as url:
        started = time.monotonic()
        result = await fire(job_for(url, {"timeout": "500ms"}), within=30)
        took = time.monotonic() - started
    assert not result.ok and result.http_status is None
    assert result.error == "no answer within 0.5s"
    assert (result.delivery_tries, app.requests) == (1, 1)
    assert 0.4 <= took < 1.5, took
    assert app.sent > 1_000_000  # it did stream, and the sidecar kept reading


async def test_2xx_body_is_read_to_its_end() -> None:
    body = b"y" * 3_000_000
    app = RawApp(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    async with raw_app(app) as url:
        result = await fire(job_for(url))
    assert (result.ok, result.http_status, result.error) == (True, 201, None)
    assert result.delivery_tries == 1


async def test_endless_error_body_is_cut_after_what_is_kept() -> None:
    """A non-2xx answer: MAX_ERROR_BODY bytes are kept, then the connection is closed."""
    app = RawApp(
        b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"10000\r\n" + b"e" * 65536 + b"\r\n",
    )
    async with raw_app(app) as url:
        started = time.monotonic()
        result = await fire(job_for(url, {"timeout": "20s"}), within=30)
        took = time.monotonic() - started
    assert not result.ok and result.http_status == 500
    assert result.error == "HTTP 500: " + "e" * 200
    assert took < 5, took
    assert app.requests == 1


@pytest.mark.parametrize(
    "answer",
    [b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", b"HTTP/1.1 200"],
)
async def test_malformed_or_cut_answer_is_a_failure_never_resent(answer: bytes) -> None:
    app = RawApp(answer)
    async with raw_app(app) as url:
        result = await fire(job_for(url), within=20)
    assert not result.ok and result.http_status is None
    assert result.error is not None
    assert result.error.startswith("request failed after connecting"), result.error
    assert (result.delivery_tries, app.requests) == (1, 1)


async def test_request_on_the_wire(tmp_path: Path) -> None:
    """Host, framing and the sidecar's name; configured framing headers give way."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head + await reader.readexactly(4))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        writer.close()

    port = free_port()
    async with await asyncio.start_server(handle, "127.0.0.1", port):
        result = await fire(
            job_for(
                f"http://127.0.0.1:{port}",
                {"body": "data", "headers": {"Connection": "keep-alive", "Content-Length": "99"}},
            )
        )
    assert result.ok and result.http_status == 204
    (raw,) = seen
    lines = raw.split(b"\r\n")
    assert lines[0] == b"POST /jobs/sync HTTP/1.1"
    fields = [line.split(b": ", 1) for line in lines[1:] if b": " in line]
    names = [name.lower() for name, _ in fields]
    assert names.count(b"content-length") == names.count(b"connection") == 1
    values = {name.lower(): value for name, value in fields}
    assert values[b"host"] == f"127.0.0.1:{port}".encode()
    assert values[b"content-length"] == b"4" and values[b"connection"] == b"close"
    assert values[b"user-agent"].startswith(b"anarchon-sidecar/")
    assert raw.endswith(b"\r\n\r\ndata")


async def test_no_connection_within_the_timeout_is_undelivered() -> None:
    """A listener whose queue is full never completes the handshake: nothing was sent."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        # Fill the accept queue (backlog 0 holds one or two) so later SYNs are dropped.
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        started = time.monotonic()
        result = await fire(job_for(f"http://127.0.0.1:{port}", {"timeout": "200ms"}), within=1.0)
        took = time.monotonic() - started
    finally:
        for s in fillers:
            s.close()
        listener.close()
    assert not result.ok and result.http_status is None
    assert result.error == (
        f"cannot connect to http://127.0.0.1:{port}: no connection within 0.2s (gave up)"
    )
    assert result.delivery_tries >= 2
    assert took < 1.5, took
