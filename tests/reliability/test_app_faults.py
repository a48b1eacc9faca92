"""The app misbehaves: 500s, timeouts, refused connections, slow runs at SIGTERM.

A request that reached the app is never resent (one request per slot
whatever the answer); one that never reached it is retried until max_late
runs out, so the app coming back mid-way still gets each slot once; runs in
flight at SIGTERM are drained and recorded, and those still running after the
grace period are recorded as interrupted. An answer of hundreds of MiB is
read and discarded as it streams: the sidecar's memory does not grow with it.
"""

from __future__ import annotations

import signal
import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.conftest import Figures
from tests.reliability.helpers import (
    claims_and_results,
    config,
    every_second,
    metric_sum,
    slot_of,
)
from tests.support import (
    NatsServer,
    RecordingApp,
    free_port,
    read_stream,
    sidecars,
    wait_for,
)

MAX_LATE = 3.0
GRACE = 4.0


def test_app_faults(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    late_port = free_port()
    http_app.status["/jobs/fail500"] = 500
    http_app.delay["/jobs/timeout"] = 1.0
    http_app.delay["/jobs/slow"] = 2.0
    http_app.delay["/jobs/stuck"] = 60.0
    jobs = [
        every_second("fail500", jitter="0s"),
        every_second("timeout", jitter="0s", request={"timeout": "300ms"}),
        every_second(
            "refused",
            jitter="0s",
            max_late=f"{MAX_LATE:g}s",
            request={"url": f"http://127.0.0.1:{late_port}"},
        ),
        every_second("slow", jitter="0s"),
        every_second("stuck", jitter="0s", request={"timeout": "120s"}),
    ]
    cfg = {**config([nats_server.url], http_app, jobs), "shutdown_grace": f"{GRACE:g}s"}
    late_app = RecordingApp(port=late_port)
    try:
        with sidecars(tmp_path, [("s1", cfg, {}), ("s2", cfg, {})]) as running:
            wait_for(
                lambda: (
                    metric_sum(
                        running, "anarchon_runs_total", {"job": "refused", "status": "failed"}
                    )
                    >= 2
                ),
                20,
                what="refused runs to give up",
            )
            wait_for(
                lambda: all(
                    len(http_app.requests_for(f"/jobs/{j}")) >= 3 for j in ("fail500", "timeout")
                ),
                15,
                what="failing runs",
            )
            late_app.start()
            up_at = time.time()
            wait_for(lambda: len(late_app.requests) >= 3, 15, what="the app back")
            wait_for(
                lambda: any(r.finished == 0.0 for r in http_app.requests_for("/jobs/slow")),
                10,
                what="a slow run in flight",
            )
            in_flight = {
                path: [
                    r.headers["X-Anarchon-Run-Id"]
                    for r in http_app.requests_for(path)
                    if r.finished == 0.0
                ]
                for path in ("/jobs/slow", "/jobs/stuck")
            }
            stop_at = time.monotonic()
            for p in running:  # both at once: each drains on its own
                assert p.proc is not None
                p.proc.send_signal(signal.SIGTERM)
            codes = [p.proc.wait(30) for p in running if p.proc is not None]
            drained_in = time.monotonic() - stop_at
    finally:
        late_app.stop()

    claims, results = claims_and_results(read_stream(nats_server.url))
    result_of = {m.data["token"]: m.data for m in results}
    claim_of = {m.data["token"]: m.data for m in claims}
    by_job: dict[str, list[dict[str, object]]] = {}
    for m in results:
        by_job.setdefault(str(m.data["job"]), []).append(m.data)
    requests = http_app.requests + late_app.requests
    per_slot = Counter((r.headers["X-Anarchon-Job"], slot_of(r)) for r in requests)
    refused = by_job["refused"]
    gave_up = [r for r in refused if r["status"] == "failed"]
    delivered_late = [r for r in refused if r["status"] == "succeeded"]
    late_tokens = {r.headers["X-Anarchon-Run-Id"] for r in late_app.requests}
    figures.report(
        "app-faults",
        http500_runs=len(by_job["fail500"]),
        timeout_runs=len(by_job["timeout"]),
        refused_gave_up=len(gave_up),
        refused_delivered=len(delivered_late),
        requests_per_slot_max=max(per_slot.values()),
        drained=sum(result_of[t]["status"] == "succeeded" for t in in_flight["/jobs/slow"]),
        interrupted=sum(
            "interrupted" in str(result_of[t]["error"]) for t in in_flight["/jobs/stuck"]
        ),
        drain_s=round(drained_in, 1),
    )
    assert codes == [0, 0]
    # One request per slot, whatever the app answered.
    assert max(per_slot.values()) == 1, [k for k, n in per_slot.items() if n > 1]
    # Every claim has its result (nothing left "running"), every result its claim.
    assert set(claim_of) == set(result_of)
    for r in by_job["fail500"]:
        assert (r["status"], r["http_status"]) == ("failed", 500), r
    for r in by_job["timeout"]:
        assert r["status"] == "failed" and "no answer within 0.3s" in str(r["error"]), r
    # Refused: given up only after max_late, never reaching the app; or delivered once.
    assert len(gave_up) >= 2 and len(delivered_late) >= 3
    for r in gave_up:
        assert "gave up" in str(r["error"]) and r["http_status"] is None, r
        assert r["token"] not in late_tokens
    for r in delivered_late:
        assert r["token"] in late_tokens, r
    assert all(r.at - slot_of(r) / 1000 <= MAX_LATE + 0.5 for r in late_app.requests)
    # Some refused slots waited for the app and were delivered when it came back.
    assert any(slot_of(r) / 1000 < up_at for r in late_app.requests)
    # SIGTERM: slow runs finished and recorded; stuck ones recorded as interrupted.
    assert in_flight["/jobs/slow"] and in_flight["/jobs/stuck"]
    for token in in_flight["/jobs/slow"]:
        assert result_of[token]["status"] == "succeeded", result_of[token]
    for token in in_flight["/jobs/stuck"]:
        assert result_of[token]["status"] == "failed", result_of[token]
        assert "interrupted" in str(result_of[token]["error"]), result_of[token]
    assert GRACE - 1 < drained_in < GRACE + 5


# --------------------------------------------------------------------------- huge answers

HUGE = 300 * 1024 * 1024
CHUNK = b"z" * (1024 * 1024)


class HugeAnswer(socketserver.BaseRequestHandler):
    """Answers every request with ``200`` and a 300 MiB body, streamed in 1 MiB writes."""

    sent: list[int]

    def handle(self) -> None:
        sock: socket.socket = self.request
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(65536)
            if not data:
                return
            head += data
        sent = 0
        try:
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % HUGE)
            while sent < HUGE:
                sock.sendall(CHUNK)
                sent += len(CHUNK)
        except OSError:
            pass
        self.sent.append(sent)


