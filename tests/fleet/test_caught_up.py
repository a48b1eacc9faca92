"""Fleet.caught_up (sidecar/fleet/freshness.py) on a real nats-server: the view then
holds every change stored before.

A slot is judged with what the state bucket held at its instant
(docs/GUARANTEES.md, "One fate per slot"). Before judging, a sidecar makes
sure its watch delivered every change stored before the instant: one
presence write (the probe), then the watch's delivery of that write. The
probe wakes on the watch's delivery, not on a timer.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nats
import pytest
from nats.js.api import KeyValueConfig, StorageType
from prometheus_client import CollectorRegistry

from sidecar.config.jobset import JobSet
from sidecar.config.load import parse_config
from sidecar.core.clock import Clock
from sidecar.fleet import freshness
from sidecar.fleet.member import Fleet
from sidecar.obs.metrics import Metrics
from sidecar.store import watch
from tests.support import NatsServer, until


def fleet_of(nats_server: NatsServer, clock: Clock) -> Fleet:
    """The Fleet of instance "me" with one job, j, every second."""
    cfg = parse_config(
        {
            "instance_id": "me",
            "nats": {"servers": nats_server.url},
            "jobs": [{"name": "j", "schedule": "* * * * * *"}],
        },
        {},
    )
    return Fleet(cfg, Metrics(CollectorRegistry()), clock, jobs=JobSet(cfg.jobs))


async def test_the_view_holds_a_pause_stored_just_before_the_instant(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Were the probe to look only on its timer, it would not see its own write
    # come back before the caught_up deadline below.
    monkeypatch.setattr(freshness, "PROBE_LOOK", 30.0)
    clock = Clock()
    fleet = fleet_of(nats_server, clock)
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


@pytest.mark.parametrize("ttl", [True, False], ids=["presence-write", "bucket-without-ttls"])
async def test_a_host_whose_clock_runs_ahead_waits_for_the_servers_instant(
    nats_server: NatsServer, ttl: bool
) -> None:
    # A pause stored 0.2 s before the instant by the server's clock (the test's),
    # while the sidecar's clock runs 0.8 s ahead: it must wait until the server
    # reaches the instant and see the pause, not judge by its own clock.
    other = await nats.connect(nats_server.url)
    if not ttl:  # made before the sidecar, as an operator might: the probe asks STREAM.INFO
        await other.jetstream().create_key_value(
            KeyValueConfig(bucket="CRON_STATE", history=1, storage=StorageType.FILE)
        )
    clock = Clock(offset=0.8)
    fleet = fleet_of(nats_server, clock)
    nc = await nats.connect(nats_server.url)
    try:
        fleet.start(nc.jetstream())
        await until(lambda: fleet.view.synced and fleet.bucket is not None, 20, "the bucket read")
        assert fleet.bucket is not None and fleet.bucket.ttl is ttl
        kv = await other.jetstream().key_value(fleet.bucket.spec.bucket)
        for round in range(3):
            instant = time.time() + 0.5
            judged = asyncio.create_task(fleet.caught_up(instant, clock.monotonic() + 3.0))
            await asyncio.sleep(max(0.0, instant - 0.2 - time.time()))
            await kv.put("paused.j", json.dumps({"by": "op", "round": round}).encode())
            assert await judged, f"round {round}"
            assert time.time() >= instant, f"round {round}: judged before the server's instant"
            entry = fleet.view.keys.get("paused.j")
            assert entry is not None and entry.value.get("round") == round, (round, entry)
    finally:
        await fleet.stop()
        await other.close()
        await nc.close()


async def test_a_slot_due_while_the_bucket_is_read_again_waits_for_the_read(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-read after a reconnect stops the watch first; while it reads, a pause is
    stored and a slot comes. The probe cannot finish (no watch follows the bucket),
    and the view from before does not hold the pause: the slot waits for the read
    (the job loop's ``Freshness.reread``), and then the pause is in the view."""
    clock = Clock()
    fleet = fleet_of(nats_server, clock)
    nc = await nats.connect(nats_server.url)
    other = await nats.connect(nats_server.url)
    reading = asyncio.Event()
    go_on = asyncio.Event()
    read_initial = watch.read_initial

    async def slow_read(*args: Any) -> None:
        reading.set()
        await go_on.wait()
        await read_initial(*args)

    try:
        fleet.start(nc.jetstream())
        await until(lambda: fleet.view.synced and fleet.bucket is not None, 20, "the bucket read")
        assert fleet.bucket is not None and not fleet.freshness.rereading
        kv = await other.jetstream().key_value(fleet.bucket.spec.bucket)
        monkeypatch.setattr(watch, "read_initial", slow_read)
        fleet.reconnected()  # as after a reconnect: the watch is read again
        await asyncio.wait_for(reading.wait(), 10)
        await kv.put("paused.j", json.dumps({"by": "op"}).encode())
        slot = clock.wall_ms() + 1
        assert fleet.freshness.rereading
        assert not await fleet.caught_up(slot / 1000, clock.monotonic() + 0.3)
        assert fleet.blocked("j", slot) is None  # the view from before: no pause in it
        waited = asyncio.create_task(fleet.freshness.reread(clock.wall() + 10, asyncio.Event()))
        await asyncio.sleep(0.3)
        assert not waited.done()  # the read is not in yet
        go_on.set()
        assert await asyncio.wait_for(waited, 10)
        assert not fleet.freshness.rereading
        blocked = fleet.blocked("j", slot)
        assert blocked is not None and blocked[0] == "paused", blocked
    finally:
        go_on.set()
        await fleet.stop()
        await other.close()
        await nc.close()
