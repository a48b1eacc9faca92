"""SECURITY.md, tried: what a client of the sidecar's NATS account can and cannot do.

Against a real nats-server. Without NATS permissions, another client of the
account can make every sidecar skip a slot (a forged claim) and put a forged
result in history, even over the real one. With the permissions SECURITY.md
gives (the block is read from the file itself, with the
permissions.conf it includes), the sidecar still does all it
needs, and the other user can neither publish claims or results, nor see the
claims (and their reply subjects), nor answer anybody's request.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from sidecar.config.load import Config, Secrets, load_secrets, parse_config
from sidecar.core.clock import Clock
from sidecar.ops import streamops
from sidecar.run.claim import MSG_ID, Claimer
from sidecar.store.stream import ensure_stream, stream_spec
from tests.support import ROOT, NatsServer, RecordingApp, free_port, run_cli, until

SLOT = 1_796_227_920_000


def sidecar_config(url: str, app: RecordingApp, **nats_keys: Any) -> Config:
    return parse_config(
        {
            "instance_id": "web-1",
            "nats": {"servers": [url], **nats_keys},
            "target": {"url": app.url},
            "jobs": [{"name": "sync", "schedule": "* * * * *"}],
        },
        {},
    )


@asynccontextmanager
async def client(url: str, **options: Any) -> AsyncIterator[NATS]:
    nc = await nats.connect(url, **options)
    try:
        yield nc
    finally:
        await nc.close()


def claimer(nc: NATS, config: Config, instance: str) -> Claimer:
    spec = stream_spec(config)
    return Claimer(nc, nc.jetstream(), spec.name, spec.prefix, instance, Clock())


# ------------------------------------------------- an account without permissions


async def test_a_forged_claim_makes_every_sidecar_skip_the_slot(
    nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = sidecar_config(nats_server.url, http_app)
    async with client(nats_server.url) as nc:
        js = nc.jetstream()
        await ensure_stream(js, stream_spec(config))
        forged = {"job": "sync", "slot": SLOT, "token": "f" * 32, "instance": "forger"}
        await js.publish(
            "cron.sync.claims", json.dumps(forged).encode(), headers={MSG_ID: f"sync:{SLOT}"}
        )
        for instance in ("web-1", "web-2"):
            claim = await claimer(nc, config, instance).claim("sync", SLOT, time.monotonic() + 5)
            assert not claim.won, instance
    history = await streamops.history(config, Secrets(), "sync")
    (run,) = history.runs
    assert (run.instance, run.status) == ("forger", "running")


async def test_a_forged_result_replaces_the_real_one_in_history(
    nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.status["/jobs/sync"] = 500
    http_app.delay["/jobs/sync"] = 0.3
    config = sidecar_config(nats_server.url, http_app)
    async with client(nats_server.url) as forger:
        js = forger.jetstream()

        async def forge(msg: Msg) -> None:
            claim = json.loads(msg.data)
            result = {
                **claim,
                "status": "succeeded",
                "http_status": 200,
                "error": None,
                "started_at": claim["claimed_at"],
                "finished_at": claim["claimed_at"],
                "duration_ms": 1,
            }
            # The sidecar's own msg id for this result: its real one becomes a duplicate.
            msg_id = f"sync:result:{claim['token']}"
            await js.publish(
                "cron.sync.results", json.dumps(result).encode(), headers={MSG_ID: msg_id}
            )

        await forger.subscribe("cron.sync.claims", cb=forge)
        await forger.flush()
        done = await streamops.run_now(config, Secrets(), "sync", Clock())
    assert (done.result.ok, done.result.http_status) == (False, 500)
    (run,) = (await streamops.history(config, Secrets(), "sync")).runs
    assert (run.token, run.status, run.http_status) == (done.token, "succeeded", 200)


# ------------------------------------------------ the permissions SECURITY.md gives


def permissions_block() -> str:
    text = (ROOT / "SECURITY.md").read_text()
    blocks = re.findall(r"```text\n(include \"permissions\.conf\"\n.*?)```", text, re.DOTALL)
    assert len(blocks) == 1, "SECURITY.md: one ```text block starting with the include"
    return str(blocks[0])


@pytest.fixture
def guarded_nats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NatsServer]:
    # The block reads the passwords from the server's environment, and includes
    # deploy/nats/permissions.conf and app-permissions.conf, copied next to
    # the server's config.
    monkeypatch.setenv("ANARCHON_NATS_PASSWORD", "sidecar-pw")
    monkeypatch.setenv("APP_NATS_PASSWORD", "app-pw")
    server = NatsServer(tmp_path / "guarded", extra_conf=permissions_block())
    server.store_dir.mkdir(parents=True, exist_ok=True)
    for fragment in ("permissions.conf", "app-permissions.conf"):
        shutil.copy(ROOT / "deploy" / "nats" / fragment, server.store_dir)
    server.start()
    yield server
    server.stop()


async def test_with_the_documented_permissions_others_cannot_touch_the_claims(
    guarded_nats: NatsServer, http_app: RecordingApp
) -> None:
    url = guarded_nats.url
    config = sidecar_config(url, http_app, user="anarchon")
    secrets = load_secrets(config, {"ANARCHON_NATS_PASSWORD": "sidecar-pw"})
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    async with client(url, user="app", password="app-pw", error_cb=on_error) as app_nc:
        seen: list[str] = []

        async def record(msg: Msg) -> None:
            seen.append(msg.subject)

        await app_nc.subscribe(">", cb=record)
        await app_nc.flush()

        # The sidecar does all it needs: create the stream, claim, trigger, record, read.
        done = await streamops.run_now(config, secrets, "sync", Clock())
        assert done.result.ok and done.recorded
        async with client(url, user="anarchon", password="sidecar-pw") as nc:
            won = await claimer(nc, config, "web-1").claim("sync", SLOT, time.monotonic() + 5)
            lost = await claimer(nc, config, "web-2").claim("sync", SLOT, time.monotonic() + 5)
            assert (won.won, lost.won) == (True, False)
        history = await streamops.history(config, secrets, "sync")
        assert {r.status for r in history.runs} == {"succeeded", "running"}

        # The other user saw no claim, so no reply subject of one (its `>` works otherwise),
        await app_nc.publish("app.ping", b"")
        await until(lambda: "app.ping" in seen, what="the app's own message")
        # Nor any JetStream request of the sidecars or answer to one.
        assert set(seen) == {"app.ping"}, sorted(set(seen))

        # ... cannot subscribe to them, publish a claim, or answer a request.
        await app_nc.subscribe("cron.>")
        forged = json.dumps({"job": "sync", "slot": SLOT + 60_000, "token": "f" * 32})
        await app_nc.publish(
            "cron.sync.claims", forged.encode(), headers={MSG_ID: f"sync:{SLOT + 60_000}"}
        )
        await app_nc.publish("_INBOX.abc.def", b'{"stream":"CRON","seq":1}')  # a forged ack
        await app_nc.publish("$JS.API.STREAM.DELETE.CRON", b"")
        await until(lambda: len(errors) >= 4, what=f"4 permission violations, got {errors}")
        assert all("permissions violation" in e for e in errors), errors
        for what in ('subscription to "cron.>"', '"cron.sync.claims"', '"_inbox.abc.def"'):
            assert any(what in e for e in errors), (what, errors)
        assert any("$js.api.stream.delete.cron" in e for e in errors), errors

    # The forged claim was not stored: the sidecar wins that slot.
    async with client(url, user="anarchon", password="sidecar-pw") as nc:
        claim = await claimer(nc, config, "web-1").claim(
            "sync", SLOT + 60_000, time.monotonic() + 5
        )
        assert claim.won


def test_config_repr_hides_header_values(http_app: RecordingApp) -> None:
    # Headers may carry the app's credentials (Authorization); a repr may reach a log.
    config = parse_config(
        {
            "target": {"url": http_app.url, "headers": {"Authorization": "Bearer tgt-secret"}},
            "jobs": [
                {
                    "name": "sync",
                    "schedule": "* * * * *",
                    "request": {"headers": {"X-Api-Key": "job-secret"}},
                }
            ],
        },
        {},
    )
    text = repr(config)
    assert "tgt-secret" not in text and "job-secret" not in text
    assert config.jobs[0].request.headers["X-Api-Key"] == "job-secret"


@pytest.mark.parametrize("signed", [False, True])
def test_unsigned_triggers_to_a_remote_app_are_warned_about(tmp_path: Path, signed: bool) -> None:
    config = tmp_path / "c.yaml"
    target: dict[str, Any] = {"url": "http://192.0.2.1:8080", "allow_remote": True}
    config.write_text(
        json.dumps(
            {
                "nats": {"servers": f"nats://127.0.0.1:{free_port()}", "connect_timeout": "200ms"},
                "metrics": {"listen": "127.0.0.1:0"},
                "target": target,
                "jobs": [
                    {"name": "far", "schedule": "* * * * *"},
                    {
                        "name": "near",
                        "schedule": "* * * * *",
                        "request": {"url": "http://127.0.0.1:8080"},
                    },
                ],
            }
        )
    )
    env = {"ANARCHON_SIGNING_SECRET": "k"} if signed else {}
    res = run_cli("run", "-c", str(config), env=env)
    assert res.returncode == 3, res.stderr  # NATS is not there
    warned = [line for line in res.stderr.splitlines() if "without a signature" in line]
    if signed:
        assert not warned, res.stderr
    else:
        (line,) = warned
        assert "WARNING" in line and "job(s) far trigger a remote app" in line, line