@pytest.fixture
def huge_app() -> Iterator[tuple[str, list[int]]]:
    sent: list[int] = []
    handler = type("Handler", (HugeAnswer,), {"sent": sent})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", sent
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_huge_answer_streams_through_in_bounded_memory(
    tmp_path: Path,
    nats_server: NatsServer,
    http_app: RecordingApp,
    huge_app: tuple[str, list[int]],
    figures: Figures,
) -> None:
    url, sent = huge_app
    job = {
        "name": "huge",
        "schedule": "*/20 * * * * *",
        "jitter": "0s",
        "max_late": "5s",
        "request": {"url": url, "timeout": "60s"},
    }
    cfg = config([nats_server.url], http_app, [job])
    with sidecars(tmp_path, [("s1", cfg, {})]) as (proc,):
        assert proc.proc is not None
        pid = proc.proc.pid
        ready_rss = _status_kib(pid, "VmRSS")
        wait_for(
            lambda: metric_sum([proc], "anarchon_runs_total", {"job": "huge"}) >= 1,
            60,
            what="the huge run to finish",
        )
        peak = _status_kib(pid, "VmHWM")
        after = _status_kib(pid, "VmRSS")
        code = proc.terminate()
    _, results = claims_and_results(read_stream(nats_server.url))
    figures.report(
        "huge-answer",
        body_mib=HUGE // 2**20,
        ready_rss_mib=round(ready_rss / 1024, 1),
        peak_rss_mib=round(peak / 1024, 1),
        rss_after_mib=round(after / 1024, 1),
        peak_growth_mib=round((peak - ready_rss) / 1024, 1),
    )
    assert code == 0
    assert sent and sent[0] == HUGE  # the whole body went out
    assert results
    for m in results:
        assert (m.data["status"], m.data["http_status"]) == ("succeeded", 200), m.data
    # Before: the body was read whole into memory (peak 644 MiB for 300 MiB).
    assert peak - ready_rss < 24 * 1024, (ready_rss, peak)
