"""Whole sidecar processes against a real nats-server and real apps."""

from __future__ import annotations

import asyncio
import gc
import http.server
import re
import signal
import socketserver
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli.daemon import STOP_SIGNALS, Daemon, collector_off
from sidecar.cli.settle import QUIET, YOUNG
from sidecar.config.load import Secrets, parse_config
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    free_port,
    read_stream,
    run_cli,
    sidecars,
    until,
    wait_for,
    write_config,
)


def job(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "schedule": "* * * * * *", "jitter": "300ms", "max_late": "5s", **extra}


def base_config(nats: NatsServer, app: RecordingApp, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nats": {"servers": [nats.url], "history_size": 1000},
        "target": {"url": app.url, "timeout": "10s"},
        "jobs": jobs,
    }


def slots_of(app: RecordingApp, path: str) -> list[int]:
    return [int(r.headers["X-Anarchon-Slot"]) for r in app.requests_for(path)]


def test_five_sidecars_run_every_slot_exactly_once(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, unix_app: RecordingApp
) -> None:
    jobs = [job("alpha"), job("beta"), job("gamma", request={"url": unix_app.url})]
    config = base_config(nats_server, http_app, jobs)
    zones = ["UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "Pacific/Apia"]
    procs = [(f"s{i}", config, {"TZ": tz}) for i, tz in enumerate(zones)]
    with sidecars(tmp_path, procs) as running:
        start_ms = (int(time.time()) + 1) * 1000  # all five are ready by now
        # Ten slots after all five were up (the first ones up ran slots before:
        # under load, a handful, and counting those left a window of 5 s).
        wait_for(
            lambda: len([s for s in slots_of(unix_app, "/jobs/gamma") if s >= start_ms]) >= 10,
            40,
            what="10 slots",
        )
        end_ms = int(time.time() - 1) * 1000
        codes = [p.terminate() for p in running]
    assert codes == [0] * 5
    window = range(start_ms, end_ms + 1, 1000)
    assert len(window) >= 8
    for app, path in [
        (http_app, "/jobs/alpha"),
        (http_app, "/jobs/beta"),
        (unix_app, "/jobs/gamma"),
    ]:
        seen = Counter(slots_of(app, path))
        doubles = {s: n for s, n in seen.items() if n > 1}
        assert not doubles, f"{path} ran twice: {doubles}"
        missing = [s for s in window if s not in seen]
        assert not missing, f"{path} missed slots {missing}"
        # every request carries the run's identity
        for r in app.requests_for(path):
            assert r.headers["X-Anarchon-Job"] == path.rsplit("/", 1)[1]
            assert len(r.headers["X-Anarchon-Run-Id"]) == 32
            assert r.headers["X-Anarchon-Scheduled-At"].endswith("Z")

    stored = read_stream(nats_server.url)
    claims = [m for m in stored if m.subject.endswith(".claims")]
    results = [m for m in stored if m.subject.endswith(".results")]
    for m in claims:
        assert m.subject == f"cron.{m.data['job']}.claims"
        assert m.headers["Nats-Msg-Id"] == f"{m.data['job']}:{m.data['slot']}"
        assert m.data["manual"] is False
        assert {"token", "instance", "scheduled_at", "claimed_at"} <= m.data.keys()
    ids = Counter(m.headers["Nats-Msg-Id"] for m in claims)
    assert max(ids.values()) == 1
    by_token = {m.data["token"]: m for m in claims}
    for m in results:
        assert m.subject == f"cron.{m.data['job']}.results"
        claim = by_token[m.data["token"]]
        assert (claim.data["slot"], claim.data["instance"]) == (m.data["slot"], m.data["instance"])
        assert m.data["status"] == "succeeded" and m.data["http_status"] == 200
    # each app request belongs to exactly one stored claim with the same token
    tokens = [r.headers["X-Anarchon-Run-Id"] for r in http_app.requests + unix_app.requests]
    assert len(tokens) == len(set(tokens))
    assert set(tokens) <= by_token.keys()
    # several instances won (the race is real, not one process doing it all)
    assert len({m.data["instance"] for m in claims}) >= 2


def test_skewed_clocks_compete_for_the_same_slots(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base_config(nats_server, http_app, [job("tick", jitter="0s")])
    procs = [
        ("early", config, {"ANARCHON_CLOCK_OFFSET": "1.5"}),
        ("exact", config, {}),
        ("late", config, {"ANARCHON_CLOCK_OFFSET": "-1.5"}),
    ]
    with sidecars(tmp_path, procs) as running:
        start_ms = (int(time.time()) + 3) * 1000
        wait_for(lambda: len(slots_of(http_app, "/jobs/tick")) >= 8, 30, what="8 slots")
        end_ms = int(time.time() - 3) * 1000

        def count(p: Sidecar, what: str) -> float:
            return p.metric(f"anarchon_claims_{what}_total", {"job": "tick"}) or 0

        # The instance 1.5 s behind still claims the same slots (and loses them);
        # the one 1.5 s ahead wins them; the exact one loses too.
        wait_for(
            lambda: (
                count(running[2], "lost") >= 5
                and count(running[0], "won") >= 5
                and count(running[1], "lost") >= 5
            ),
            15,
            what="claims by all three",
        )
        for p in running:
            assert p.terminate() == 0
    seen = Counter(slots_of(http_app, "/jobs/tick"))
    assert max(seen.values()) == 1, "a slot ran twice"
    assert all(s in seen for s in range(start_ms, end_ms + 1, 1000))


def test_sigterm_lets_a_running_trigger_finish_and_records_it(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.delay["/jobs/slow"] = 3.0
    config = base_config(nats_server, http_app, [job("slow", jitter="0s")])
    config["shutdown_grace"] = "20s"
    with sidecars(tmp_path, [("only", config, {})]) as (proc,):
        first = wait_for(lambda: http_app.requests_for("/jobs/slow"), 15, what="a trigger")[0]
        assert first.finished == 0.0  # still running at the app
        stopped_at = time.monotonic()
        code = proc.terminate(30)
        took = time.monotonic() - stopped_at
    assert code == 0
    assert 1.0 < took < 20, took
    token = first.headers["X-Anarchon-Run-Id"]
    results = [m for m in read_stream(nats_server.url) if m.subject == "cron.slow.results"]
    mine = [m.data for m in results if m.data["token"] == token]
    assert mine and mine[0]["status"] == "succeeded" and mine[0]["http_status"] == 200
    # nothing was claimed after SIGTERM: every stored claim has a result
    claims = [m for m in read_stream(nats_server.url) if m.subject == "cron.slow.claims"]
    assert {c.data["token"] for c in claims} == {r.data["token"] for r in results}
    assert "stopped" in proc.log()


def test_unreachable_nats_at_start_exits_3_with_one_line(tmp_path: Path) -> None:
    cfg = {
        "nats": {"servers": ["nats://127.0.0.1:1"], "connect_timeout": "1s"},
        "metrics": {"listen": "127.0.0.1:0"},
        "jobs": [job("x")],
    }
    path = write_config(tmp_path / "c.yaml", cfg)
    res = run_cli("run", "-c", str(path))
    assert res.returncode == 3, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("anarchon-sidecar: cannot connect to NATS at nats://127.0.0.1:1")
    assert "Traceback" not in res.stderr
    assert "WARNING" not in res.stderr  # no line per connect attempt before the reason
    # A one-shot command logs nothing else: the reason is its only line.
    res = run_cli("stream", "-c", str(path))
    assert res.returncode == 3, res.stderr
    assert res.stderr.startswith("anarchon-sidecar: cannot connect to NATS")
    assert res.stderr.count("\n") == 1, res.stderr


def test_nats_down_is_one_warning_and_a_count_not_a_line_per_second(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base_config(nats_server, http_app, [job("tick")])
    with sidecars(tmp_path, [("one", config, {})]) as (proc,):
        nats_server.stop()
        wait_for(lambda: proc.get("/readyz")[0] == 503, 10, what="not ready")
        # The outage itself: the client tries to reconnect every second meanwhile.
        time.sleep(5)
        nats_server.start()
        proc.wait_ready(20)
        assert proc.terminate() == 0
    warnings = [
        line for line in proc.log().splitlines() if "sidecar.store.connection: nats: " in line
    ]
    # Each distinct reason (the EOF of the drop, then a refused connect every
    # second) at once; its repeats counted in one line when NATS is back.
    refused = [line for line in warnings if "ConnectionRefusedError" in line]
    assert len(warnings) <= 3, warnings
    assert len(refused) == 2, warnings
    assert re.search(r"\(and \d+ more times? in \d+s\)$", refused[1]), warnings


def test_readyz_follows_nats(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base_config(nats_server, http_app, [job("tick")])
    with sidecars(tmp_path, [("one", config, {})]) as (proc,):
        assert proc.get("/healthz")[0] == 200
        assert proc.metric("anarchon_nats_connected") == 1
        nats_server.stop()
        wait_for(lambda: proc.get("/readyz")[0] == 503, 10, what="not ready")
        assert "NATS" in proc.get("/readyz")[1]
        # /metrics may be up to a second old (rendered at most once a second).
        wait_for(lambda: proc.metric("anarchon_nats_connected") == 0, 5, what="gauge at 0")
        assert proc.get("/healthz")[0] == 200
        nats_server.start()
        proc.wait_ready(20)
        assert (proc.metric("anarchon_nats_reconnects_total") or 0) >= 1
        assert proc.terminate() == 0


async def test_the_collector_is_off_until_ready_then_on_with_the_start_frozen(
    nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """`run` turns the collector off while it starts; once ready, the daemon collects,
    freezes what start-up made and turns it on again (the time to ready with 1,000
    jobs, docs/PERFORMANCE.md)."""
    raw = base_config(nats_server, http_app, [job("yearly", schedule="0 0 1 1 *")])
    raw["metrics"] = {"listen": f"127.0.0.1:{free_port()}"}
    daemon = Daemon(parse_config(raw, {}), Secrets())
    frozen = gc.get_freeze_count()
    threshold = gc.get_threshold()
    with collector_off():  # as `run` does
        task = asyncio.create_task(daemon.run())
        await asyncio.sleep(0)
        assert daemon.not_ready() is not None and not gc.isenabled()
        await until(lambda: daemon.not_ready() is None, 20)
        await until(gc.isenabled, 5)
        assert gc.get_freeze_count() > frozen
        # On with a young generation of YOUNG, the later jobs' settling armed, the
        # sidecar idle (a yearly job: no slot due, handled or run) (cli/settle.py).
        assert gc.get_threshold() == (YOUNG, *threshold[1:])
        assert daemon.settler.armed and not daemon._busy_within(QUIET)
        daemon.stopping.set()
        assert await asyncio.wait_for(task, 30) == 0
    # collector_off gives the thresholds back: no later test of this worker inherits them.
    assert gc.get_threshold() == threshold and gc.isenabled()
    # Not its process: no stop signal left ignored (every process a later test
    # started in this worker inherited the ignoring, and make then shrugged off Ctrl-C).
    assert [signal.getsignal(sig) for sig in STOP_SIGNALS].count(signal.SIG_IGN) == 0


def test_ready_means_this_sidecar_answers_not_another_process_on_its_port(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """A sidecar that lost its metrics port to another process exits; the harness must
    see that, not take the other process's /readyz for it (100 sidecars starting at
    once in the fleet benchmarks lose free_port()'s race now and then)."""
    with socketserver.TCPServer(("127.0.0.1", 0), AlwaysReady) as other:
        threading.Thread(target=other.serve_forever, daemon=True).start()
        port = other.server_address[1]
        config = {**base_config(nats_server, http_app, [job("alpha")])}
        config["metrics"] = {"listen": f"127.0.0.1:{port}"}
        proc = Sidecar(tmp_path, "taken", config, {})
        assert proc.ready()  # the other process answers on its port
        proc.start()
        try:
            with pytest.raises(AssertionError, match="exited"):
                proc.wait_ready(30)
        finally:
            proc.kill()
            other.shutdown()
    assert "address already in use" in proc.log()


def test_the_harness_moves_a_sidecar_whose_own_port_was_taken(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """A port the harness chose and lost (to another test's connection, on a restart)
    is chosen again; a port the test set is not (the test above)."""
    proc = Sidecar(tmp_path, "moved", base_config(nats_server, http_app, [job("alpha")]), {})
    lost = proc.metrics_port
    with socketserver.TCPServer(("127.0.0.1", lost), AlwaysReady) as other:
        threading.Thread(target=other.serve_forever, daemon=True).start()
        proc.start()
        try:
            proc.wait_ready(30)
            assert proc.metrics_port != lost
            assert f":{lost} (metrics.listen): address already in use" in proc.log()
            assert proc.get("/healthz")[0] == 200
        finally:
            proc.kill()
            other.shutdown()


class AlwaysReady(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ready\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass
