"""The `figures` fixture: print one RELIABILITY line per scenario and record it.

Every record goes to ``bench/results/reliability.json`` (gitignored) with the
scenario's outcome, how long it took and what it ran on; the lines are also
repeated in pytest's terminal summary so that they show without ``-s``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import subprocess
import time
from collections.abc import Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, NatsCluster, nats_server_binary

RESULTS = ROOT / "bench" / "results" / "reliability.json"
# The file keeps this many records, newest last.
KEEP = 1000

_lines: list[str] = []


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, dict):
        return ",".join(f"{k}:{_fmt(v)}" for k, v in value.items()) or "-"
    return str(value)


def _environment() -> dict[str, Any]:
    try:
        version = subprocess.run(
            [nats_server_binary(), "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, RuntimeError, subprocess.SubprocessError):
        version = "unknown"
    return {
        "nats_server": version.removeprefix("nats-server: "),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / (path.name + ".lock")).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def append_records(records: list[dict[str, Any]], path: Path = RESULTS) -> None:
    with _locked(path):
        try:
            existing = json.loads(path.read_text())
        except (OSError, ValueError):
            existing = []
        if not isinstance(existing, list):
            existing = []
        path.write_text(json.dumps((existing + records)[-KEEP:], indent=1) + "\n")


class Figures:
    """What one scenario measured; `report` prints the line and keeps the record."""

    def __init__(self, test: str, slow: bool) -> None:
        self.test = test
        self.slow = slow
        self.records: list[dict[str, Any]] = []

    def report(self, scenario: str, **figures: Any) -> None:
        line = f"RELIABILITY {scenario}: " + " ".join(f"{k}={_fmt(v)}" for k, v in figures.items())
        print(line, flush=True)
        _lines.append(line)
        self.records.append({"scenario": scenario, "figures": figures})


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    setattr(item, f"reliability_{report.when}", report)
    return report


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    """Record the scenario's figures with its outcome once the test has finished."""
    slow = request.node.get_closest_marker("slow") is not None
    recorder = Figures(request.node.nodeid, slow)
    started = time.monotonic()
    yield recorder
    call = getattr(request.node, "reliability_call", None)
    outcome = call.outcome if call is not None else "error"
    env = _environment()
    finished = datetime.now(UTC).isoformat(timespec="seconds")
    append_records(
        [
            {
                **record,
                "test": recorder.test,
                "slow": slow,
                "outcome": outcome,
                "duration_s": round(time.monotonic() - started, 1),
                "finished_at": finished,
                **env,
            }
            for record in recorder.records
        ]
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _lines:
        terminalreporter.section("reliability figures")
        for line in _lines:
            terminalreporter.write_line(line)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """A 3-node JetStream cluster on loopback, stopped at the end."""
    nodes = NatsCluster(tmp_path / "cluster")
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()
