"""One mistake, one answer: the exit codes and streams of docs/CLI.md, command by command.

Every command that names a job answers an unknown one alike (exit 2, the
closest name); "no runs" and "no stream yet" go to stderr in every command,
so stdout only ever holds data; `--json` always prints JSON on stdout; a
second `pause` keeps the first; the table of docs/CLI.md is the code's.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import shared
from tests.support import ROOT, NatsServer, RecordingApp, run_cli, write_config

JOB_COMMANDS = ("history", "last-run", "run-now", "pause", "resume")


def config_for(nats_server: NatsServer, app: RecordingApp) -> dict[str, Any]:
    return {
        "instance_id": "cli",
        "nats": {"servers": [nats_server.url]},
        "target": {"url": app.url, "timeout": "1s"},
        "jobs": [
            {"name": "sync", "schedule": "0 0 1 1 *"},
            {"name": "report", "schedule": "0 0 1 1 *"},
        ],
    }


def last_line(res: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in res.stderr, res.stderr
    return res.stderr.strip().splitlines()[-1]


@pytest.fixture
def cfg(tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp) -> str:
    return str(write_config(tmp_path / "cli.yaml", config_for(nats_server, http_app)))


def test_every_command_answers_an_unknown_job_alike(cfg: str) -> None:
    """Exit 2 and the closest name, before and after the stream exists."""
    for when in ("before the stream", "after a run"):
        if when == "after a run":
            assert run_cli("run-now", "sync", "-c", cfg).returncode == 0
        for cmd in JOB_COMMANDS:
            res = run_cli(cmd, "synk", "-c", cfg)
            assert (res.returncode, res.stdout) == (2, ""), (when, cmd, res)
            line = last_line(res)
            assert line.startswith("anarchon-sidecar: no job named 'synk' in the config"), line
            assert line.endswith("; did you mean 'sync'? (jobs: sync, report)"), (when, cmd, line)


def test_nothing_to_show_is_said_on_stderr_by_every_command(cfg: str) -> None:
    # No stream yet: reading commands say so on stderr; stdout stays empty.
    for args, code in ((["history", "sync"], 0), (["last-run", "sync"], 1), (["stream"], 0)):
        res = run_cli(*args, "-c", cfg)
        assert (res.returncode, res.stdout) == (code, ""), res
        assert "no stream CRON yet: `run` or `run-now` creates it" in res.stderr, res
    res = run_cli("resume", "sync", "-c", cfg)
    assert (res.returncode, res.stdout) == (1, ""), res
    assert last_line(res).startswith("anarchon-sidecar: sync: not resumed: state bucket"), res
    # A stream, no runs of `report`.
    assert run_cli("run-now", "sync", "-c", cfg).returncode == 0
    for args, code in ((["history", "report"], 0), (["last-run", "report"], 1)):
        res = run_cli(*args, "-c", cfg)
        assert (res.returncode, res.stdout) == (code, ""), res
        assert last_line(res) == "no runs of report in stream CRON", res


class DomainServer(NatsServer):
    def config_text(self) -> str:
        return super().config_text().replace("jetstream {", "jetstream { domain: hub,")


def test_json_is_always_json_on_stdout(tmp_path: Path, http_app: RecordingApp) -> None:
    server = DomainServer(tmp_path / "nats")
    server.start()
    try:
        cfg = str(write_config(tmp_path / "cli.yaml", config_for(server, http_app)))

        def out(*args: str, code: int = 0) -> Any:
            res = run_cli(*args, "-c", cfg, "--json")
            assert res.returncode == code, res
            return [json.loads(line) for line in res.stdout.splitlines()]

        # Before the stream: who answered, and that there is no stream.
        assert out("stream") == [
            {"name": "CRON", "exists": False, "domain": "hub", "cluster": None, "jobs_not_held": {}}
        ]
        assert out("last-run", "sync", code=1) == [None]
        assert out("history", "sync") == []  # one object per run: none
        assert out("status")[0]["stream"] is None
        assert run_cli("run-now", "sync", "-c", cfg).returncode == 0
        (state,) = out("stream")
        assert (state["exists"], state["domain"], state["name"]) == (True, "hub", "CRON")
        assert out("last-run", "report", code=1) == [None]
        assert [r["job"] for r in out("history", "sync")] == ["sync"]
        assert out("last-run", "sync")[0]["status"] == "succeeded"
    finally:
        server.stop()


JSON_COMMANDS = (["history", "sync"], ["last-run", "sync"], ["stream"], ["status"])


def error_object(res: subprocess.CompletedProcess[str], code: int) -> str:
    """The one JSON error object --json prints on stdout on failure; its message."""
    assert res.returncode == code, res
    (line,) = res.stdout.splitlines()
    obj = json.loads(line)
    assert set(obj) == {"error", "exit"} and obj["exit"] == code, obj
    assert res.stderr.strip().splitlines()[-1].endswith(obj["error"]), res.stderr
    return str(obj["error"])


def test_json_prints_one_error_object_on_stdout_when_the_command_fails(
    tmp_path: Path, cfg: str
) -> None:
    down = {
        "nats": {"servers": "nats://127.0.0.1:1", "connect_timeout": "200ms"},
        "jobs": [{"name": "sync", "schedule": "0 0 1 1 *"}],
    }
    unreachable = str(write_config(tmp_path / "down.yaml", down))
    for args in JSON_COMMANDS:
        assert "cannot connect to NATS" in error_object(
            run_cli(*args, "-c", unreachable, "--json"), 3
        )
        # A config error, an unknown job, a bad option: exit 2, the same object.
        broken = tmp_path / "broken.yaml"
        broken.write_text("jobs: 3\n")
        assert error_object(run_cli(*args, "-c", str(broken), "--json"), 2).startswith(
            "config error: jobs"
        )
        assert "--nosuch" in error_object(run_cli(*args, "-c", cfg, "--json", "--nosuch"), 2)
    for cmd in ("history", "last-run"):
        assert "no job named 'synk'" in error_object(run_cli(cmd, "synk", "-c", cfg, "--json"), 2)


def test_a_second_pause_keeps_the_first_and_force_says_what_it_replaced(cfg: str) -> None:
    first = run_cli("pause", "sync", "--reason", "db migration", "-c", cfg)
    assert first.returncode == 0, first
    assert re.match(r"sync: paused by \S+ at \S+ \(db migration\)$", first.stdout.splitlines()[0])
    again = run_cli("pause", "sync", "--reason", "other", "-c", cfg)
    assert again.returncode == 0, again
    assert again.stdout.splitlines() == [
        first.stdout.splitlines()[0] + ": kept (--force replaces it)"
    ]
    assert "sync was already paused; nothing changed" in again.stderr
    status = json.loads(run_cli("status", "--json", "-c", cfg).stdout)
    assert status["jobs"][0]["paused_reason"] == "db migration"
    forced = run_cli("pause", "sync", "--reason", "other", "--force", "-c", cfg)
    assert forced.returncode == 0, forced
    replaced = first.stdout.splitlines()[0].replace("sync: paused", "sync: replaced the pause")
    assert replaced in forced.stderr, forced
    assert forced.stdout.startswith("sync: paused by ") and "(other)" in forced.stdout
    status = json.loads(run_cli("status", "--json", "-c", cfg).stdout)
    assert status["jobs"][0]["paused_reason"] == "other"
    resumed = run_cli("resume", "sync", "-c", cfg)
    assert resumed.returncode == 0 and "(other)" not in resumed.stdout, resumed


def test_the_exit_code_table_of_docs_cli_is_the_code_s() -> None:
    text = (ROOT / "docs" / "CLI.md").read_text()
    section = text[text.index("## Exit codes") :]
    documented = {int(m) for m in re.findall(r"^\| (\d+) +\|", section, re.M)}
    in_code = {0} | {value for name, value in vars(shared).items() if name.startswith("EXIT_")}
    assert documented == in_code
    # the module's docstring says the same
    assert {int(m) for m in re.findall(r"^    (\d+) ", shared.__doc__ or "", re.M)} == in_code
