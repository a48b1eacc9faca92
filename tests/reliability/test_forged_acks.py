"""Forged JetStream acks: can another client of the account make a sidecar win a lost slot?

A claim is published as a request; its reply subject travels with the message
to every subscriber of the claim subject. An "attacker" client answers every
claim it sees with a made-up ack (`{"stream":"CRON","seq":1}`, not a
duplicate) as fast as it can; a "winner" instance claims each slot first, then
the "victim" claims it too and should lose. Run once on an account without
permissions and once with the permissions block of SECURITY.md (read from the
file), and once where the other client may publish and read the stream's
subjects but answer nothing (it also re-publishes each claim it sees, the
victim's token included). Reports how many lost slots the victim took for
won; asserts none in the last two. Without them it happens now and then (a race with the
server's own ack), which SECURITY.md states with these figures.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg

from sidecar.core.clock import Clock
from sidecar.run.claim import Claimer
from sidecar.store.stream import StreamSpec, ensure_stream
from tests.reliability.conftest import Figures
from tests.support import ROOT, NatsServer

SLOTS = 1000
STREAM_ONLY = """authorization { users = [
  {user: anarchon, password: sidecar-pw, permissions: {
    publish: {allow: ["cron.>", "$JS.API.>"]}, subscribe: {allow: ["_INBOX.>"]}}}
  {user: app, password: app-pw, permissions: {
    publish: {allow: ["cron.>"]}, subscribe: {allow: ["cron.>"]}}}
] }
"""
FAKE_ACK = b'{"stream":"CRON","seq":1}'


def permissions_block() -> str:
    """SECURITY.md's block: it includes deploy/nats/*permissions.conf (copied beside)."""
    text = (ROOT / "SECURITY.md").read_text()
    (block,) = re.findall(r"```text\n(include \"permissions\.conf\"\n.*?)```", text, re.DOTALL)
    return str(block)


async def victim_wins(
    url: str, sidecar: dict[str, Any], attacker: dict[str, Any]
) -> tuple[int, int]:
    """(slots the victim took for won, fake acks the attacker sent)."""
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(url, **sidecar)
    bad = await nats.connect(url, error_cb=on_error, **attacker)
    sent = 0
    try:
        js = nc.jetstream()
        await ensure_stream(js, StreamSpec("CRON", "cron.", 300.0, 1000, None))

        async def answer(msg: Msg) -> None:
            nonlocal sent
            if msg.reply:
                await bad.publish(msg.reply, FAKE_ACK)
                sent += 1
                # And the claim again, token and msg id as seen: the stored claim
                # with the victim's token is what a duplicate ack is checked against.
                await bad.publish(msg.subject, msg.data, headers=msg.headers)

        await bad.subscribe("cron.>", cb=answer)
        await bad.flush()
        winner = Claimer(nc, js, "CRON", "cron.", "winner", Clock())
        victim = Claimer(nc, js, "CRON", "cron.", "victim", Clock())
        wins = 0
        base = int(time.time()) * 1000
        for i in range(SLOTS):
            slot = base + i * 1000
            assert (await winner.claim("job", slot, time.monotonic() + 10)).won
            wins += (await victim.claim("job", slot, time.monotonic() + 10)).won
        await asyncio.sleep(0.2)
        return wins, sent
    finally:
        await bad.close()
        await nc.close()


async def test_forged_acks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, figures: Figures
) -> None:
    open_server = NatsServer(tmp_path / "open")
    open_server.start()
    try:
        open_wins, open_sent = await victim_wins(open_server.url, {}, {})
    finally:
        open_server.stop()

    monkeypatch.setenv("ANARCHON_NATS_PASSWORD", "sidecar-pw")
    monkeypatch.setenv("APP_NATS_PASSWORD", "app-pw")
    guarded = NatsServer(tmp_path / "guarded", extra_conf=permissions_block())
    guarded.store_dir.mkdir(parents=True, exist_ok=True)
    for fragment in ("permissions.conf", "app-permissions.conf"):
        shutil.copy(ROOT / "deploy" / "nats" / fragment, guarded.store_dir)
    guarded.start()
    try:
        guarded_wins, guarded_sent = await victim_wins(
            guarded.url,
            {"user": "anarchon", "password": "sidecar-pw"},
            {"user": "app", "password": "app-pw"},
        )
    finally:
        guarded.stop()

    # Publish and read the stream's subjects, but not answer requests: the
    # "write access to the stream" of SECURITY.md's claim.
    stream_only = NatsServer(tmp_path / "stream-only", extra_conf=STREAM_ONLY)
    stream_only.start()
    try:
        stream_only_wins, stream_only_sent = await victim_wins(
            stream_only.url,
            {"user": "anarchon", "password": "sidecar-pw"},
            {"user": "app", "password": "app-pw"},
        )
    finally:
        stream_only.stop()

    figures.report(
        "forged-acks",
        slots=SLOTS,
        open_fake_acks=open_sent,
        open_lost_slots_won=open_wins,
        stream_only_fake_acks=stream_only_sent,
        stream_only_lost_slots_won=stream_only_wins,
        guarded_fake_acks=guarded_sent,
        guarded_lost_slots_won=guarded_wins,
    )
    # The attacker did answer (nearly: a loaded machine drops one now and then)
    # every claim it saw on the open account ...
    assert open_sent >= 2 * SLOTS - SLOTS // 20
    # ... and saw none with the permissions (so it had nothing to answer).
    assert guarded_sent == 0
    assert guarded_wins == 0
    # Seeing every claim and re-publishing it is not enough without answering.
    assert stream_only_sent >= 2 * SLOTS - SLOTS // 20
    assert stream_only_wins == 0
