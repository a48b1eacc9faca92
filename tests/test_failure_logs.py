"""A failed test shows the end of each log of the sidecars it started
(tests/conftest.py): in CI nothing else is left to look at."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, Sidecar, log_excerpt

FAILING = """
from pathlib import Path

from tests.support import Sidecar


def test_fails_after_a_sidecar_said_something(tmp_path: Path) -> None:
    proc = Sidecar(tmp_path, "said-1", {"nats": {"servers": ["nats://127.0.0.1:1"]},
                                         "jobs": [{"name": "a", "schedule": "nope"}]}, {})
    proc.start()
    assert proc.proc is not None and proc.proc.wait(60) == 2
    assert False, "the test failed"


def test_passes_after_a_sidecar_said_something(tmp_path: Path) -> None:
    proc = Sidecar(tmp_path, "quiet-1", {"nats": {"servers": ["nats://127.0.0.1:1"]},
                                          "jobs": [{"name": "a", "schedule": "nope"}]}, {})
    proc.start()
    assert proc.proc is not None and proc.proc.wait(60) == 2
"""


def test_a_failed_test_shows_what_its_sidecars_logged(tmp_path: Path) -> None:
    test_file = tmp_path / "test_said.py"
    test_file.write_text(FAILING)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "--rootdir",
            str(tmp_path),
            str(test_file),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    told = [line for line in res.stdout.splitlines() if line.startswith("log ")]
    # The config error that sidecar gave, naming the key; nothing of the passing test.
    assert told and all(line.startswith("log said-1| ") for line in told), res.stdout
    assert any("jobs[0].schedule" in line for line in told), told
    assert "1 failed, 1 passed" in res.stdout, res.stdout


def test_the_excerpt_leaves_out_routine_successes_and_keeps_the_last_lines(
    tmp_path: Path,
) -> None:
    proc = Sidecar(tmp_path, "n-1", {}, {})
    lines = [f"12:00:{i:02d} INFO run job=a slot=x status=succeeded" for i in range(30)]
    lines += [f"12:01:{i:02d} WARNING lease lock.a expired ({i})" for i in range(30)]
    proc.log_path.write_text("\n".join(lines) + "\n")
    told = log_excerpt([proc, proc], lines=5).splitlines()
    assert told == [
        f"log n-1| 12:01:{i:02d} WARNING lease lock.a expired ({i})" for i in range(25, 30)
    ]
