"""The stream is never weakened, and never claimed on when it cannot hold a claim.

Against a real nats-server: a stream made by another tool with a window too
short for the jobs, a fleet's stream lowered by someone else, run-now with a
smaller config, a stream that overlaps our subjects, and the one explicit
way to lower the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import select
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import StreamConfig
from prometheus_client import CollectorRegistry

from sidecar.config.jobset import JobSet
from sidecar.config.load import parse_config
from sidecar.core.clock import Clock
from sidecar.core.errors import StreamConflict
from sidecar.obs.metrics import Metrics
from sidecar.store.guard import StreamGuard
from sidecar.store.stream import (
    StreamSpec,
    StreamState,
    desired_update,
    ensure_stream,
    read_stream,
    stream_spec,
)
from sidecar.store.streamfit import coverage
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    run_cli,
    sidecar_env,
    wait_for,
    write_config,
)

SPEC = StreamSpec("CRON", "cron.", 300.0, 1000, None)


def config_of(jobs: list[dict[str, Any]], **nats_keys: Any) -> Any:
    return parse_config({"nats": {"servers": "nats://127.0.0.1:1", **nats_keys}, "jobs": jobs}, {})


def job(name: str = "sync", **extra: Any) -> dict[str, Any]:
    return {"name": name, "schedule": "* * * * * *", "jitter": "1s", "max_late": "5s", **extra}


def state(**changes: Any) -> StreamState:
    base = StreamState(
        "CRON", ("cron.>",), 300.0, 1000, 1, 0, 0, 0, 0, "file", None, 0.0, 1_000_000.0
    )
    return replace(base, **changes)


# ------------------------------------------------------------------ pure rules


@pytest.mark.parametrize(
    ("current", "wanted", "expected"),
    [
        # (window, history, replicas) of the stream, of the spec, after the update
        ((1800.0, 5000, 3), (300.0, 1000, 1), None),  # never lowered
        ((300.0, 1000, 1), (1800.0, 5000, 3), (1800.0, 5000, 3)),  # raised
        ((1800.0, 1000, 1), (300.0, 5000, None), (1800.0, 5000, 1)),  # each on its own
        ((60.0, -1, 1), (300.0, 5000, None), (300.0, -1, 1)),  # unlimited history stays
    ],
)
def test_the_stream_is_raised_never_lowered(
    current: tuple[float, int, int],
    wanted: tuple[float, int, int | None],
    expected: tuple[float, int, int] | None,
) -> None:
    cfg = StreamConfig(
        name="CRON",
        subjects=["cron.>"],
        duplicate_window=current[0],
        max_msgs_per_subject=current[1],
        num_replicas=current[2],
    )
    update = desired_update(cfg, StreamSpec("CRON", "cron.", *wanted))
    if expected is None:
        assert update is None
    else:
        assert update is not None
        got = (update.duplicate_window, update.max_msgs_per_subject, update.num_replicas)
        assert got == expected


def test_the_window_is_raised_only_up_to_max_age() -> None:
    cfg = StreamConfig(
        name="CRON", subjects=["cron.>"], duplicate_window=1.0, max_age=20.0, num_replicas=1
    )
    update = desired_update(cfg, SPEC)
    assert update is not None
    assert update.duplicate_window == 20.0  # the server refuses more (err 10052)
    assert update.max_age == 20.0  # someone else's choice: kept


def test_coverage_names_what_the_stream_cannot_hold() -> None:
    config = config_of([job("ok"), job("slow", max_late="60s")], duplicate_window="5m")
    spec = stream_spec(config)
    assert coverage(state(), spec, config.jobs) == {"ok": None, "slow": None}
    short = coverage(state(duplicate_window=30.0, max_age=30.0), spec, config.jobs)
    assert short["ok"] is None
    assert short["slow"] is not None
    assert "duplicate window (30s) is not longer than jitter + max_late (1m1s)" in short["slow"]
    assert "max_age (30s)" in short["slow"]
    # 5 claims a subject at one slot a second do not cover 1 s + 5 s.
    trimmed = coverage(state(history_size=5), spec, config.jobs)
    assert trimmed["ok"] is not None and "history size (5 per subject)" in trimmed["ok"]
    assert coverage(state(history_size=-1), spec, config.jobs)["ok"] is None
    foreign = coverage(state(subjects=("other.>",)), spec, config.jobs)
    assert foreign["ok"] == "stream CRON does not capture cron.>"


def test_no_claim_before_the_first_stream_check_nor_for_a_slot_older_than_the_stream() -> None:
    config = config_of([job()])
    guard = StreamGuard(
        config, Metrics(CollectorRegistry()), Clock(), asyncio.Event(), jobs=JobSet(config.jobs)
    )
    sync = config.jobs[0]
    assert guard.blocked(sync, 2_000_000_000) == "stream not checked yet"
    guard._stream_up(state(created=1_000_000.0))
    assert guard.blocked(sync, 2_000_000_000) is None
    why = guard.blocked(sync, 999_999_000)
    assert why is not None and "created at" in why


# ------------------------------------------------------------------ real server


async def test_a_stronger_stream_is_left_as_it_is(nc: NATS) -> None:
    js = nc.jetstream()
    strong = StreamConfig(
        name="CRON", subjects=["cron.>"], duplicate_window=1800, max_msgs_per_subject=5000
    )
    await js.add_stream(strong)
    got = await ensure_stream(js, SPEC)
    assert (got.duplicate_window, got.history_size) == (1800.0, 5000)
    info = await js.stream_info("CRON")
    assert (info.config.duplicate_window, info.config.max_msgs_per_subject) == (1800.0, 5000)


async def test_an_overlapping_stream_is_a_final_error_naming_it(nc: NATS) -> None:
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="OTHER", subjects=["cron.sync.*"]))
    started = time.monotonic()
    with pytest.raises(StreamConflict) as caught:
        await ensure_stream(js, SPEC)
    assert time.monotonic() - started < 5  # one answer, not a retry loop
    assert "OTHER (cron.sync.*)" in str(caught.value)
    assert caught.value.others == {"OTHER": ["cron.sync.*"]}


def _config_file(tmp_path: Path, nats_url: str, app: RecordingApp, **extra: Any) -> Path:
    data: dict[str, Any] = {
        "instance_id": "cli",
        "nats": {"servers": [nats_url]},
        "target": {"url": app.url, "timeout": "5s"},
        "jobs": [job()],
    }
    data.update(extra)
    return write_config(tmp_path / "c.yaml", data)


async def _stream_config(url: str) -> StreamConfig:
    conn = await nats.connect(url)
    try:
        return (await conn.jetstream().stream_info("CRON")).config
    finally:
        await conn.close()


async def _apply(url: str, config: StreamConfig) -> None:
    conn = await nats.connect(url)
    try:
        js = conn.jetstream()
        try:
            await js.update_stream(config)
        except nats.js.errors.NotFoundError:
            await js.add_stream(config)
    finally:
        await conn.close()


def test_run_now_does_not_change_the_shared_stream(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    fleet = StreamConfig(
        name="CRON", subjects=["cron.>"], duplicate_window=1800, max_msgs_per_subject=5000
    )
    asyncio.run(_apply(nats_server.url, fleet))
    path = _config_file(tmp_path, nats_server.url, http_app)  # defaults: 5m, 1000
    done = run_cli("run-now", "sync", "-c", str(path))
    assert done.returncode == 0, done.stderr
    after = asyncio.run(_stream_config(nats_server.url))
    assert (after.duplicate_window, after.max_msgs_per_subject) == (1800.0, 5000)
    assert len(http_app.requests_for("/jobs/sync")) == 1


def test_overlap_exits_2_from_check_connect_and_run_now(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    other = StreamConfig(name="OTHER", subjects=["cron.sync.*"])
    asyncio.run(_apply(nats_server.url, other))
    path = _config_file(tmp_path, nats_server.url, http_app)
    for args in (("check", "--connect"), ("run-now", "sync")):
        done = run_cli(*args, "-c", str(path), timeout=30)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "OTHER (cron.sync.*)" in done.stderr
        assert "Traceback" not in done.stderr
    assert http_app.requests_for("/jobs/sync") == []


def test_check_connect_says_what_run_would_raise_and_what_it_cannot(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = _config_file(tmp_path, nats_server.url, http_app, jobs=[job(max_late="60s")])
    missing = run_cli("check", "--connect", "-c", str(path))
    assert missing.returncode == 0, missing.stderr
    assert "stream CRON: missing; `run` creates it" in missing.stdout
    weak = StreamConfig(name="CRON", subjects=["cron.>"], duplicate_window=1, max_age=20)
    asyncio.run(_apply(nats_server.url, weak))
    capped = run_cli("check", "--connect", "-c", str(path))
    assert capped.returncode == 2
    assert "sync: would not be claimed" in capped.stderr
    assert "max_age (20s)" in capped.stderr
    assert "`run` raises it: duplicate window 1s -> 20s" in capped.stdout


def test_a_stream_too_weak_for_the_jobs_is_never_claimed_on(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """The reproduced case: another tool's stream, max_age 20 s and a 1 s window."""
    weak = StreamConfig(name="CRON", subjects=["cron.>"], duplicate_window=1, max_age=20)
    asyncio.run(_apply(nats_server.url, weak))
    config = {
        "nats": {"servers": [nats_server.url]},
        "target": {"url": http_app.url, "timeout": "5s"},
        "jobs": [job(jitter="1s", max_late="60s")],
    }
    procs = [Sidecar(tmp_path, f"w{i}", config, {}).start() for i in range(2)]
    try:
        for p in procs:
            wait_for(
                lambda p=p: (
                    (p.metric("anarchon_claims_skipped_total", {"reason": "stream"}) or 0) >= 3
                ),
                30,
                what=f"{p.name} skips slots for the stream",
            )
        code, body = procs[0].get("/readyz")
        assert code == 503
        # Raised as far as max_age lets it, which is not far enough.
        assert "duplicate window (20s) is not longer than jitter + max_late (1m1s)" in body
        assert procs[0].metric("anarchon_stream_covers_job", {"job": "sync"}) == 0
        shown = run_cli("status", "--json", "-c", str(procs[0].config_path))
        sync = json.loads(shown.stdout)["jobs"][0]
        assert "is not longer than jitter + max_late" in sync["stream_problem"]
        table = run_cli("status", "-c", str(procs[0].config_path)).stdout
        assert "NOT HELD" in table and "sync not claimed: stream CRON's duplicate window" in table
        # The stream stays as its owner made it (the window cannot pass max_age).
        after = asyncio.run(_stream_config(nats_server.url))
        assert (after.duplicate_window, after.max_age) == (20.0, 20.0)
    finally:
        codes = [p.terminate() for p in procs]
    assert codes == [0, 0]
    assert http_app.requests_for("/jobs/sync") == []
    skip_lines = [ln for ln in procs[0].log().splitlines() if "skipped:" in ln]
    assert 1 <= len(skip_lines) <= 2, skip_lines  # once a minute a job, not once a slot


