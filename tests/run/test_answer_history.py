"""The app's answer in history (docs/TRIGGER.md): three real sidecars on a real
nats-server call a real HTTP app that answers with long bodies.

- a 32 MiB text answer: history shows its first ``answer.bytes`` bytes and its
  content type, once per slot, and no sidecar's peak memory grows with it
  (the body is discarded as it arrives, never held);
- a failure told in 64 MiB: the run's error and excerpt are the app's own
  words (on the page too, escaped), with the request's Authorization (which
  the app echoes) redacted, and the sidecar stopped reading (the app could
  not send it all);
- a binary answer: base64, marked so; a timed-out run: no answer at all.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.admin.test_page import request
from tests.support import NatsServer, Sidecar, cli_config, job, run_cli, sidecars, wait_for

MIB = 1 << 20
BIG = 32 * MIB  # a successful run's answer
HUGE = 64 * MIB  # a failed run's answer: more than any socket buffers hold
CHUNK = 64 * 1024
TOKEN = "Bearer hunter2-very-secret"
FAILURE = "database is locked: <the nightly import> still holds it\nretry later\n"
BINARY = bytes(range(256))


class AnswerApp:
    """Answers each job's path as the module doc says; counts what it could send."""

    def __init__(self) -> None:
        self.big = False  # /jobs/big answers BIG bytes once set (small before)
        self.lock = threading.Lock()
        self.slots: Counter[tuple[str, str]] = Counter()
        self.big_sent = 0  # BIG answers sent whole
        self.fail_cut = 0  # failure answers the sidecar stopped reading
        self.fail_whole = 0  # failure answers sent whole (the sidecar read them all)
        app = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with app.lock:
                    app.slots[(self.path, self.headers["X-Anarchon-Slot"])] += 1
                if self.path == "/jobs/big":
                    self.big_answer()
                elif self.path == "/jobs/fail":
                    self.fail_answer()
                elif self.path == "/jobs/bin":
                    self.answer(200, "application/octet-stream", BINARY)
                elif self.path == "/jobs/slow":
                    time.sleep(1.5)  # past the job's timeout: no answer
                    self.answer(200, "text/plain", b"too late")

            def answer(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def big_answer(self) -> None:
                if not app.big:
                    self.answer(200, "text/plain; charset=utf-8", b"warming up\n")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(BIG))
                self.end_headers()
                line = b"0123456789abcdef" * 4 + b"\n"
                chunk = line * (CHUNK // len(line)) + b"x" * (CHUNK % len(line))
                for _ in range(BIG // CHUNK):
                    self.wfile.write(chunk)
                with app.lock:
                    app.big_sent += 1

            def fail_answer(self) -> None:
                start = (FAILURE + f"you sent: {self.headers['Authorization']}\n").encode()
                self.send_response(500)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(HUGE))
                self.end_headers()
                try:
                    self.wfile.write(start)
                    left = HUGE - len(start)
                    while left > 0:
                        self.wfile.write(b"z" * min(CHUNK, left))
                        left -= CHUNK
                except OSError:  # reset: the sidecar stopped reading and closed
                    with app.lock:
                        app.fail_cut += 1
                    return
                with app.lock:
                    app.fail_whole += 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def answer_app() -> Iterator[AnswerApp]:
    app = AnswerApp()
    app.thread.start()
    try:
        yield app
    finally:
        app.server.shutdown()
        app.server.server_close()


def peak_rss(proc: Sidecar) -> int:
    """The process's peak resident memory (VmHWM), bytes."""
    assert proc.proc is not None
    status = Path(f"/proc/{proc.proc.pid}/status").read_text()
    (line,) = [x for x in status.splitlines() if x.startswith("VmHWM:")]
    return int(line.split()[1]) * 1024


def history(tmp_path: Path, config: dict[str, Any], name: str, *args: str) -> Any:
    out = run_cli("history", name, "-c", cli_config(tmp_path, config), "--limit", "500", *args)
    assert out.returncode == 0, out
    assert "Traceback" not in out.stderr
    return out


def runs_of(tmp_path: Path, config: dict[str, Any], name: str) -> list[dict[str, Any]]:
    out = history(tmp_path, config, name, "--json")
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_history_keeps_the_start_of_the_apps_answer(
    tmp_path: Path, nats_server: NatsServer, answer_app: AnswerApp
) -> None:
    config = {
        "nats": {"servers": [nats_server.url]},
        "target": {"url": answer_app.url, "timeout": "20s"},
        "jobs": [
            job("big", schedule="*/2 * * * * *", answer={"bytes": 1000}),
            job(
                "fail",
                schedule="*/2 * * * * *",
                request={"headers": {"Authorization": TOKEN, "X-Env": "prod"}},
                answer={"redact": ["authorization"]},
            ),
            job("bin", schedule="*/2 * * * * *"),
            job("slow", schedule="*/3 * * * * *", request={"timeout": "500ms"}),
        ],
    }

    def finished(name: str, count: int) -> bool:
        runs = runs_of(tmp_path, config, name)
        return sum(r["status"] not in ("running", "skipped") for r in runs) >= count

    with sidecars(tmp_path, [(f"web-{i}", config, {}) for i in range(1, 4)]) as procs:
        wait_for(lambda: finished("big", 2), 40, what="two small answers of big")
        before = [peak_rss(p) for p in procs]
        answer_app.big = True
        wait_for(lambda: answer_app.big_sent >= 6, 90, 0.2, what="six 32 MiB answers")
        after = [peak_rss(p) for p in procs]
        wait_for(lambda: finished("big", 8), 30, what="the big answers recorded")
        wait_for(lambda: finished("fail", 3) and finished("slow", 2), 30, what="fail and slow")
        wait_for(lambda: finished("bin", 2), 30, what="binary answers")
        # The page shows the answer on the run, escaped; the API carries it.
        code, _, page = request(procs[0], "/jobs/fail")
        assert code == 200
        assert b"answer (text/plain, cut)</summary><pre>database is locked: &lt;the" in page
        assert b"<the nightly" not in page and b"hunter2" not in page
        api = json.loads(request(procs[1], "/api/v1/jobs/fail/runs")[2])
        assert any(FAILURE in (r.get("answer") or "") for r in api["runs"]), api

    # Memory did not grow with the answers (each sidecar ran some of the six).
    grown = [a - b for a, b in zip(after, before, strict=True)]
    assert all(g < 16 * MIB for g in grown), grown

    # Each slot once: the app saw each once, history lists each once.
    assert all(n == 1 for n in answer_app.slots.values()), answer_app.slots
    for name in ("big", "fail", "bin", "slow"):
        runs = runs_of(tmp_path, config, name)
        slots = Counter(r["slot"] for r in runs)
        assert all(n == 1 for n in slots.values()), (name, slots)

    big = [r for r in runs_of(tmp_path, config, "big") if r["status"] == "succeeded"]
    long = [r for r in big if r["answer_cut"]]
    assert len(long) >= 5, big
    line = "0123456789abcdef" * 4 + "\n"
    for r in long:
        assert r["answer"] == (line * 16)[:1000]
        assert r["answer_type"] == "text/plain; charset=utf-8"
        assert r["answer_base64"] is False
    small = [r for r in big if not r["answer_cut"]]
    assert small and all(r["answer"] == "warming up\n" for r in small)

    fail = [r for r in runs_of(tmp_path, config, "fail") if r["http_status"] == 500]
    assert len(fail) >= 3
    for r in fail:
        # Why it failed, in the app's own words; its credentials not stored.
        assert r["error"].startswith("HTTP 500: database is locked: <the nightly import>"), r
        assert r["answer"].startswith(FAILURE + "you sent: [redacted]\nzzz"), r
        assert len(r["answer"].encode()) == 512 and r["answer_cut"] is True
        assert r["answer_type"] == "text/plain"
    # The sidecar stopped reading each failure answer after its start.
    assert answer_app.fail_whole == 0 and answer_app.fail_cut >= 3

    binary = [r for r in runs_of(tmp_path, config, "bin") if r["status"] == "succeeded"]
    for r in binary:
        assert r["answer_base64"] is True and r["answer_type"] == "application/octet-stream"
        assert base64.b64decode(r["answer"]) == BINARY
        assert r["answer_cut"] is False

    slow = [r for r in runs_of(tmp_path, config, "slow") if r["status"] == "failed"]
    assert any("no answer within" in r["error"] for r in slow), slow
    assert all(r["answer"] is None and r["answer_type"] is None for r in slow)

    # history --output: the same, escaped, under each run.
    out = history(tmp_path, config, "fail", "--output").stdout
    assert "answer (text/plain, first 512 bytes):" in out
    assert "    | database is locked: <the nightly import> still holds it\n    | retry later" in out
    assert "you sent: [redacted]" in out
    out = history(tmp_path, config, "bin", "--output").stdout
    assert "answer (application/octet-stream, 256 bytes, binary, base64):" in out
    assert "\x00" not in out
    text = history(tmp_path, config, "big", "--output").stdout
    assert "answer (text/plain; charset=utf-8, first 1000 bytes):" in text
    for name in ("big", "fail", "bin", "slow"):
        assert TOKEN not in history(tmp_path, config, name, "--json").stdout
        assert TOKEN not in history(tmp_path, config, name, "--output").stdout
    for p in procs:
        assert "hunter2" not in p.log()

    # last-run and status say why the newest failure failed, in the app's words.
    last = run_cli("last-run", "fail", "-c", cli_config(tmp_path, config))
    assert "HTTP 500: database is locked" in last.stdout, last
    status = run_cli("status", "-c", cli_config(tmp_path, config))
    assert "fail: last run failed: HTTP 500: database is locked: <the nightly" in status.stdout
