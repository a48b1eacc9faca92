"""Stopping a real sidecar process: SIGHUP drains like SIGTERM; a cut-off run keeps its times."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from sidecar.core.clock import parse_rfc3339
from tests.support import (
    NatsServer,
    RecordingApp,
    Request,
    Sidecar,
    run_cli,
    sidecars,
    wait_for,
    write_config,
)


def slow_config(nats: NatsServer, app: RecordingApp, grace: str) -> dict[str, Any]:
    return {
        "instance_id": "only",
        "nats": {"servers": [nats.url]},
        "target": {"url": app.url, "timeout": "120s"},
        "shutdown_grace": grace,
        "jobs": [{"name": "slow", "schedule": "* * * * * *", "jitter": "0s", "max_late": "5s"}],
    }


def history_of(tmp_path: Path, cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    path = write_config(tmp_path / "reader.yaml", cfg | {"instance_id": "reader"})
    res = run_cli("history", "slow", "-c", str(path), "--json", "--limit", "1000")
    assert res.returncode == 0, res.stderr
    return {run["token"]: run for run in map(json.loads, res.stdout.splitlines())}


def first_request(app: RecordingApp) -> Request:
    requests: list[Request] = wait_for(lambda: app.requests_for("/jobs/slow"), 15, what="a trigger")
    return requests[0]


def stop_with(proc: Sidecar, sig: signal.Signals, timeout: float = 60) -> int:
    assert proc.proc is not None
    proc.proc.send_signal(sig)
    return proc.proc.wait(timeout)


def test_sighup_drains_like_sigterm(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.delay["/jobs/slow"] = 3.0
    cfg = slow_config(nats_server, http_app, "20s")
    with sidecars(tmp_path, [("only", cfg, {})]) as (proc,):
        first = first_request(http_app)
        assert first.finished == 0.0  # still running at the app
        code = stop_with(proc, signal.SIGHUP)
    assert code == 0, proc.log()
    assert first.finished > 0.0, "the app's answer was awaited"
    runs = history_of(tmp_path, cfg)
    run = runs[first.headers["X-Anarchon-Run-Id"]]
    assert (run["status"], run["http_status"]) == ("succeeded", 200), run
    assert all(r["status"] != "running" for r in runs.values()), runs
    log = proc.log()
    assert "SIGHUP received" in log and "draining running triggers" in log and "stopped" in log


def test_a_run_cut_off_at_shutdown_keeps_its_start_and_duration(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.delay["/jobs/slow"] = 120.0  # hangs far beyond the grace period
    grace = 2.0
    cfg = slow_config(nats_server, http_app, "2s")
    with sidecars(tmp_path, [("only", cfg, {})]) as (proc,):
        first = first_request(http_app)
        signalled_at = time.time()
        code = stop_with(proc, signal.SIGTERM)
        stopped_at = time.time()
    assert code == 0, proc.log()
    run = history_of(tmp_path, cfg)[first.headers["X-Anarchon-Run-Id"]]
    assert run["status"] == "failed" and "interrupted" in run["error"], run
    started = parse_rfc3339(run["started_at"])
    finished = parse_rfc3339(run["finished_at"])
    # It started when the request went out (just before the app saw it), not at the cut.
    assert first.at - 1.0 <= started <= first.at + 0.01, (started, first.at)
    # It ran until the drain gave up: the grace period after the signal.
    assert signalled_at + grace - 0.5 <= finished <= stopped_at, (finished, signalled_at)
    assert abs(run["duration_ms"] - (finished - started) * 1000) <= 2, run
    assert run["duration_ms"] >= grace * 1000, run


def test_with_nats_gone_a_stopping_sidecar_gives_up_recording_within_its_grace(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """What Ctrl-C on a terminal used to do to the demo: NATS exits with the sidecar, a run
    in flight. The sidecar may not record that run, but it exits within its grace."""
    http_app.delay["/jobs/slow"] = 1.0
    grace = 4.0
    cfg = slow_config(nats_server, http_app, "4s")
    with sidecars(tmp_path, [("only", cfg, {})]) as (proc,):
        first_request(http_app)
        nats_server.kill()
        signalled_at = time.monotonic()
        code = stop_with(proc, signal.SIGTERM, timeout=60)
        took = time.monotonic() - signalled_at
    assert code == 0, proc.log()
    # The grace counts from the signal; closing takes a moment more, never the minute.
    assert took < grace + 2, (took, proc.log())
    assert "stopped" in proc.log()