def test_a_running_fleet_raises_a_lowered_stream_back_and_counts_it(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = {
        "nats": {"servers": [nats_server.url], "duplicate_window": "30m", "history_size": 5000},
        "target": {"url": http_app.url, "timeout": "5s"},
        "jobs": [job(max_late="20m", jitter="1s", schedule="0 0 1 1 *")],
    }
    proc = Sidecar(tmp_path, "fleet", config, {}).start()
    try:
        proc.wait_ready()
        lowered = StreamConfig(
            name="CRON", subjects=["cron.>"], duplicate_window=300, max_msgs_per_subject=1000
        )
        asyncio.run(_apply(nats_server.url, lowered))  # what the reference backend does
        wait_for(
            lambda: proc.metric("anarchon_stream_raised_total") == 1,
            8,  # an advisory wakes the check; without it, the 10 s refresh would
            what="the stream raised back",
        )
        after = asyncio.run(_stream_config(nats_server.url))
        assert (after.duplicate_window, after.max_msgs_per_subject) == (1800.0, 5000)
        assert "raising stream CRON" in proc.log()
    finally:
        assert proc.terminate() == 0


def test_the_daemon_waits_out_an_overlap_and_exits_cleanly(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    other = StreamConfig(name="OTHER", subjects=["cron.sync.*"])
    asyncio.run(_apply(nats_server.url, other))
    config = {
        "nats": {"servers": [nats_server.url]},
        "target": {"url": http_app.url, "timeout": "5s"},
        "jobs": [job()],
    }
    proc = Sidecar(tmp_path, "ov", config, {}).start()
    try:
        wait_for(lambda: "OTHER (cron.sync.*)" in proc.get("/readyz")[1], 20, what="not ready")
        assert proc.get("/readyz")[0] == 503
        time.sleep(3)  # let it retry a few times: the log must not grow per try
    finally:
        started = time.monotonic()
        assert proc.terminate(timeout=15) == 0
        assert time.monotonic() - started < 10
    text = proc.log()
    # One line for the problem, one for the skipped slots (once a minute a job).
    assert sum("overlap" in line for line in text.splitlines()) <= 2, text
    assert "RecursionError" not in text and "Traceback" not in text
    assert http_app.requests_for("/jobs/sync") == []


def test_stream_lower_says_what_it_deletes_and_asks(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    big = StreamConfig(
        name="CRON", subjects=["cron.>"], duplicate_window=1800, max_msgs_per_subject=50
    )
    asyncio.run(_apply(nats_server.url, big))

    async def fill() -> None:
        conn = await nats.connect(nats_server.url)
        js = conn.jetstream()
        for i in range(30):
            await js.publish("cron.sync.results", json.dumps({"i": i}).encode())
        await conn.close()

    asyncio.run(fill())
    path = _config_file(
        tmp_path, nats_server.url, http_app, nats={"servers": [nats_server.url], "history_size": 20}
    )
    refused = run_cli("stream", "--lower", "-c", str(path))  # no terminal: no answer
    assert refused.returncode == 1
    assert "this deletes 10 message(s) on 1 subject(s)" in refused.stdout
    assert "cron.sync.results: 10" in refused.stdout
    assert "add --yes" in refused.stderr
    assert asyncio.run(_stream_config(nats_server.url)).max_msgs_per_subject == 50
    done = run_cli("stream", "--lower", "--yes", "-c", str(path))
    assert done.returncode == 0, done.stderr
    after = asyncio.run(_stream_config(nats_server.url))
    assert (after.duplicate_window, after.max_msgs_per_subject) == (300.0, 20)


async def test_read_stream_reports_max_age_and_creation(nc: NATS) -> None:
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="CRON", subjects=["cron.>"], max_age=3600))
    got = await read_stream(js, SPEC)
    assert got.max_age == 3600.0
    assert got.created is not None and abs(got.created - time.time()) < 60


def test_a_stream_it_may_not_raise_is_used_as_it_is(tmp_path: Path, http_app: RecordingApp) -> None:
    """A NATS user denied STREAM.UPDATE: jobs the stream holds still run."""
    conf = """
authorization {
  users = [
    {user: admin, password: admin}
    {user: app, password: app, permissions: {publish: {deny: ["$JS.API.STREAM.UPDATE.>"]}}}
  ]
}
"""
    server = NatsServer(tmp_path / "nats", extra_conf=conf)
    server.start()
    try:
        admin_url = f"nats://admin:admin@127.0.0.1:{server.port}"
        # Holds jitter + max_late (6 s), but not the 5 m the config asks for.
        asyncio.run(
            _apply(admin_url, StreamConfig(name="CRON", subjects=["cron.>"], duplicate_window=60))
        )
        config = {
            "nats": {"servers": [server.url], "user": "app", "ack_timeout": "1s"},
            "target": {"url": http_app.url, "timeout": "5s"},
            "jobs": [job()],
        }
        proc = Sidecar(tmp_path, "app", config, {"ANARCHON_NATS_PASSWORD": "app"}).start()
        try:
            wait_for(lambda: len(http_app.requests_for("/jobs/sync")) >= 2, 30, what="runs")
            assert proc.ready()
            assert "cannot update stream CRON" in proc.log()
            # Covered: no series (issue 49: shown only once the stream did not hold it).
            assert proc.metric("anarchon_stream_covers_job", {"job": "sync"}) is None
        finally:
            assert proc.terminate() == 0
        after = asyncio.run(_stream_config(admin_url))
        assert after.duplicate_window == 60.0
    finally:
        server.stop()


def test_stream_lower_on_a_terminal_connects_once_and_prints_nothing_between(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """What a person at a terminal sees: the plan, the question, the answer; one connection,
    and no log line dropped into the middle."""
    big = StreamConfig(
        name="CRON", subjects=["cron.>"], duplicate_window=1800, max_msgs_per_subject=50
    )
    asyncio.run(_apply(nats_server.url, big))
    path = _config_file(
        tmp_path, nats_server.url, http_app, nats={"servers": [nats_server.url], "history_size": 20}
    )
    main, term = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "stream", "--lower", "-c", str(path)],
        stdin=term,
        stdout=term,
        stderr=term,
        env=sidecar_env(),
        close_fds=True,
    )
    os.close(term)
    seen = b""

    def read_until(text: bytes) -> bool:
        nonlocal seen
        if select.select([main], [], [], 0.1)[0]:
            with contextlib.suppress(OSError):  # EIO: the other side closed
                seen += os.read(main, 4096)
        return text in seen

    try:
        wait_for(lambda: read_until(b"lower the stream? [y/N]: "), 30, what="the question")
        os.write(main, b"y\n")
        wait_for(lambda: read_until(b"stream CRON lowered") and proc.poll() is not None, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        os.close(main)
    lines = seen.decode().replace("\r", "").splitlines()
    assert proc.returncode == 0, lines
    assert sum("connected to NATS" in line for line in lines) == 1, lines
    assert not [line for line in lines if " WARNING " in line], lines
    question = next(i for i, line in enumerate(lines) if "lower the stream?" in line)
    assert lines[question - 1].startswith("jobs of other instances"), lines
    assert lines[question + 1 :] == ["stream CRON lowered: duplicate window 5m, history size 20"], (
        lines
    )
