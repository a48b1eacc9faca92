"""Leases and their keys against a real nats-server; the pure arithmetic of attempts.

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

from sidecar import state
from sidecar import watch as watching
from sidecar.clock import Clock
from sidecar.config import Config, parse_config
from sidecar.due import (
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
from sidecar.lease import CasConflict, KeyHeld, Keys, Lease, LostRuns, parse_due
from sidecar.metrics import Metrics
from sidecar.runs import ResultRecord, join_runs, publish_result
from sidecar.state import DELETED, EXPIRED, Removal, StateSpec, View, ensure_bucket
from sidecar.stream import StreamSpec, ensure_stream, stream_spec
from sidecar.watch import Watch
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
    metrics = Metrics(CollectorRegistry(), ("j",))
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
    metrics = Metrics(CollectorRegistry(), ("j",))
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
    metrics = Metrics(CollectorRegistry(), ("j",))
    async with Lease(keys, "run.j.1000", lease_value(), 3.0, metrics, Clock(), 1e12) as lease:
        await asyncio.sleep(2.5)  # the first renewal at 1 s, then 20, 40, 80, 160, 320 ms ...
        assert not lease.lost
    assert 3 <= keys.calls <= 10, keys.calls


async def test_a_lease_taken_over_is_lost_counted_and_not_deleted(nc: NATS) -> None:
    keys = Keys(await ensure_bucket(nc.jetstream(), SPEC))
    metrics = Metrics(CollectorRegistry(), ("j",))
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
    assert parse_due({"due_at": 12.5, "reason": "retry", "instance": "a"}) == (12.5, "retry", "a")
    assert parse_due({"due_at": True}) is None
    assert parse_due({"due_at": "soon"}) is None


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


def test_history_shows_one_row_per_attempt_and_a_real_result_wins_over_lost() -> None:
    def claim(token: str, attempt: int | None) -> bytes:
        body: dict[str, object] = {"job": "j", "slot": 60000, "token": token, "instance": "a"}
        if attempt is not None:
            body["attempt"] = attempt
        return json.dumps(body).encode()

    def result(token: str, status: str) -> bytes:
        return json.dumps({"job": "j", "token": token, "status": status}).encode()

    c, r = "cron.j.claims", "cron.j.results"
    messages = [
        (1, c, claim("t1", None)),
        (2, r, result("t1", "lost")),
        (3, c, claim("t2", 2)),
        (4, r, result("t2", "succeeded")),
        (5, r, result("t1", "succeeded")),  # the stopped runner came back
        (6, r, result("t1", "lost")),  # a lost copy after it changes nothing
        (7, c, claim("t3", None)),
        (8, r, result("t3", "skipped")),
    ]
    runs = join_runs("j", messages, "cron.").runs
    assert [(run.token, run.attempt, run.status) for run in runs] == [
        ("t3", 1, "skipped"),
        ("t2", 2, "succeeded"),
        ("t1", 1, "succeeded"),
    ]
    only_lost = join_runs("j", messages[:2], "cron.").runs
    assert only_lost[0].status == "lost"


def test_an_expiry_reported_as_an_empty_put_still_reads_as_an_expiry() -> None:
    """nats-io/nats.py#966: one release gave TTL markers as plain puts."""
    from nats.js.kv import KeyValue

    removed: list[Removal] = []
    view = View(on_removed=removed.append)
    value = json.dumps(lease_value()).encode()

    def entry(key: str, data: bytes, revision: int, op: str | None) -> KeyValue.Entry:
        return KeyValue.Entry("T", key, data, revision, None, None, op)

    view.apply_entry(entry("run.j.1000", value, 1, None))
    view.apply_entry(entry("paused.j", b"", 2, None))  # not a lease: a value like any
    view.apply_entry(entry("run.j.1000", b"", 3, None))
    assert [(r.key, r.how) for r in removed] == [("run.j.1000", EXPIRED)]
    assert "paused.j" in view.keys and "run.j.1000" not in view.keys


# ---------------------------------------------------------------- lost records


def lost_config() -> Config:
    return parse_config(
        {
            "instance_id": "judge",
            "jobs": [{"name": "j", "schedule": "* * * * * *", "max_late": "5s"}],
        },
        {},
    )


def result(slot: int, token: str) -> ResultRecord:
    return ResultRecord(
        job="j",
        slot=slot,
        token=token,
        instance="runner",
        status="succeeded",
        started_at="2026-12-03T00:00:00.000Z",
        finished_at="2026-12-03T00:00:01.000Z",
        duration_ms=1000,
        http_status=200,
        error=None,
    )


async def lost_runs(nc: NATS) -> tuple[LostRuns, StreamSpec, Metrics]:
    config = lost_config()
    spec = stream_spec(config)
    js = nc.jetstream()
    await ensure_stream(js, spec)
    metrics = Metrics(CollectorRegistry(), ("j",))
    return LostRuns(config, metrics, Clock(), js, spec, lambda: None), spec, metrics


def expired(slot: int, token: str, fence: int | None) -> Removal:
    value: dict[str, Any] = {**lease_value(token, "runner"), "slot": slot}
    if fence is not None:
        value["fence"] = fence
    return Removal(f"run.j.{slot}", state.Entry(value, 7), EXPIRED, time.time())


async def lost_records(nc: NATS, spec: StreamSpec) -> list[dict[str, Any]]:
    js = nc.jetstream()
    info = await js.stream_info(spec.name)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        data = json.loads((await js.get_msg(spec.name, seq)).data or b"{}")
        if data.get("status") == "lost":
            out.append(data)
    return out


async def test_a_lease_expiring_after_its_result_is_not_lost_though_later_results_hide_it(
    nc: NATS,
) -> None:
    """Runs overlap: the expired run's result is not the job's newest one."""
    runs, spec, metrics = await lost_runs(nc)
    js = nc.jetstream()
    claim = await js.publish("cron.j.claims", b'{"token":"t1"}', stream=spec.name)
    await publish_result(js, spec.name, spec.prefix, result(1000, "t1"))
    await publish_result(js, spec.name, spec.prefix, result(2000, "t2"))  # a later run's
    await runs.record(runs.jobs["j"], expired(1000, "t1", claim.seq))
    assert await lost_records(nc, spec) == []
    # A run that has no result is recorded lost, once.
    await runs.record(runs.jobs["j"], expired(3000, "t3", claim.seq))
    lost = await lost_records(nc, spec)
    assert [(r["slot"], r["token"]) for r in lost] == [(3000, "t3")]
    assert metrics.registry.get_sample_value("anarchon_runs_lost_total", {"job": "j"}) == 1


async def test_a_result_stored_between_the_check_and_the_lost_record_wins(nc: NATS) -> None:
    """The lost record expects the job's last result as read: the run's own result
    stored in between makes it look again, and refrain."""
    runs, spec, _ = await lost_runs(nc)
    js = nc.jetstream()
    recorded, last = await runs._recorded("j", "t1", None)
    assert (recorded, last) == (False, 0)
    await publish_result(js, spec.name, spec.prefix, result(1000, "t1"))  # the runner, late
    removal = expired(1000, "t1", None)
    value = removal.entry.value
    stored = await runs._publish(runs.jobs["j"], removal.key, value, 1000, 1, "t1", 0.0, last)
    assert stored is None  # refused: a result came in
    await runs.record(runs.jobs["j"], removal)
    assert await lost_records(nc, spec) == []
