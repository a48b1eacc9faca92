"""Fleet.caught_up on a real nats-server: after it, the view holds every change stored before.

A slot is judged with what the state bucket held at its instant
(docs/GUARANTEES.md, "One fate per slot"). Before judging, a sidecar makes
sure its watch delivered every change stored before the instant: one
presence write (the probe), then the watch's delivery of that write. The
probe wakes on the watch's delivery, not on a timer.
"""

from __future__ import annotations

import asyncio
import json

import nats
import pytest
from prometheus_client import CollectorRegistry

from sidecar.config.load import parse_config
from sidecar.core.clock import Clock
from sidecar.fleet import member
from sidecar.fleet.member import Fleet
from sidecar.obs.metrics import Metrics
from tests.support import NatsServer, until


async def test_the_view_holds_a_pause_stored_just_before_the_instant(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Were the probe to look only on its timer, it would not see its own write
    # come back before the caught_up deadline below.
    monkeypatch.setattr(member, "PROBE_LOOK", 30.0)
    cfg = parse_config(
        {
            "instance_id": "me",
            "nats": {"servers": nats_server.url},
            "jobs": [{"name": "j", "schedule": "* * * * * *"}],
        },
        {},
    )
    clock = Clock()
    fleet = Fleet(cfg, Metrics(CollectorRegistry(), ("j",)), clock)
    nc = await nats.connect(nats_server.url)
    other = await nats.connect(nats_server.url)
    try:
        fleet.start(nc.jetstream())
        await until(lambda: fleet.view.synced and fleet.bucket is not None, 20, "the bucket read")
        assert fleet.bucket is not None
        kv = await other.jetstream().key_value(fleet.bucket.spec.bucket)
        for round in range(20):
            # Another client pauses j; the instant is taken once the server stored it.
            value = {"by": "op", "at": "now", "round": round}
            await kv.put("paused.j", json.dumps(value).encode())
            instant = clock.wall()
            deadline = clock.monotonic() + 2.0
            assert await fleet.caught_up(instant, deadline), f"round {round}"
            assert clock.monotonic() < deadline
            entry = fleet.view.keys.get("paused.j")
            assert entry is not None and entry.value.get("round") == round, (round, entry)
            assert fleet.view.last_time > instant
            await asyncio.sleep(0.01)
    finally:
        await fleet.stop()
        await other.close()
        await nc.close()
