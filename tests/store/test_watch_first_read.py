"""The watch's full read of the bucket (sidecar/store/watch.py): job keys are told by
the one "" after it, not one call of every key listener each (issue 49: 100,000 job
keys read at the start, docs/PERFORMANCE.md "100,000 jobs")."""

from __future__ import annotations

import asyncio
import contextlib
import json

from nats.aio.client import Client as NATS

from sidecar.store.bucketcheck import StateSpec
from sidecar.store.kv import put_json
from sidecar.store.state import View, ensure_bucket
from sidecar.store.watch import Watch
from tests.support import until

SPEC = StateSpec("CRON_STATE", 1, 60.0)
JOBS = 600  # more than nats-py's queue of 256 updates: read in several batches


async def test_a_full_read_tells_job_keys_once_by_the_full_read_and_others_each(
    nc: NATS,
) -> None:
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    for at in range(0, JOBS, 200):
        await asyncio.gather(
            *(
                bucket.kv.put(f"job.t{i}", json.dumps({"schedule": "@daily"}).encode())
                for i in range(at, at + 200)
            )
        )
    await put_json(bucket.kv, "paused.sync", {"by": "ops"})
    await bucket.kv.put("weird.key", b"{}")  # of no family: hostile, counted once
    changes: list[str] = []
    unknown: list[tuple[str, int]] = []
    view = View(on_change=changes.append, on_unknown=lambda k, r: unknown.append((k, r)))
    watch = Watch(bucket, view)
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: view.synced and watch._pump is not None, 20)
        # Every key is in the view before anyone is told: the "" says "read them all".
        assert sum(k.startswith("job.") for k in view.keys) == JOBS
        assert changes == ["paused.sync", ""], changes[:5]
        assert [k for k, _ in unknown] == ["weird.key"]

        # A re-read after the watch was away: the same, with only what changed.
        assert watch._pump is not None
        watch._pump.cancel()  # away
        await bucket.kv.put("job.late", json.dumps({"schedule": "@daily"}).encode())
        await bucket.kv.delete("paused.sync")
        changes.clear()
        watch.resync()  # what a reconnect does
        await until(lambda: "job.late" in view.keys and "" in changes, 10)
        assert changes == ["paused.sync", ""], changes
        assert [k for k, _ in unknown] == ["weird.key", "weird.key"]  # the View's caller dedupes

        # After the read, a job key written is told by itself, as every key is.
        changes.clear()
        await bucket.kv.put("job.later", json.dumps({"schedule": "@daily"}).encode())
        await until(lambda: "job.later" in changes, 10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
