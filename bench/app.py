"""A small, fast HTTP app in a process of its own that notes when each trigger arrives.

``python -m bench.app PORT``. Every request is answered ``200 ok`` and the
connection closed; the arrival time is taken when the request's first bytes
are read from the socket, before any parsing, so the start delay measured
with it is the sidecar's and the network's, not the app framework's.
``GET /__records`` returns (and forgets) ``[path, slot, arrival]`` for every
trigger so far; ``GET /__instances`` the triggers counted by the sidecar that
sent them (``X-Anarchon-Instance``), since the start. Loopback only.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from collections import Counter
from typing import Any

Record = tuple[str, int, float]


class AppProtocol(asyncio.Protocol):
    def __init__(self, records: list[Record], instances: Counter[str]) -> None:
        self.records = records
        self.instances = instances
        self.buf = b""
        self.at = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.buf:
            self.at = time.time()
        self.buf += data
        head, sep, body = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if len(body) < int(headers.get("content-length", "0")):
            return
        path = lines[0].split(" ")[1]
        if path == "/__records":
            payload = json.dumps(self.records).encode()
            self.records.clear()
        elif path == "/__instances":
            payload = json.dumps(self.instances).encode()
        else:
            self.records.append((path, int(headers.get("x-anarchon-slot", "0")), self.at))
            self.instances[headers.get("x-anarchon-instance", "")] += 1
            payload = b"ok"
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
        )
        self.transport.close()


async def serve(port: int) -> None:
    records: list[Record] = []
    instances: Counter[str] = Counter()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: AppProtocol(records, instances), "127.0.0.1", port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def _get_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def fetch_records(port: int) -> list[Record]:
    data: list[Any] = _get_json(port, "/__records")
    return [(str(p), int(s), float(a)) for p, s, a in data]


def fetch_instances(port: int) -> dict[str, int]:
    """The triggers so far, counted by the sidecar that sent them."""
    data: dict[str, int] = _get_json(port, "/__instances")
    return data


def main() -> None:
    asyncio.run(serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()
