"""The documented NATS permissions (deploy/nats/*permissions.conf), with real processes.

The server loads the files themselves and the `authorization` block of SECURITY.md
unchanged. Under them a fleet of two sidecars does everything it does (claims,
results, leases, `overlap: skip`, retries, pause, presence, raising the
stream back) and every CLI command works, with no permissions violation in
the server's log; the app user is refused the state bucket and the claims. A
user missing a permission gets one clear reason: `/readyz` 503 naming the
denied subject, a metric, one log line, and no retry until the
slot's deadline.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from sidecar.core.clock import parse_rfc3339
from tests.support import (
    ROOT,
    NatsServer,
    RecordingApp,
    Sidecar,
    read_stream,
    run_cli,
    sidecars,
    until,
    wait_for,
    write_config,
)

PERMISSIONS = ROOT / "deploy" / "nats" / "permissions.conf"
APP_PERMISSIONS = ROOT / "deploy" / "nats" / "app-permissions.conf"
PASSWORDS = {"ANARCHON_NATS_PASSWORD": "sidecar-pw", "APP_NATS_PASSWORD": "app-pw"}
# An operator's user, for what an admin does by hand (lowering the stream).
ADMIN = "    {user: admin, password: admin-pw}\n"


def documented_block() -> str:
    """The server config SECURITY.md gives: the include and the authorization block."""
    text = (ROOT / "SECURITY.md").read_text()
    blocks = re.findall(r"```text\n(include \"permissions\.conf\"\n.*?)```", text, re.DOTALL)
    assert len(blocks) == 1, "SECURITY.md: one ```text block starting with the include"
    return str(blocks[0])


def guarded_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, admin: bool = False
) -> NatsServer:
    for key, value in PASSWORDS.items():
        monkeypatch.setenv(key, value)  # the block reads them from the server's environment
    block = documented_block()
    if admin:  # one more user in the same list, the documented ones unchanged
        block = block.replace("users = [\n", "users = [\n" + ADMIN, 1)
    server = NatsServer(tmp_path / "guarded", extra_conf=block)
    server.store_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(PERMISSIONS, server.store_dir / "permissions.conf")  # next to the config
    shutil.copy(APP_PERMISSIONS, server.store_dir / "app-permissions.conf")
    return server


def job(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "schedule": "* * * * * *", "jitter": "200ms", "max_late": "3s", **extra}


def violations(server: NatsServer) -> list[str]:
    return [
        line
        for line in server.log_path.read_text(errors="replace").splitlines()
        if "violation" in line.lower()  # "Publish Violation", "Subscription Violation"
    ]


def results(url: str, job_name: str) -> list[dict[str, Any]]:
    return [m.data for m in read_stream(url) if m.subject == f"cron.{job_name}.results"]


def test_the_fleet_and_every_command_work_under_the_documented_permissions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, http_app: RecordingApp
) -> None:
    server = guarded_server(tmp_path, monkeypatch, admin=True)
    server.start()
    try:
        _fleet_under_permissions(tmp_path, server, http_app)
    finally:
        server.stop()


def _fleet_under_permissions(tmp_path: Path, server: NatsServer, app: RecordingApp) -> None:
    admin_url = f"nats://admin:admin-pw@127.0.0.1:{server.port}"  # reads the stream too
    app.delay["/jobs/long"] = 2.5
    app.status["/jobs/flaky"] = 500
    config = {
        "nats": {"servers": [server.url], "user": "anarchon", "lease_ttl": "2s"},
        "target": {"url": app.url, "timeout": "10s"},
        "jobs": [
            job("long", overlap="skip"),
            job("flaky", schedule="*/5 * * * * *", retry={"max": 1, "backoff": "1s"}),
            job("quiet", schedule="*/2 * * * * *"),
        ],
    }
    env = {"ANARCHON_NATS_PASSWORD": "sidecar-pw"}
    cli = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))

    def command(*args: str) -> Any:
        res = run_cli(*args, "-c", cli, env=env)
        assert res.returncode == 0, (args, res.stdout, res.stderr)
        return res

    # Pause before any sidecar runs: it holds for the whole fleet.
    command("pause", "quiet", "--reason", "permissions test")
    with sidecars(tmp_path, [(f"s{i}", config, env) for i in range(2)]) as procs:
        wait_for(
            lambda: all(p.metric("anarchon_fleet_instances") == 2 for p in procs),
            20,
            what="both instances see each other (presence keys)",
        )
        wait_for(
            lambda: (
                len({r.headers["X-Anarchon-Attempt"] for r in app.requests_for("/jobs/flaky")}) == 2
            ),
            30,
            what="a failed attempt retried as attempt 2",
        )
        overlap = {"job": "long", "reason": "overlap"}
        wait_for(
            lambda: sum(p.metric("anarchon_runs_skipped_total", overlap) or 0 for p in procs) >= 2,
            30,
            what="overlap: skip took and honoured the lock",
        )
        assert not app.requests_for("/jobs/quiet")
        assert all(p.metric("anarchon_job_paused", {"job": "quiet"}) == 1 for p in procs)
        command("resume", "quiet")
        wait_for(lambda: app.requests_for("/jobs/quiet"), 20, what="resumed job runs")

        # Someone lowers the stream's duplicate window: a sidecar raises it back.
        async def lower() -> None:
            nc = await nats.connect(admin_url)
            try:
                js = nc.jetstream()
                info = await js.stream_info("CRON")
                info.config.duplicate_window = 1.0
                await js.update_stream(info.config)
            finally:
                await nc.close()

        asyncio.run(lower())
        wait_for(
            lambda: sum(p.metric("anarchon_stream_raised_total") or 0 for p in procs) >= 1,
            30,
            what="the stream raised back",
        )

        # The CLI: status, history, last-run, run-now, stream, check --connect.
        status = json.loads(command("status", "--json").stdout)
        assert len(status["instances"]) == 2
        assert status["state_bucket"]["problem"] is None
        history = command("history", "flaky", "--json").stdout
        flaky = [json.loads(line) for line in history.splitlines()]
        assert {r["status"] for r in flaky} >= {"failed"}
        command("last-run", "long")
        app.status["/jobs/quiet"] = 200
        command("run-now", "quiet")
        assert "CRON" in command("stream").stdout
        command("check", "--connect")
        for p in procs:
            assert p.ready(), p.log()
            assert p.metric("anarchon_nats_permission_denied_total", {"operation": "publish"}) == 0
            assert p.metric("anarchon_state_bucket_ok") == 1
    assert violations(server) == []
    assert app.max_in_flight["/jobs/long"] == 1
    skipped = [r for r in results(admin_url, "long") if r["status"] == "skipped"]
    assert skipped and all(r["error"].startswith("overlap") for r in skipped)


async def test_the_app_user_cannot_write_the_bucket_or_the_claims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = guarded_server(tmp_path, monkeypatch)
    server.start()
    try:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())

        sidecar = await nats.connect(server.url, user="anarchon", password="sidecar-pw")
        app = await nats.connect(server.url, user="app", password="app-pw", error_cb=on_error)
        try:
            from nats.js.api import KeyValueConfig

            kv = await sidecar.jetstream().create_key_value(
                KeyValueConfig(bucket="CRON_STATE", history=1, limit_marker_ttl=60)
            )
            slot = (int(time.time()) - 1) * 1000
            writes = {
                "$KV.CRON_STATE.paused.sync": b'{"by":"app"}',
                f"$KV.CRON_STATE.due.sync.{slot}.2": b'{"due_at":1}',
                "$KV.CRON_STATE.lock.sync": b'{"slot":1}',
                "cron.sync.claims": b'{"job":"sync"}',
            }
            for subject, data in writes.items():
                await app.publish(subject, data)
            await app.publish("$JS.API.STREAM.DELETE.KV_CRON_STATE", b"")
            await until(lambda: len(errors) >= 5, 10, what=f"5 violations, got {errors}")
            for subject in [*writes, "$JS.API.STREAM.DELETE.KV_CRON_STATE"]:
                assert any(f'publish to "{subject.lower()}"' in e for e in errors), (
                    subject,
                    errors,
                )
            status = await sidecar.jetstream().stream_info(f"KV_{kv._name}")
            assert status.state.messages == 0  # nothing the app sent was stored
        finally:
            await app.close()
            await sidecar.close()
    finally:
        server.stop()


def test_a_user_without_the_permissions_gets_one_clear_reason(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    # The sidecar's user may do everything but write the state bucket, as with the
    # block SECURITY.md gave before: every lease and presence write is refused.
    nats_server.stop()
    nats_server.extra_conf = (
        "authorization { users = [{user: anarchon, password: pw, permissions: {"
        ' publish: {allow: [">"], deny: ["$KV.CRON_STATE.>"]}, subscribe: {allow: [">"]}}}] }\n'
    )
    nats_server.start()
    http_app.delay["/jobs/long"] = 0.2
    config = {
        "nats": {"servers": [nats_server.url], "user": "anarchon", "lease_ttl": "2s"},
        "target": {"url": http_app.url},
        "jobs": [job("long", overlap="skip", max_late="20s")],
    }
    reader = f"nats://anarchon:pw@127.0.0.1:{nats_server.port}"  # may read the stream
    proc = Sidecar(tmp_path, "s0", config, {"ANARCHON_NATS_PASSWORD": "pw"}).start()
    try:

        def not_ready() -> str | None:
            try:
                code, body = proc.get("/readyz")
            except OSError:
                return None
            return body if code == 503 and "permissions violation" in body else None

        body = wait_for(not_ready, 30, what="readyz 503 naming the violation")
        assert "$KV.CRON_STATE." in body, body
        wait_for(
            lambda: len([r for r in results(reader, "long") if r["status"] == "failed"]) >= 3,
            30,
            what="three slots recorded failed",
        )
        denied = proc.metric("anarchon_nats_permission_denied_total", {"operation": "publish"})
        assert denied is not None and denied >= 3
    finally:
        proc.terminate()
    failed = [r for r in results(reader, "long") if r["status"] == "failed"]
    # Refused at once, not retried until the slot's deadline (max_late 20s).
    for r in failed:
        assert "lock.long" in r["error"] and "permissions violation" in r["error"], r
        late = parse_rfc3339(r["finished_at"]) - r["slot"] / 1000
        assert late < 3.0, (late, r)
    assert not http_app.requests_for("/jobs/long")  # overlap: skip never ran without its lock
    lines = [line for line in proc.log().splitlines() if "NATS refused" in line]
    assert len(lines) == 1, lines  # one line, rate-limited, naming the subject
    assert "$KV.CRON_STATE." in lines[0] and "deploy/nats/permissions.conf" in lines[0]
