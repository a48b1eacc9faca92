"""A real HTTP receiver for pings, webhooks and OTLP spans: records what it gets.

A stdlib ``ThreadingHTTPServer`` on a free loopback port. Every POST is kept
with its path, query, headers and body (and the request target as sent);
``status[path]`` sets the answer (default 200), ``fail_first[path]`` answers
500 that many times first.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Received:
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    at: float
    target: str = ""  # the request target as it came on the wire (path and raw query)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


class Receiver:
    def __init__(self) -> None:
        self.got: list[Received] = []
        self.status: dict[str, int] = {}
        self.fail_first: dict[str, int] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                parts = urlsplit(self.path)
                rec = Received(
                    parts.path,
                    parse_qs(parts.query),
                    dict(self.headers),
                    body,
                    time.time(),
                    self.path,
                )
                with receiver.lock:
                    receiver.got.append(rec)
                    left = receiver.fail_first.get(parts.path, 0)
                    if left:
                        receiver.fail_first[parts.path] = left - 1
                        status = 500
                    else:
                        status = receiver.status.get(parts.path, 200)
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def received(self, prefix: str = "") -> list[Received]:
        with self.lock:
            return [r for r in self.got if r.path.startswith(prefix)]


def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    try:
        yield r
    finally:
        r.stop()
