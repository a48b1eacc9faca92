"""A real headless Chromium driven over the Chrome DevTools Protocol.

Debian's ``chromium`` (``make chromium`` installs it) is started with its
debugging port on a free loopback port and a fresh profile; the protocol is
spoken over a websocket with aiohttp's client, already in the dev extra for
the tests' apps: no browser driver, no second browser download, nothing
that fetches from the internet. Console messages, uncaught exceptions and
log entries at error level (CSP violations among them) are collected in
``errors``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
]


def chromium_or_skip() -> str:
    """The browser's path; skip (fail under CI) when it is not installed."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("chromium is missing under CI: `make chromium` installs Debian's package")
    pytest.skip("chromium not installed (make chromium, as root on Debian)")


class Page:
    """One tab: send commands, wait for events, evaluate JavaScript."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, session: str) -> None:
        self.ws = ws
        self.session = session
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: list[dict[str, Any]] = []
        self._event = asyncio.Event()
        self.errors: list[str] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self._waiting:
                self._waiting.pop(data["id"]).set_result(data)
                continue
            method = data.get("method", "")
            params = data.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                self.errors.append(
                    "console: " + " ".join(str(a.get("value", a)) for a in params.get("args", []))
                )
            elif method == "Runtime.exceptionThrown":
                self.errors.append("exception: " + json.dumps(params.get("exceptionDetails")))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                self.errors.append("log: " + params["entry"].get("text", ""))
            self._events.append(data)
            self._event.set()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = fut
        await self.ws.send_json(
            {"id": ident, "method": method, "params": params, "sessionId": self.session}
        )
        answer = await asyncio.wait_for(fut, 30)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return dict(answer.get("result", {}))

    async def wait_event(self, method: str, timeout: float = 20.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                for i, ev in enumerate(self._events):
                    if ev.get("method") == method:
                        del self._events[: i + 1]
                        return ev
                self._event.clear()
                await self._event.wait()

    async def goto(self, url: str) -> None:
        self._events.clear()
        await self.send("Page.navigate", url=url)
        await self.wait_event("Page.loadEventFired")

    async def js(self, expression: str) -> Any:
        """The value of `expression` (promises awaited)."""
        got = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in got:
            raise RuntimeError(f"{expression}: {got['exceptionDetails']}")
        return got.get("result", {}).get("value")

    async def until(self, expression: str, timeout: float = 10.0, what: str = "") -> Any:
        """Wait until `expression` is truthy in the page; its value."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            value = await self.js(expression)
            if value:
                return value
            if loop.time() > end:
                raise AssertionError(f"timed out after {timeout}s waiting for {what or expression}")
            await asyncio.sleep(0.1)

    async def size(self, width: int, height: int, mobile: bool) -> None:
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=mobile,
        )

    async def screenshot(self, path: Path) -> None:
        got = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await asyncio.to_thread(_write, path, base64.b64decode(got["data"]))

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@contextlib.asynccontextmanager
async def chromium(binary: str) -> AsyncIterator[Page]:
    """A headless Chromium with a fresh profile and one tab, closed at the end."""
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    proc = _launch(binary, profile)
    drain: threading.Thread | None = None
    try:
        assert proc.stderr is not None
        url = await asyncio.wait_for(asyncio.to_thread(_devtools_url, proc.stderr), 60)
        # The rest of its stderr is read and dropped: a full pipe would stall it.
        drain = threading.Thread(target=proc.stderr.read, daemon=True)
        drain.start()
        async with aiohttp.ClientSession() as http, http.ws_connect(url, max_msg_size=0) as ws:
            await ws.send_json(
                {"id": 1, "method": "Target.createTarget", "params": {"url": "about:blank"}}
            )
            target = await _answer(ws, 1)
            await ws.send_json(
                {
                    "id": 2,
                    "method": "Target.attachToTarget",
                    "params": {"targetId": target["targetId"], "flatten": True},
                }
            )
            session = (await _answer(ws, 2))["sessionId"]
            page = Page(ws, session)
            for domain in ("Page", "Runtime", "Log"):
                await page.send(f"{domain}.enable")
            try:
                yield page
            finally:
                await page.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if drain is not None:
            drain.join(10)
        if proc.stderr is not None:
            proc.stderr.close()
        shutil.rmtree(profile, ignore_errors=True)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _launch(binary: str, profile: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _devtools_url(stderr: Any) -> str:
    for line in stderr:
        found = re.search(r"DevTools listening on (ws://\S+)", line)
        if found:
            return found.group(1)
    raise RuntimeError("chromium exited without a DevTools address")


async def _answer(ws: aiohttp.ClientWebSocketResponse, ident: int) -> dict[str, Any]:
    async for msg in ws:
        data = json.loads(msg.data)
        if data.get("id") == ident:
            if "error" in data:
                raise RuntimeError(data["error"])
            return dict(data["result"])
    raise RuntimeError("the DevTools connection closed")
