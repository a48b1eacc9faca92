"""The state bucket and its view, against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import KeyValueConfig

from sidecar.store import watch as watching
from sidecar.store.bucketcheck import StateSpec
from sidecar.store.digests import mismatched_calendars, mismatched_jobs
from sidecar.store.kv import put_json, put_with_ttl
from sidecar.store.state import Bucket, Entry, View, ensure_bucket
from sidecar.store.watch import Stall, Watch
from tests.support import NatsServer, until

SPEC = StateSpec("CRON_STATE", 1, 60.0)


@contextlib.asynccontextmanager
async def running(bucket: Bucket, view: View) -> AsyncIterator[Watch]:
    """`Watch(bucket, view)` running for the block, then cancelled."""
    watch = Watch(bucket, view)
    task = asyncio.create_task(watch.run())
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_bucket_is_created_with_ttls_and_history_1(nc: NATS) -> None:
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    assert bucket.ttl and bucket.ttl_problem is None
    info = await nc.jetstream().stream_info("KV_CRON_STATE")
    assert info.config.max_msgs_per_subject == 1
    assert info.config.allow_msg_ttl
    # Opening it again changes nothing.
    again = await ensure_bucket(nc.jetstream(), SPEC)
    assert again.ttl


async def test_a_bucket_without_ttls_is_used_and_says_so(nc: NATS) -> None:
    await nc.jetstream().create_key_value(KeyValueConfig(bucket="CRON_STATE", history=1))
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    assert not bucket.ttl
    assert bucket.ttl_problem is not None
    # nats-py's defaults allow message TTLs but leave out the marker TTL: the line
    # names what is missing, not allow_msg_ttl as well.
    assert "without a marker TTL (subject_delete_marker_ttl)" in bucket.ttl_problem
    assert "allow_msg_ttl" not in bucket.ttl_problem
    await put_json(bucket.kv, "paused.sync", {"by": "me"})  # pause still works


async def test_a_key_written_with_a_ttl_expires_and_the_view_drops_it(nc: NATS) -> None:
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    view = View()
    async with running(bucket, view):
        await until(lambda: view.synced, 10)
        await put_with_ttl(bucket, "instance.a", {"version": "1"}, 1.0)
        await until(lambda: "a" in view.instances(), 5)
        await until(lambda: "a" not in view.instances(), 8)  # the MaxAge marker


async def test_a_watch_that_misses_updates_is_caught_by_the_watchdog(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watching, "WATCHDOG_EVERY", 0.3)
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    view = View()
    async with running(bucket, view) as watch:
        await until(lambda: view.synced and watch._pump is not None, 10)
        # The watch goes silent (as nats-py's ordered consumer can): updates
        # stop reaching the view.
        assert watch._pump is not None
        watch._pump.cancel()
        await put_json(bucket.kv, "paused.sync", {"by": "ops"})
        await until(lambda: view.paused("sync") is not None, 5)
        assert view.paused("sync").value == {"by": "ops"}  # type: ignore[union-attr]


def test_the_watchdog_calls_a_watch_stalled_only_when_it_misses_an_old_write() -> None:
    busy = Stall(delivered=10)
    # Always a write or two on the way, but each look's writes delivered by the next.
    for last_seq, delivered in [(12, 11), (15, 14), (19, 17), (25, 24), (30, 29)]:
        assert not busy.look(last_seq, delivered)
    silent = Stall(delivered=10)
    assert not silent.look(12, 10)  # nothing old missed yet
    assert not silent.look(13, 10)  # 12 not delivered a look later: behind once
    assert silent.look(14, 10)  # twice in a row: stalled
    caught_up = Stall(delivered=10)
    assert not caught_up.look(12, 10)
    assert not caught_up.look(13, 10)
    assert not caught_up.look(14, 13)  # it delivered what the bucket had: not stalled


async def test_a_busy_bucket_is_not_taken_for_a_stalled_watch(
    nc: NATS,
    nats_server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bucket written all the time (a hundred sidecars' presence and leases) always
    has a newest write still on its way to the watch; that is not a stall, and a
    re-read of the whole bucket by every sidecar every few seconds costs."""
    monkeypatch.setattr(watching, "WATCHDOG_EVERY", 0.2)
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    view = View()
    watch = Watch(bucket, view)
    task = asyncio.create_task(watch.run())
    writer = await nats.connect(nats_server.url)  # the other sidecars
    other = await writer.jetstream().key_value(SPEC.bucket)
    written = 0
    try:
        await until(lambda: view.synced and watch._pump is not None, 10)
        pump = watch._pump
        end = asyncio.get_running_loop().time() + 3.0
        while asyncio.get_running_loop().time() < end:
            # Ten in flight at a time, as from many writers at once.
            batch = [
                put_json(other, f"instance.i{(written + i) % 50}", {"n": i}) for i in range(10)
            ]
            await asyncio.gather(*batch)
            written += len(batch)
        await until(lambda: view.last_revision >= written, 5)
        assert watch._pump is pump  # the same watch all along: never re-read
    finally:
        await writer.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert written > 300
    assert "fell behind" not in caplog.text


