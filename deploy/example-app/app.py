"""A tiny example app for anarchon-sidecar: it records every trigger it gets.

Standard library only, so its image needs nothing but Python. Any request to a
path other than the ones below counts as a trigger: it is logged as one JSON
line on stdout with its `X-Anarchon-*` headers and kept in memory.

    GET /runs      every trigger received, oldest first, as a JSON list
    GET /healthz   200 "ok"

Settings (environment): `PORT` (default 8080), `HOST` (default 0.0.0.0),
`APP_NAME` (default: the host name; recorded with each trigger so a test can
tell which replica ran a job), `SIGNING_SECRET_FILE` (optional: the sidecar's
`target.signing_secret_file`; each trigger's v2 signature is then checked with
anarchon_verify.py, a copy of docs/signing/verify.py, and recorded as `valid`
or `invalid: <reason>`; an invalid one, a replay included, is answered with
401), `SIGNING_SECRET_NEXT_FILE` (optional, during a rotation: the next
secret, accepted as well; ignored while the file does not exist).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from anarchon_verify import SignatureError, Verifier

HEADERS = {
    "job": "X-Anarchon-Job",
    "slot": "X-Anarchon-Slot",
    "run_id": "X-Anarchon-Run-Id",
    "scheduled_at": "X-Anarchon-Scheduled-At",
}
SIGNATURE_WINDOW = 300  # seconds between the signature's t= and now

RUNS: list[dict[str, Any]] = []
RUNS_LOCK = threading.Lock()


def signature_state(
    verifier: Verifier | None, method: str, target: str, headers: Any, body: bytes
) -> str | None:
    """`valid`, `invalid: <reason>`, or None when no secret is configured."""
    if verifier is None:
        return None
    try:
        verifier.verify(method, target, headers.items(), body)
    except SignatureError as exc:
        return f"invalid: {exc.reason}"
    return "valid"


def read_secret(path: str) -> bytes:
    """A secret file as the sidecar reads it: without one trailing newline."""
    with open(path, "rb") as fh:
        raw = fh.read()
    return raw[:-2] if raw.endswith(b"\r\n") else raw.removesuffix(b"\n")


class Handler(BaseHTTPRequestHandler):
    server_version = "anarchon-example-app/1"
    app_name = socket.gethostname()
    verifier: Verifier | None = None

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._reply(200, b"ok\n", "text/plain")
        elif self.path == "/runs":
            with RUNS_LOCK:
                body = json.dumps(RUNS).encode()
            self._reply(200, body, "application/json")
        else:
            self._trigger()

    def do_POST(self) -> None:
        self._trigger()

    do_PUT = do_POST
    do_PATCH = do_POST
    do_DELETE = do_POST

    def _trigger(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        run: dict[str, Any] = {key: self.headers.get(name) for key, name in HEADERS.items()}
        run.update(
            app=self.app_name,
            method=self.command,
            path=self.path,
            received_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        )
        state = signature_state(self.verifier, self.command, self.path, self.headers, body)
        if state is not None:
            run["signature"] = state
        with RUNS_LOCK:
            RUNS.append(run)
        print(json.dumps({"event": "trigger", **run}), flush=True)
        if state is not None and state != "valid":
            self._reply(401, b"bad signature\n", "text/plain")
        else:
            self._reply(200, json.dumps({"ok": True}).encode(), "application/json")

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # triggers are logged as JSON above; the rest is noise


def main() -> None:
    host = os.environ.get("HOST", "0.0.0.0")
    port = int(os.environ.get("PORT", "8080"))
    Handler.app_name = os.environ.get("APP_NAME") or socket.gethostname()
    secret_file = os.environ.get("SIGNING_SECRET_FILE")
    if secret_file:
        secrets = [read_secret(secret_file)]
        next_file = os.environ.get("SIGNING_SECRET_NEXT_FILE")
        if next_file and os.path.exists(next_file):
            secrets.append(read_secret(next_file))
        Handler.verifier = Verifier(secrets, SIGNATURE_WINDOW)
    server = ThreadingHTTPServer((host, port), Handler)

    # As PID 1 in a container, a process without a SIGTERM handler is not
    # stopped by SIGTERM at all (the kernel drops it), so handle it here.
    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps({"event": "listening", "host": host, "port": port}), flush=True)
    server.serve_forever()
    server.server_close()
    print(json.dumps({"event": "stopped"}), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
