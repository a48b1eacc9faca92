"""History, last-run, run-now and stream, read back from a real stream after real runs."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from sidecar.core.clock import rfc3339
from sidecar.store.runs import (
    MAX_ANSWER_TEXT,
    RUN_FIELDS,
    join_runs,
    loads,
    read_history,
    read_job_messages,
)
from sidecar.store.stream import StreamSpec, ensure_stream
from tests.support import (
    NatsServer,
    RecordingApp,
    free_port,
    read_stream,
    run_cli,
    sidecars,
    wait_for,
    write_config,
)


def config_for(nats_server: NatsServer, app: RecordingApp, **job: Any) -> dict[str, Any]:
    spec = {"name": "sync", "schedule": "* * * * * *", "jitter": "0s", "max_late": "5s", **job}
    return {
        "instance_id": "cli",
        "nats": {"servers": [nats_server.url]},
        "target": {"url": app.url, "timeout": "1s"},
        "jobs": [spec],
    }


def cli_json(path: Path, *args: str) -> list[dict[str, Any]]:
    res = run_cli(*args, "-c", str(path), "--json")
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def test_history_of_real_runs_succeeded_failed_timeout_and_killed(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    cfg = config_for(nats_server, http_app)
    path = write_config(tmp_path / "cli.yaml", cfg)
    with sidecars(tmp_path, [("a", cfg, {})]) as (proc,):
        wait_for(lambda: len(http_app.requests) >= 2, 15, what="two successes")
        http_app.status["/jobs/sync"] = 500
        n = len(http_app.requests)
        wait_for(lambda: len(http_app.requests) >= n + 2, 15, what="two failures")
        http_app.delay["/jobs/sync"] = 1.5  # beyond the 1 s timeout
        http_app.status.pop("/jobs/sync")
        n = len(http_app.requests)
        wait_for(lambda: len(http_app.requests) >= n + 1, 15, what="a timeout")
        wait_for(
            lambda: any(
                r["error"] and "no answer" in r["error"] for r in cli_json(path, "history", "sync")
            ),
            15,
            what="timeout recorded",
        )
        http_app.delay["/jobs/sync"] = 30.0  # the next run hangs: kill -9 mid-run
        n = len(http_app.requests)
        wait_for(lambda: len(http_app.requests) >= n + 1, 15, what="a hanging run")
        hanging = http_app.requests[-1].headers["X-Anarchon-Run-Id"]
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait(10)

    runs = cli_json(path, "history", "sync", "--limit", "1000")
    assert all(set(r) == set(RUN_FIELDS) for r in runs)
    by_token = {r["token"]: r for r in runs}
    assert by_token[hanging]["status"] == "running"
    assert by_token[hanging]["finished_at"] is None
    statuses = [r["status"] for r in runs]
    assert "succeeded" in statuses and "failed" in statuses
    assert any(r["http_status"] == 500 and r["error"].startswith("HTTP 500") for r in runs)
    assert any(
        r["http_status"] is None and "no answer within 1s" in (r["error"] or "") for r in runs
    )
    ok = next(r for r in runs if r["status"] == "succeeded")
    assert ok["http_status"] == 200 and ok["duration_ms"] >= 0 and ok["instance"] == "cli"
    assert ok["scheduled_at"].endswith("Z") and ok["manual"] is False
    # newest first, one entry per claim in the stream
    slots = [r["slot"] for r in runs]
    assert slots == sorted(slots, reverse=True)
    stored = [m for m in read_stream(nats_server.url) if m.subject == "cron.sync.claims"]
    assert len(runs) == len(stored)
    # --limit
    assert [r["token"] for r in cli_json(path, "history", "sync", "--limit", "2")] == [
        r["token"] for r in runs[:2]
    ]
    # last-run is the newest, as JSON and as a table
    assert cli_json(path, "last-run", "sync") == runs[:1]
    table = run_cli("last-run", "sync", "-c", str(path))
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split()[:3] == ["SCHEDULED", "INSTANCE", "STATUS"]
    assert "running" in table.stdout
    text = run_cli("history", "sync", "-c", str(path)).stdout
    assert "HTTP 500" in text and "succeeded" in text and "UTC" in text


def test_history_table_shows_the_jobs_timezone(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    cfg = config_for(nats_server, http_app, timezone="Asia/Kolkata")
    path = write_config(tmp_path / "cli.yaml", cfg)
    res = run_cli("run-now", "sync", "-c", str(path))
    assert res.returncode == 0, res.stderr
    out = run_cli("history", "sync", "-c", str(path)).stdout
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d IST \(manual\)", out), out


def test_run_now_triggers_once_records_manual_and_exits_by_outcome(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    cfg = config_for(nats_server, http_app, request={"body": '{"full": true}', "method": "PUT"})
    path = write_config(tmp_path / "cli.yaml", cfg)
    res = run_cli("run-now", "sync", "-c", str(path))
    assert res.returncode == 0, res.stderr
    assert "succeeded" in res.stdout
    assert len(http_app.requests) == 1
    req = http_app.requests[0]
    assert (req.method, req.body) == ("PUT", b'{"full": true}')
    [run] = cli_json(path, "history", "sync")
    assert run["manual"] is True and run["status"] == "succeeded"
    assert run["token"] == req.headers["X-Anarchon-Run-Id"]
    [claim] = [m for m in read_stream(nats_server.url) if m.subject == "cron.sync.claims"]
    assert claim.headers["Nats-Msg-Id"] == f"sync:manual:{run['token']}"

    http_app.status["/jobs/sync"] = 503
    res = run_cli("run-now", "sync", "-c", str(path))
    assert res.returncode == 1
    assert "failed" in res.stdout and "HTTP 503" in res.stdout
    assert len(http_app.requests) == 2
    assert cli_json(path, "last-run", "sync")[0]["http_status"] == 503

    assert run_cli("run-now", "nope", "-c", str(path)).returncode == 2


def test_run_now_with_the_app_down_shows_progress_and_gives_up_at_its_timeout(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    cfg = config_for(nats_server, http_app, max_late="50s")
    cfg["target"]["url"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    path = write_config(tmp_path / "cli.yaml", cfg)

    started = time.monotonic()
    res = run_cli("run-now", "sync", "-c", str(path), "--timeout", "12s")
    took = time.monotonic() - started

    assert res.returncode == 1, res
    assert 5 <= took < 40, took  # within the --timeout, not the job's max_late of 50s
    lines = [line for line in res.stderr.splitlines() if line.startswith("sync: ")]
    assert re.fullmatch(
        r"sync: app not reachable \(cannot connect to http://127\.0\.0\.1:\d+: .*\); "
        r"retrying for up to 12s \(--timeout to change\)",
        lines[0],
    ), res.stderr
    assert re.fullmatch(
        r"sync: still not reachable after \d+s \(\d+ attempts\); giving up in \d+s", lines[1]
    ), res.stderr
    assert re.fullmatch(
        r"sync: manual run \w+ failed \(no HTTP status, \d+ ms\): .* \(gave up\)",
        res.stdout.strip(),
    ), res.stdout
    [run] = cli_json(path, "last-run", "sync")
    assert run["status"] == "failed" and run["error"].endswith("(gave up)")

    # 0 tries once; a number without a unit is refused (it would be milliseconds in the config).
    res = run_cli("run-now", "sync", "-c", str(path), "--timeout", "0")
    assert res.returncode == 1 and "still not reachable" not in res.stderr, res
    for bad in ("30", "soon", "-1s"):
        res = run_cli("run-now", "sync", "-c", str(path), "--timeout", bad)
        assert res.returncode == 2 and "Invalid value for '--timeout'" in res.stderr, res


def test_read_commands_say_plainly_there_is_no_stream(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = write_config(tmp_path / "cli.yaml", config_for(nats_server, http_app))
    for args in (["history", "sync"], ["stream"]):
        res = run_cli(*args, "-c", str(path))
        assert res.returncode == 0
        assert "no stream CRON yet" in res.stderr
        assert "Traceback" not in res.stderr
    res = run_cli("last-run", "sync", "-c", str(path))
    assert res.returncode == 1 and "no stream CRON yet" in res.stderr
    # and they created nothing
    assert "no stream CRON yet" in run_cli("stream", "-c", str(path)).stderr


def test_last_run_exits_1_when_there_is_none(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    cfg = config_for(nats_server, http_app)
    cfg["jobs"].append({"name": "other", "schedule": "0 0 1 1 *"})
    path = write_config(tmp_path / "cli.yaml", cfg)
    assert run_cli("run-now", "sync", "-c", str(path)).returncode == 0
    res = run_cli("last-run", "other", "-c", str(path))
    assert res.returncode == 1
    assert "no runs of other" in res.stderr


def test_stream_command_shows_settings_and_state(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    cfg = config_for(nats_server, http_app)
    cfg["nats"].update({"duplicate_window": "2m", "history_size": 50})
    path = write_config(tmp_path / "cli.yaml", cfg)
    assert run_cli("run-now", "sync", "-c", str(path)).returncode == 0
    res = run_cli("stream", "-c", str(path), "--json")
    assert res.returncode == 0
    state = json.loads(res.stdout)
    assert state["name"] == "CRON" and state["subjects"] == ["cron.>"]
    assert state["messages"] == 2 and state["bytes"] > 0
    assert (state["history_size"], state["duplicate_window_seconds"], state["replicas"]) == (
        50,
        120.0,
        1,
    )
    text = run_cli("stream", "-c", str(path)).stdout
    assert "history size (per subject)  50" in text and "duplicate window" in text


async def _publish_garbage(url: str) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for subject in ("cron.sync.claims", "cron.sync.results"):
        for payload in (
            b"not json",
            b"[1, 2]",
            b'{"job": "sync"}',
            b'{"job": "other", "token": "x", "slot": 1, "instance": "i"}',
            b'{"job": "sync", "token": 5, "slot": "x"}',
            b"\xff\xfe",
            b"",
        ):
            await js.publish(subject, payload)
    await nc.close()


def test_garbage_on_the_jobs_subjects_does_not_break_history(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = write_config(tmp_path / "cli.yaml", config_for(nats_server, http_app))
    assert run_cli("run-now", "sync", "-c", str(path)).returncode == 0
    asyncio.run(_publish_garbage(nats_server.url))
    res = run_cli("history", "sync", "-c", str(path), "--json")
    assert res.returncode == 0, res.stderr
    runs = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(runs) == 1 and runs[0]["status"] == "succeeded"
    assert "14 malformed or foreign message(s)" in res.stderr


async def _publish_claim(url: str, slot: int, token: str, instance: str) -> None:
    """A claim (and a succeeded result) as any client of the stream could publish it."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    at = rfc3339(slot / 1000)
    claim = {"job": "sync", "slot": slot, "token": token, "instance": instance, "manual": False}
    claim |= {"scheduled_at": at, "claimed_at": at}
    await js.publish(
        "cron.sync.claims", json.dumps(claim).encode(), headers={"Nats-Msg-Id": f"sync:{slot}"}
    )
    result = {"job": "sync", "slot": slot, "token": token, "instance": instance}
    result |= {"status": "succeeded", "started_at": at, "finished_at": at, "duration_ms": 1}
    result |= {"http_status": 200, "error": None}
    await js.publish("cron.sync.results", json.dumps(result).encode())
    await nc.close()