async def test_resync_drops_keys_deleted_while_the_watch_was_away(nc: NATS) -> None:
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    await put_json(bucket.kv, "paused.sync", {"by": "ops"})
    changes: list[str] = []
    view = View(on_change=changes.append)
    async with running(bucket, view) as watch:
        await until(lambda: view.paused("sync") is not None, 10)
        assert watch._pump is not None
        watch._pump.cancel()  # away
        await bucket.kv.delete("paused.sync")
        watch.resync()  # what a reconnect does
        await until(lambda: view.paused("sync") is None, 10)
        assert "" in changes  # one recount after the re-sync


async def test_a_held_job_key_keeps_no_bytes_until_it_changes_or_is_read_again(nc: NATS) -> None:
    """issue 49: the bytes of a job key whose job runs are let go (View.hold); a new
    value brings them back, a re-sync too (its job is judged again then)."""
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    first = await bucket.kv.put("job.a", json.dumps({"name": "a", "by": "ops"}).encode())
    await bucket.kv.put("job.b", json.dumps({"name": "b"}).encode())
    changes: list[str] = []
    view = View(on_change=changes.append)
    async with running(bucket, view) as watch:
        await until(lambda: view.synced and "job.b" in view.keys, 10)
        view.hold("job.a", first + 1)  # not its revision: kept
        assert not view.keys["job.a"].held and view.keys["job.a"].value["by"] == "ops"
        view.hold("job.a", first)
        entry = view.keys["job.a"]
        assert entry.held and entry.value == {} and entry.raw is not None
        assert entry == Entry({"name": "a", "by": "ops"}, first)  # the same revision
        assert entry != Entry({"name": "a", "by": "ops"}, first + 5)
        assert not view.keys["job.b"].held

        # A re-sync: the fresh view's bytes, the same revision told as no change.
        assert watch._pump is not None
        watch._pump.cancel()
        changes.clear()
        watch.resync()
        await until(lambda: "" in changes, 10)
        assert "job.a" not in changes
        assert view.keys["job.a"].value == {"name": "a", "by": "ops"}
        view.hold("job.a", first)
        # A new value comes with its bytes.
        second = await bucket.kv.put("job.a", json.dumps({"name": "a", "by": "dev"}).encode())
        await until(lambda: view.keys["job.a"].revision == second, 10)
        assert not view.keys["job.a"].held and view.keys["job.a"].value["by"] == "dev"


def test_mismatched_calendars() -> None:
    """Only instances that name a calendar are compared; hostile values are ignored."""
    a = {"calendars": {"hol": "1a", "freeze": "2b"}}
    assert mismatched_calendars({"s1": a, "s2": {"calendars": {"hol": "1a"}}, "old": {}}) == set()
    odd = {"calendars": {"hol": "9z", "freeze": "2b", 3: "x"}}
    assert mismatched_calendars({"s1": a, "s2": odd}) == {"hol"}
    assert mismatched_calendars({"s1": a, "s2": {"calendars": ["hol"]}}) == set()
    assert mismatched_calendars({"s1": a, "s2": {"calendars": {"hol": 5}}}) == set()


def test_mismatched_jobs() -> None:
    same = {"a": {"jobs": {"x": "1", "y": "2"}}, "b": {"jobs": {"x": "1"}}}
    assert mismatched_jobs(same) == set()
    odd = {**same, "c": {"jobs": {"x": "9", "y": "2"}}, "d": {"jobs": "junk"}}
    assert mismatched_jobs(odd) == {"x"}


def test_hostile_values_read_as_empty() -> None:
    view = View()
    view.apply("paused.x", b"[1,2]", 3, False)
    view.apply("instance.y", b"\xff", 4, False)
    view.apply("instance.z", json.dumps({"jobs": {}}).encode(), 5, False)
    assert view.paused("x") is not None and view.paused("x").value == {}  # type: ignore[union-attr]
    assert view.instances() == {"y": {}, "z": {"jobs": {}}}
    assert view.last_revision == 5


def test_instances_with_the_same_settings_share_one_jobs_mapping() -> None:
    """A hundred replicas of a thousand jobs keep one copy, and compare in one pass."""
    view = View()
    jobs = {f"job-{i}": "abc" for i in range(1000)}
    for i in range(100):
        view.apply(f"instance.r{i}", json.dumps({"jobs": jobs}).encode(), i + 1, False)
    values = view.instances()
    assert len({id(v["jobs"]) for v in values.values()}) == 1
    odd = {**jobs, "job-7": "def"}
    view.apply("instance.odd", json.dumps({"jobs": odd}).encode(), 200, False)
    assert mismatched_jobs(view.instances()) == {"job-7"}
    assert len({id(v["jobs"]) for v in view.instances().values()}) == 2


