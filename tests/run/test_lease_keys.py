"""Leases (sidecar/run/lease.py) and the state bucket's writer (sidecar/store/kv.py) against a
real nats-server; the pure arithmetic of attempts and due keys.

Create over an expired key (nats-py's own create refuses it), renewals past
the TTL, a spurious compare-and-set conflict taken for what it is, a lease
taken over, delete markers that expire, and a watch that missed an expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from sidecar.core.clock import Clock
from sidecar.core.errors import CasConflict, KeyHeld
from sidecar.obs.metrics import Metrics
from sidecar.run.lease import Lease
from sidecar.store import watch as watching
from sidecar.store.bucketcheck import StateSpec
from sidecar.store.kv import Keys
from sidecar.store.state import DELETED, EXPIRED, Removal, View, ensure_bucket
from sidecar.store.watch import Watch
from sidecar.when.attempts import (
    claim_msg_id,
    due_key,
    due_key_ttl,
    failed_replica_wait,
    lease_job,
    lost_msg_id,
    may_follow,
    parse_due_key,
    retry_due_at,
    run_key,
)
from tests.support import until

# Markers live 1 s here, so that delete markers can be seen to go away.
SPEC = StateSpec("T_STATE", 1, 1.0)


def lease_value(token: str = "t1", instance: str = "me") -> dict[str, object]:
    return {"job": "j", "slot": 1000, "attempt": 1, "token": token, "instance": instance}


def failures(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value("anarchon_lease_renewal_failures_total", {"job": "j"})
    return value or 0.0


async def test_create_works_over_an_expired_and_a_deleted_key_and_refuses_a_live_one(
    nc: NATS,
) -> None:
    keys = Keys(await ensure_bucket(nc.jetstream(), SPEC))
    first = await keys.create("lock.j", lease_value(), ttl=1)
    # Our own create asked again (its answer was late): ours, not held by another.
    assert await keys.create("lock.j", lease_value(), ttl=1) == first
    with pytest.raises(KeyHeld) as held:
        await keys.create("lock.j", lease_value("t2"), ttl=1)
    assert held.value.value["token"] == "t1"
    # Expired: the server's MaxAge marker is the key's last message.
    deadline = time.monotonic() + 5
    while True:
        last = await keys.last("lock.j")
        if last is not None and last[1] is None:
            break
        assert time.monotonic() < deadline, "the key did not expire"
        await asyncio.sleep(0.1)
    revision = await keys.create("lock.j", lease_value("t3"), ttl=5)
    await keys.delete("lock.j", revision)
    await keys.create("lock.j", lease_value("t4"), ttl=5)
    last = await keys.last("lock.j")
    assert last is not None and last[1] is not None and last[1]["token"] == "t4"


async def test_a_lease_outlives_its_ttl_while_renewed_and_its_delete_marker_expires(
    nc: NATS,
) -> None:
    keys = Keys(await ensure_bucket(nc.jetstream(), SPEC))
    metrics = Metrics(CollectorRegistry())
    clock = Clock()
    async with Lease(keys, "run.j.1000", lease_value(), 1.0, metrics, clock, 1e12) as lease:
        await asyncio.sleep(2.6)  # more than twice the TTL
        last = await keys.last("run.j.1000")
        assert last is not None and last[1] is not None, "the lease expired while renewed"
        assert lease.renewals >= 5
    last = await keys.last("run.j.1000")
    assert last is not None and last[1] is None  # deleted
    assert failures(metrics) == 0
    # The delete marker goes away too: the bucket keeps nothing per finished run.
    info = await nc.jetstream().stream_info(SPEC.stream)
    deadline = time.monotonic() + 8
    while info.state.messages:
        assert time.monotonic() < deadline, f"{info.state.messages} message(s) left"
        await asyncio.sleep(0.2)
        info = await nc.jetstream().stream_info(SPEC.stream)


async def test_a_spurious_conflict_is_checked_and_the_lease_kept(nc: NATS) -> None:
    keys = Keys(await ensure_bucket(nc.jetstream(), SPEC))
    metrics = Metrics(CollectorRegistry())
    async with Lease(keys, "run.j.1000", lease_value(), 1.0, metrics, Clock(), 1e12) as lease:
        # Our own value written again behind the lease's back (as when a
        # renewal's ack got lost): its revision is stale, the key still ours.
        await keys._publish("run.j.1000", json.dumps(lease_value()).encode(), {}, 1.0)
        await asyncio.sleep(1.5)
        assert not lease.lost
        last = await keys.last("run.j.1000")
        assert last is not None and last[1] is not None
    assert failures(metrics) == 0
    last = await keys.last("run.j.1000")
    assert last is not None and last[1] is None


async def test_spurious_conflicts_in_a_row_back_off(nc: NATS) -> None:
    """A stale read after a conflict conflicts again: renewals back off, no spin."""

    class StaleKeys(Keys):
        calls = 0

        async def renew(self, key: str, value: dict[str, Any], revision: int, ttl: float) -> int:
            self.calls += 1
            raise CasConflict(key)  # every renewal conflicts; the read says it is ours

    keys = StaleKeys(await ensure_bucket(nc.jetstream(), SPEC))
    metrics = Metrics(CollectorRegistry())
    async with Lease(keys, "run.j.1000", lease_value(), 3.0, metrics, Clock(), 1e12) as lease:
        await asyncio.sleep(2.5)  # the first renewal at 1 s, then 20, 40, 80, 160, 320 ms ...
        assert not lease.lost
    assert 3 <= keys.calls <= 10, keys.calls


async def test_a_lease_taken_over_is_lost_counted_and_not_deleted(nc: NATS) -> None:
    keys = Keys(await ensure_bucket(nc.jetstream(), SPEC))
    metrics = Metrics(CollectorRegistry())
    async with Lease(keys, "lock.j", lease_value(), 1.0, metrics, Clock(), 1e12) as lease:
        other = json.dumps(lease_value("t9", "other")).encode()
        await keys._publish("lock.j", other, {}, 10.0)
        await until(lambda: lease.lost, 5)
    assert failures(metrics) == 1
    last = await keys.last("lock.j")
    assert last is not None and last[1] is not None and last[1]["token"] == "t9"


async def test_an_expiry_missed_by_a_silent_watch_is_reported_after_the_resync(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watching, "WATCHDOG_EVERY", 0.3)
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    keys = Keys(bucket)
    removed: list[Removal] = []
    view = View(on_removed=removed.append)
    watch = Watch(bucket, view)
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: view.synced and watch._pump is not None, 10)
        await keys.create("run.j.1000", lease_value(), ttl=1)
        rev = await keys.create("run.j.2000", lease_value("t2"), ttl=30)
        await until(lambda: "run.j.2000" in view.keys, 5)
        assert watch._pump is not None
        watch._pump.cancel()  # silent from now on
        await keys.delete("run.j.2000", rev)
        # The watchdog sees the bucket ahead of the view and re-reads it.
        await until(lambda: len(removed) == 2, 10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    how = {r.key: r.how for r in removed}
    assert how == {"run.j.1000": EXPIRED, "run.j.2000": DELETED}
    expired = next(r for r in removed if r.key == "run.j.1000")
    assert expired.entry.value["token"] == "t1" and expired.at is not None


# ---------------------------------------------------------------------- pure


def test_ids_and_keys_of_attempts() -> None:
    assert claim_msg_id("sync", 60000, "tok", manual=False) == "sync:60000"
    assert claim_msg_id("sync", 60000, "tok", manual=False, attempt=1) == "sync:60000"
    assert claim_msg_id("sync", 60000, "tok", manual=False, attempt=3) == "sync:60000:a3"
    assert claim_msg_id("sync", 60000, "tok", manual=True, attempt=3) == "sync:manual:tok"
    assert lost_msg_id("sync", 60000, 2) == "sync:60000:2:lost"
    assert run_key("sync", 60000, 1) == "run.sync.60000"
    assert run_key("sync", 60000, 2) == "run.sync.60000.2"
    assert lease_job("run.sync.60000.2") == lease_job("lock.sync") == "sync"
    assert lease_job("paused.sync") is None
    key = due_key("sync", 60000, 2)
    parsed = parse_due_key(key)
    assert parsed is not None and (parsed.job, parsed.slot, parsed.attempt) == ("sync", 60000, 2)
    for bad in ("due.sync.60000", "due.sync.x.2", "due.sync.60000.1", "run.sync.1.2", "due..1.2"):
        assert parse_due_key(bad) is None, bad


def test_backoff_limits_and_windows() -> None:
    # backoff * 2^(N-1) after attempt N failed.
    assert retry_due_at(100.0, 30.0, 1) == 130.0
    assert retry_due_at(100.0, 30.0, 2) == 160.0
    assert retry_due_at(100.0, 30.0, 3) == 220.0
    # retry.max 2: attempts 1 and 2 may be followed, attempt 3 is the last.
    assert may_follow(1, 2) and may_follow(2, 2) and not may_follow(3, 2)
    assert not may_follow(1, 0)
    assert failed_replica_wait(0.2) == 0.5 and failed_replica_wait(2.0) == 2.0
    # A due key outlives every replica's last chance to claim its attempt.
    assert due_key_ttl(200.0, 100.0, 2.0, 60.0) > 100.0 + 60.0 + 2.0
    assert due_key_ttl(0.0, 100.0, 0.0, 0.0) == 1.0
