"""The audit trail (``actions.<job>``) cannot overflow, and an act is done and recorded, or
neither, with real sidecars, a real nats-server and a real app.

Forty page skips of 1,000 runs passed NATS's 1 MiB limit: the 41st took effect
and was answered 503 "cannot record the action ... MaxPayloadError()", and an
operator who tried again skipped another 1,000 runs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats

from sidecar.admin.actions import MAX_BYTES
from tests.admin.test_page import TOKEN, api, request
from tests.support import NatsServer, RecordingApp, base, job, sidecars, wait_for

GOOD = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}


def stored(url: str, key: str) -> bytes | None:
    async def go() -> bytes | None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value("CRON_STATE")
            try:
                return (await kv.get(key)).value
            except Exception:
                return None
        finally:
            await nc.close()

    return asyncio.run(go())


def put(url: str, key: str, value: Any) -> None:
    async def go() -> None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value("CRON_STATE")
            await kv.put(key, json.dumps(value).encode())
        finally:
            await nc.close()

    asyncio.run(go())


def with_token(tmp_path: Path, config: dict[str, Any]) -> dict[str, Any]:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"alice:{TOKEN}\n")
    return {**config, "admin": {"token_file": str(token_file)}}


def test_fifty_skips_of_a_thousand_runs_are_each_done_and_recorded_in_bounded_space(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = with_token(
        tmp_path, base(nats_server, http_app, [job("m", schedule="* * * * *", jitter="1s")])
    )
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        # What an older sidecar left: 35 skips listed slot by slot (about 0.9 MiB).
        legacy = {
            "at": "2026-01-01T00:00:00.000Z",
            "by": "bob",
            "action": "skip",
            "from": "127.0.0.1",
            "via": "page",
            "instance": "old",
            "detail": "skip " + ", ".join(["2026-01-01T00:00:00.000Z"] * 1000),
        }
        put(nats_server.url, "actions.m", {"actions": [legacy] * 35})
        answers = []
        for i in range(50):
            body = json.dumps({"count": 1000, "reason": f"freeze {i}"}).encode()
            code, _, answer = request(procs[i % 3], "/api/v1/jobs/m/skip", "POST", body, GOOD)
            answers.append((code, json.loads(answer)))
        raw = stored(nats_server.url, "actions.m")
        shown = wait_for(
            lambda: (
                (got := api(procs[1], "/api/v1/jobs/m")["actions"])
                and got[0]["detail"].endswith("freeze 49")
                and got
            ),
            10,
            what="the last skip on another replica's page",
        )
    assert [c for c, _ in answers] == [200] * 50, [a for c, a in answers if c != 200][:1]
    assert all(a["done"] and a["recorded"] for _, a in answers)
    assert all(len(a["skipped"]) == 1000 for _, a in answers)
    assert raw is not None and len(raw) <= MAX_BYTES, len(raw or b"")
    mine = [a for a in shown if a["by"] == "alice"]
    assert len(mine) == 50 and all(a["action"] == "skip" for a in mine)
    assert mine[0]["detail"].startswith("skip 1000 runs, ") and "freeze 49" in mine[0]["detail"]
    # The answers' slots follow each other: no skip was lost or made twice.
    slots = [s for _, a in answers for s in a["skipped"]]
    assert len(set(slots)) == 50_000 and slots == sorted(slots)


def test_an_act_that_cannot_be_recorded_is_not_done_and_says_so(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    # The sidecar's user may do everything but write the audit trail.
    nats_server.stop()
    nats_server.extra_conf = (
        "authorization { users = [{user: anarchon, password: pw, permissions: {"
        ' publish: {allow: [">"], deny: ["$KV.CRON_STATE.actions.>"]},'
        ' subscribe: {allow: [">"]}}}, {user: admin, password: admin-pw}] }\n'
    )
    nats_server.start()
    config = with_token(tmp_path, base(nats_server, http_app, [job("a", schedule="0 0 1 1 *")]))
    config["nats"]["user"] = "anarchon"
    admin = f"nats://admin:admin-pw@127.0.0.1:{nats_server.port}"
    with sidecars(tmp_path, [("s0", config, {"ANARCHON_NATS_PASSWORD": "pw"})]) as procs:
        body = json.dumps({"reason": "db migration"}).encode()
        code, _, answer = request(procs[0], "/api/v1/jobs/a/pause", "POST", body, GOOD)
        assert code == 503, answer
        said = json.loads(answer)
        assert said["done"] is False and said["recorded"] is False, said
        assert "not done" in said["error"]
        assert stored(admin, "paused.a") is None  # not paused
        assert not api(procs[0], "/api/v1/jobs/a")["paused"]
        code, _, answer = request(
            procs[0], "/api/v1/jobs/a/skip", "POST", json.dumps({"count": 3}).encode(), GOOD
        )
        assert code == 503 and json.loads(answer)["done"] is False, answer
        assert stored(admin, "skip.a") is None  # nothing skipped
    # Resuming what is not paused: 409, and no record of it is left.
    config["nats"].pop("user")
    nats_server.stop()
    nats_server.extra_conf = ""
    nats_server.start()
    with sidecars(tmp_path, [("s1", config, {})]) as procs:
        code, _, answer = request(procs[0], "/api/v1/jobs/a/resume", "POST", b"", GOOD)
        assert code == 409 and json.loads(answer) == {
            "error": "a was not paused",
            "done": False,
            "recorded": False,
        }, answer
        assert not api(procs[0], "/api/v1/jobs/a")["actions"]
        code, _, answer = request(procs[0], "/api/v1/jobs/a/pause", "POST", b"{}", GOOD)
        assert code == 200 and json.loads(answer)["recorded"] is True, answer
        assert [a["action"] for a in api(procs[0], "/api/v1/jobs/a")["actions"]] == ["pause"]