def test_a_renewed_presence_is_not_decoded_or_counted_again() -> None:
    """Each of a hundred replicas renews its presence every 5 s; only an instance
    that comes, goes or changes its presence changes the fleet."""
    view = View()
    presence = json.dumps({"version": "1", "jobs": {"a": "1"}}).encode()
    view.apply("instance.r1", presence, 1, False)
    view.apply("instance.r2", presence, 2, False)
    generation = view.presence_generation
    decoded = view.instances()["r1"]
    view.apply("instance.r1", presence, 3, False)  # a renewal
    assert view.presence_generation == generation
    assert view.instances()["r1"] is decoded  # the same object: not decoded again
    assert view.keys["instance.r1"].revision == 3
    changed = json.dumps({"version": "2", "jobs": {"a": "1"}}).encode()
    view.apply("instance.r1", changed, 4, False)
    assert view.presence_generation == generation + 1
    assert view.instances()["r1"]["version"] == "2"
    view.apply("instance.r2", None, 5, True)  # gone
    assert view.presence_generation == generation + 2
    view.apply("instance.r2", presence, 6, False)  # back
    assert view.presence_generation == generation + 3
    view.apply("paused.a", b"{}", 7, False)  # not an instance
    assert view.presence_generation == generation + 3


def test_every_delivered_entry_is_told_even_one_that_changes_no_key() -> None:
    """The fate probe waits for the watch to reach a revision (sidecar/fleet/freshness.py):
    a delete of a key the view never held moves the revision and tells nobody else."""
    told: list[int] = []
    changed: list[str] = []
    view = View(on_change=changed.append)
    view.on_delivered = lambda: told.append(view.last_revision)
    view.apply("paused.a", b'{"by": "op"}', 1, deleted=False)
    view.apply("never.held", None, 2, deleted=True, how="DEL")
    view.apply("paused.a", None, 3, deleted=True, how="DEL")
    assert told == [1, 2, 3]
    assert changed == ["paused.a", "paused.a"]  # the unknown key's delete changed nothing


async def test_a_key_changed_while_the_watch_was_away_is_not_known_before_the_change(
    nc: NATS,
) -> None:
    # pause, then resume while watched; away: pause, resume, pause; re-read. The
    # bucket shows only the last pause: whether the job was paused at an instant
    # between the resume the view saw and that pause is not known (it was).
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    view = View()
    async with running(bucket, view) as watch:
        await until(lambda: view.synced, 10)
        await put_json(bucket.kv, "paused.j", {"by": "ops", "n": 1})
        await bucket.kv.delete("paused.j")
        await until(lambda: "paused.j" in view.timelines and view.paused("j") is None, 10)
        seen = view.timelines["paused.j"][-1][0]
        assert watch._pump is not None
        watch._pump.cancel()  # away
        await asyncio.sleep(0.05)  # each change at its own time, 50 ms apart
        await put_json(bucket.kv, "paused.j", {"by": "ops", "n": 2})
        msg = await nc.jetstream().get_last_msg("KV_CRON_STATE", "$KV.CRON_STATE.paused.j")
        assert msg.time is not None
        paused_at = msg.time.timestamp()
        await asyncio.sleep(0.05)
        await bucket.kv.delete("paused.j")
        await asyncio.sleep(0.05)
        await put_json(bucket.kv, "paused.j", {"by": "ops", "n": 3})
        watch.resync()  # what a reconnect does
        await until(lambda: (e := view.paused("j")) is not None and e.value.get("n") == 3, 10)
        last = view.timelines["paused.j"][-1][0]
        instant = paused_at + 0.01  # paused then (n 2), by the server's clock
        assert seen < instant < last
        known, _ = view.at_instant("paused.j", instant)
        assert not known, "an instant inside the gap read as known"
        assert view.at_instant("paused.j", last + 0.001) == (True, {"by": "ops", "n": 3})


def test_the_jobs_of_the_state_bucket_are_one_entry_of_a_presence() -> None:
    """A presence carries one hash for its set of the bucket's jobs (issue 48): two
    instances with different sets are ``job.*`` in the mismatch, and an instance's
    config hash changes with its set; the file's jobs are compared one by one."""
    from sidecar.store.digests import BUCKET_MISMATCH, config_hash, runs_job

    files = {"a": "h1"}
    one = {"jobs": files, "digest": 2, "bucket_jobs": {"count": 2, "hash": "x"}}
    same = {"jobs": dict(files), "digest": 2, "bucket_jobs": {"count": 2, "hash": "x"}}
    other = {"jobs": dict(files), "digest": 2, "bucket_jobs": {"count": 3, "hash": "y"}}
    none = {"jobs": dict(files), "digest": 2}
    assert mismatched_jobs({"i1": one, "i2": same, "i3": none}) == set()
    assert mismatched_jobs({"i1": one, "i2": other}) == {BUCKET_MISMATCH}
    assert config_hash(files, one["bucket_jobs"]) == config_hash(files, same["bucket_jobs"])
    assert config_hash(files, one["bucket_jobs"]) != config_hash(files, other["bucket_jobs"])
    assert config_hash(files) == config_hash(files, None)
    assert runs_job(one, "a", bucket_job=False) and runs_job(one, "dyn", bucket_job=True)
    assert not runs_job(one, "dyn", bucket_job=False)
    assert not runs_job(none, "dyn", bucket_job=True)