def test_a_forged_far_future_claim_does_not_pin_last_run(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = write_config(tmp_path / "cli.yaml", config_for(nats_server, http_app))
    assert run_cli("run-now", "sync", "-c", str(path)).returncode == 0
    [real] = cli_json(path, "history", "sync")
    year_ahead = int((time.time() + 365 * 86400) * 1000)
    asyncio.run(_publish_claim(nats_server.url, year_ahead, "f" * 32, "forger"))
    assert any(m.data.get("token") == "f" * 32 for m in read_stream(nats_server.url))

    res = run_cli("last-run", "sync", "-c", str(path), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["token"] == real["token"]
    assert "1 claim(s) of sync for a slot more than 5m (nats.duplicate_window) ahead" in res.stderr
    res = run_cli("history", "sync", "-c", str(path), "--json")
    assert [json.loads(line)["token"] for line in res.stdout.splitlines()] == [real["token"]]
    assert "1 claim(s) of sync" in res.stderr and "malformed" not in res.stderr
    table = run_cli("history", "sync", "-c", str(path))
    assert "forger" not in table.stdout and "1 claim(s) of sync" in table.stderr

    # A claim ahead by less than the window (an instance whose clock is fast) still counts.
    minute_ahead = int((time.time() + 60) * 1000)
    asyncio.run(_publish_claim(nats_server.url, minute_ahead, "a" * 32, "fast-clock"))
    tokens = [r["token"] for r in cli_json(path, "history", "sync")]
    assert tokens == ["a" * 32, real["token"]]


async def _bodies_json_reads_in_other_spellings(url: str) -> list[Any]:
    """Claims and results spelled as json.loads reads them but no sidecar writes them."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await ensure_stream(js, StreamSpec("SPELL", "spell.", 300.0, 100, None))

    def claim(slot: int) -> dict[str, Any]:
        return {"job": "j", "slot": slot, "token": f"t{slot}", "instance": "i"}

    def result(slot: int) -> dict[str, Any]:
        return claim(slot) | {"status": "succeeded", "duration_ms": slot, "http_status": 200}

    spellings = [
        lambda d: json.dumps(d).encode("utf-8-sig"),  # a byte order mark
        lambda d: json.dumps(d).encode("utf-16"),
        lambda d: b" \n" + json.dumps(d).encode() + b"\r\n ",  # whitespace around
        lambda d: json.dumps(d, indent=2, ensure_ascii=False).encode(),
    ]
    for i, spell in enumerate(spellings):
        await js.publish("spell.j.claims", spell(claim(1000 + i)))
        await js.publish("spell.j.results", spell(result(1000 + i)))
    for junk in (
        json.dumps(claim(9)).encode() + b"x",  # extra data after the value
        json.dumps(claim(8)).encode() * 2,
        b"[" * 100_000,  # nesting too deep
        b"\xef\xbb\xbf",
        b"{\x00}",
    ):
        await js.publish("spell.j.claims", junk)
    try:
        hist = await read_history(js, "SPELL", "spell.", "j")
        messages = await read_job_messages(js, "SPELL", "spell.", "j")
    finally:
        await nc.close()
    return [hist, messages]


def test_history_decodes_every_body_exactly_as_json_loads(nats_server: NatsServer) -> None:
    hist, messages = asyncio.run(_bodies_json_reads_in_other_spellings(nats_server.url))
    assert [(r.slot, r.status, r.duration_ms) for r in hist.runs] == [
        (1003, "succeeded", 1003),
        (1002, "succeeded", 1002),
        (1001, "succeeded", 1001),
        (1000, "succeeded", 1000),
    ]
    assert hist.skipped == 5
    for _seq, _subject, raw in messages:  # the same value, or the same error
        try:
            expected: Any = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            expected = type(exc)
        try:
            got: Any = loads(raw)
        except (ValueError, RecursionError) as exc:
            got = type(exc)
        assert got == expected, raw[:60]


def test_join_runs_skips_claims_beyond_the_latest_slot() -> None:
    def claim(seq: int, slot: int) -> tuple[int, str, bytes]:
        body = {"job": "j", "slot": slot, "token": f"t{slot}", "instance": "i"}
        return (seq, "cron.j.claims", json.dumps(body).encode())

    messages = [claim(1, 1000), claim(2, 5000), claim(3, 5001), (4, "cron.j.claims", b"x")]
    hist = join_runs("j", messages, "cron.", latest_slot=5000)
    assert [r.slot for r in hist.runs] == [5000, 1000]
    assert (hist.skipped, hist.future) == (2, 1)
    assert len(join_runs("j", messages, "cron.").runs) == 3  # no limit given: all kept


def test_history_reads_only_its_own_job(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    cfg = config_for(nats_server, http_app)
    cfg["jobs"].append({"name": "sync2", "schedule": "0 0 1 1 *"})
    path = write_config(tmp_path / "cli.yaml", cfg)
    assert run_cli("run-now", "sync2", "-c", str(path)).returncode == 0
    assert run_cli("run-now", "sync", "-c", str(path)).returncode == 0
    [run] = cli_json(path, "history", "sync")
    assert run["job"] == "sync"
    [run2] = cli_json(path, "history", "sync2")
    assert run2["job"] == "sync2"
    # a job of another scheduler sharing the stream (not in this config) is readable too
    cfg["jobs"].pop()
    other = write_config(tmp_path / "other.yaml", cfg)
    assert [r["token"] for r in cli_json(other, "history", "sync2")] == [run2["token"]]
    assert run_cli("history", "bad name", "-c", str(other)).returncode == 2


def test_a_job_name_in_neither_config_nor_stream_exits_2_with_the_closest(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    cfg = config_for(nats_server, http_app)
    cfg["jobs"] += [{"name": "report", "schedule": "0 0 1 1 *"}]
    path = write_config(tmp_path / "cli.yaml", cfg)

    def error_line(res: subprocess.CompletedProcess[str]) -> str:
        """The error, after the `connected to NATS` log line."""
        return res.stderr.splitlines()[-1]

    # No stream yet: only the config knows names.
    res = run_cli("history", "nosuch", "-c", str(path))
    assert res.returncode == 2, res
    assert error_line(res) == (
        "anarchon-sidecar: no job named 'nosuch' in the config, and no stream CRON yet "
        "(jobs: sync, report)"
    )
    assert run_cli("run-now", "sync", "-c", str(path)).returncode == 0
    # `foreign` is a job of another scheduler sharing the stream: known, not an error.
    other = {**cfg, "jobs": [{"name": "foreign", "schedule": "0 0 1 1 *"}]}
    other_path = write_config(tmp_path / "other.yaml", other)
    assert run_cli("run-now", "foreign", "-c", str(other_path)).returncode == 0

    for command in ("history", "last-run"):
        for args in ((), ("--json",)):
            res = run_cli(command, "Sync", "-c", str(path), *args)
            said = (
                "no job named 'Sync' in the config or in stream CRON; "
                "did you mean 'sync'? (jobs: sync, report, foreign)"
            )
            # --json prints the error as one JSON object on stdout too (docs/CLI.md).
            shown = json.dumps({"error": said, "exit": 2}) + "\n" if args else ""
            assert (res.returncode, res.stdout) == (2, shown), res
            assert error_line(res) == f"anarchon-sidecar: {said}"
    res = run_cli("last-run", "reprot", "-c", str(path))
    assert res.returncode == 2 and "did you mean 'report'?" in res.stderr, res
    res = run_cli("history", "zzz", "-c", str(path))
    assert res.returncode == 2 and "did you mean" not in res.stderr, res
    res = run_cli("run-now", "snyc", "-c", str(path))
    assert res.returncode == 2, res
    assert error_line(res) == (
        "anarchon-sidecar: no job named 'snyc' in the config or in the state bucket; "
        "did you mean 'sync'? (jobs: sync, report)"
    )
    # In the config with no runs, or only in the stream: no error.
    res = run_cli("history", "report", "-c", str(path))
    assert (res.returncode, res.stdout) == (0, ""), res
    assert "no runs of report in stream CRON" in res.stderr
    assert run_cli("last-run", "report", "-c", str(path)).returncode == 1
    assert cli_json(path, "last-run", "foreign")[0]["job"] == "foreign"


@pytest.mark.parametrize(
    ("messages", "expected_skipped"),
    [
        ([], 0),
        ([(1, "cron.j.claims", b"{}")], 1),
        ([(1, "cron.j.other", b'{"job": "j"}')], 1),
    ],
)
def test_join_runs_counts_what_it_skips(
    messages: list[tuple[int, str, bytes]], expected_skipped: int
) -> None:
    hist = join_runs("j", messages, "cron.")
    assert hist.runs == [] and hist.skipped == expected_skipped


def test_join_runs_orders_newest_first_and_marks_running() -> None:
    def claim(seq: int, slot: int, token: str) -> tuple[int, str, bytes]:
        body = {"job": "j", "slot": slot, "token": token, "instance": "i", "manual": False}
        return (seq, "cron.j.claims", json.dumps(body).encode())

    result = {
        "job": "j",
        "slot": 2000,
        "token": "b",
        "instance": "i",
        "status": "failed",
        "started_at": "2026-01-01T00:00:02.000Z",
        "finished_at": "2026-01-01T00:00:02.500Z",
        "duration_ms": 500,
        "http_status": 500,
        "error": "HTTP 500",
    }
    hist = join_runs(
        "j",
        [
            claim(1, 1000, "a"),
            claim(2, 2000, "b"),
            (3, "cron.j.results", json.dumps(result).encode()),
        ],
        "cron.",
    )
    assert [(r.token, r.status) for r in hist.runs] == [("b", "failed"), ("a", "running")]
    assert hist.runs[0].duration_ms == 500 and hist.runs[1].duration_ms is None


def test_sidecar_records_results_that_history_shows(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    cfg = config_for(nats_server, http_app)
    path = write_config(tmp_path / "cli.yaml", cfg)
    procs = [(name, cfg | {"instance_id": name}, {}) for name in ("x", "y")]
    with sidecars(tmp_path, procs) as running:
        wait_for(lambda: len(http_app.requests) >= 3, 15, what="three runs")
        for p in running:
            assert p.terminate() == 0
    runs = cli_json(path, "history", "sync", "--limit", "100")
    done = [r for r in runs if r["status"] == "succeeded"]
    assert len(done) == len(http_app.requests)
    assert {r["token"] for r in done} == {r.headers["X-Anarchon-Run-Id"] for r in http_app.requests}
    assert all(r["instance"] in ("x", "y") for r in runs)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, (None, None, False, False)),
        (
            {"answer": "ok", "answer_type": "text/plain", "answer_cut": True},
            ("ok", "text/plain", False, True),
        ),
        ({"answer": "AAE=", "answer_base64": True}, ("AAE=", None, True, False)),
        # Forged: not a string, not a true, too long.
        ({"answer": 3, "answer_type": "text/plain"}, (None, None, False, False)),
        ({"answer": "x", "answer_type": 3, "answer_base64": "yes"}, ("x", None, False, False)),
        ({"answer": "y" * 100_000}, ("y" * MAX_ANSWER_TEXT, None, False, True)),
        ({"answer": "z", "answer_type": "t" * 500}, ("z", "t" * 200, False, False)),
    ],
)
def test_a_results_answer_is_read_as_hostile(fields: dict[str, Any], expected: tuple) -> None:
    claim = {"job": "j", "slot": 1000, "token": "t", "instance": "i"}
    result = {"job": "j", "token": "t", "status": "succeeded", **fields}
    messages = [
        (1, "cron.j.claims", json.dumps(claim).encode()),
        (2, "cron.j.results", json.dumps(result).encode()),
    ]
    (run,) = join_runs("j", messages, "cron.").runs
    assert (run.answer, run.answer_type, run.answer_base64, run.answer_cut) == expected
