"""Messages that leave nobody guessing (issue 51, item 5).

A command a message tells the user to run works when run as shown: `pause`,
`skip` and `at` name the `-c FILE` they were given (quoted for a shell); a
cancel that finds nothing says so in a sentence; a mistyped command name gets
the closest one, as a mistyped job name does; an error of the config file
says "config error" once. Against a real nats-server, through the real
command line.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.support import NatsServer, RecordingApp, base, run_cli, write_config

YEARLY = {"name": "sync", "schedule": "0 0 1 1 *"}


def hint(text: str, pattern: str) -> list[str]:
    """The command the output tells the user to run, as its words."""
    found = re.search(pattern, text)
    assert found, text
    words = shlex.split(found[1])
    assert words[0] == "anarchon-sidecar", words
    return words[1:]


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


@pytest.fixture
def cfg(tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp) -> str:
    # A directory with a space: the -c FILE of a hint must be quoted to work.
    path = tmp_path / "my configs" / "sidecar.yaml"
    path.parent.mkdir()
    return str(write_config(path, {"instance_id": "cli", **base(nats_server, http_app, [YEARLY])}))


def test_the_commands_that_pause_skip_and_at_print_run_as_shown(cfg: str) -> None:
    paused = ok(run_cli("pause", "sync", "-c", cfg))
    resume = hint(paused, r"Missed slots are not run on resume \(`([^`]+)`\)")
    assert resume == ["resume", "sync", "-c", cfg]
    assert "sync: resumed" in ok(run_cli(*resume))

    skipped = ok(run_cli("skip", "sync", "-c", cfg))
    unskip = hint(skipped, r"slot\(s\) to skip in all; `([^`]+)` cancels")
    assert unskip == ["unskip", "sync", "-c", cfg]
    assert "1 pending skip(s) cancelled" in ok(run_cli(*unskip))

    queued = ok(run_cli("at", "sync", "1h", "-c", cfg))
    cancel = hint(queued, r"pending; cancel: (.+)$")
    assert cancel[:3] == ["at", "sync", "--cancel"] and cancel[-2:] == ["-c", cfg]
    assert "sync: cancelled one-off run at" in ok(run_cli(*cancel))

    nothing = run_cli("at", "sync", "--cancel", "all", "-c", cfg)
    assert nothing.returncode == 1, nothing
    assert nothing.stderr.strip().endswith("sync: no one-off run pending, so none was cancelled"), (
        nothing.stderr
    )


def test_the_hints_leave_out_a_config_given_by_the_environment(cfg: str) -> None:
    """$ANARCHON_CONFIG is still set when the user runs the hint: no -c to add."""
    paused = ok(run_cli("pause", "sync", env={"ANARCHON_CONFIG": cfg}))
    assert "(`anarchon-sidecar resume sync`)" in paused
    ok(run_cli("resume", "sync", env={"ANARCHON_CONFIG": cfg}))


def test_a_mistyped_command_gets_the_closest_name() -> None:
    typo = run_cli("pasue", "sync", "-c", "sidecar.yaml")
    assert typo.returncode == 2, typo
    assert "Error: No such command 'pasue'. Did you mean 'pause'?" in typo.stderr
    assert "Did you mean 'status'?" in run_cli("stauts", "--json").stdout
    far = run_cli("zzzz")
    assert far.returncode == 2 and "No such command 'zzzz'." in far.stderr
    assert "Did you mean" not in far.stderr


def test_an_error_of_the_config_file_says_config_error_once(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    res = run_cli("check", "-c", str(missing))
    assert res.returncode == 2, res
    assert res.stderr.strip() == f"anarchon-sidecar: config error: {missing}: no such file"
    unquoted = tmp_path / "c.yaml"
    unquoted.write_text("jobs:\n  - name: sync\n    schedule: */5 * * * *\n")
    res = run_cli("check", "-c", str(unquoted))
    assert res.returncode == 2, res
    line = res.stderr.strip()
    assert line.startswith(f"anarchon-sidecar: config error: {unquoted}, line 3"), line
    assert line.endswith('quote the cron line (a value starting with * must be quoted in YAML): '
                         'schedule: "*/5 * * * *"'), line  # fmt: skip


def test_an_unknown_job_with_nats_down_is_a_usage_error_saying_why(tmp_path: Path) -> None:
    """The state bucket, where `job add` keeps jobs, cannot be read: a name the file
    lacks is still exit 2, and the message says the bucket was not looked at."""
    cfg = tmp_path / "down.yaml"
    write_config(cfg, {"nats": {"servers": "nats://127.0.0.1:1"}, "jobs": [YEARLY]})
    res = run_cli("pause", "synk", "-c", str(cfg))
    assert res.returncode == 2, res
    assert res.stderr.strip().endswith(
        "no job named 'synk' in the config (NATS is unreachable: the state bucket's jobs "
        "were not read); did you mean 'sync'? (jobs: sync)"
    ), res.stderr
