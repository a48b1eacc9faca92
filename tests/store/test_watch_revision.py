"""A full read's revision (sidecar/store/watch.py): the view never says it holds a
revision whose change it has not applied.

On a bucket without TTLs the fate probe asks the bucket's last sequence and waits
until the view's ``last_revision`` reaches it (sidecar/fleet/freshness.py); a
full read that set ``last_revision`` from the stream's last sequence asked *after*
the read would claim the writes stored in between, still queued for the watch,
and a pause stored there would not be in the view a slot is judged by.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import nats

from sidecar.store.bucketcheck import StateSpec
from sidecar.store.state import View, ensure_bucket
from sidecar.store.watch import Watch
from tests.support import NatsServer, until

SPEC = StateSpec("CRON_STATE", 1, 60.0)
ROUNDS = 30
WRITES = 20_000


async def test_a_full_read_holds_every_change_up_to_the_revision_it_says(
    nats_server: NatsServer,
) -> None:
    nc = await nats.connect(nats_server.url)
    other = await nats.connect(nats_server.url)
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    kv = await other.jetstream().key_value(SPEC.bucket)
    written: dict[str, int] = {}  # key -> its revision (each key written once)
    value = json.dumps({"by": "ops"}).encode()

    async def write() -> None:  # about a write a millisecond, for as long as the reads go
        for i in range(WRITES):
            written[f"paused.j{i}"] = await kv.put(f"paused.j{i}", value)
            await asyncio.sleep(0.001)

    writer = asyncio.create_task(write())
    watch = Watch(bucket, View())
    try:
        await until(lambda: len(written) >= 50, 20, "the first writes")
        for _ in range(ROUNDS):
            await watch._start()  # a full read; nothing the watch follows is applied yet
            said, held = watch.view.last_revision, set(watch.view.keys)
            missing = sorted(k for k, rev in list(written.items()) if rev <= said and k not in held)
            assert not missing, (said, missing[:5], len(missing))
            await watch._stop()
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
        await watch._stop()
        await nc.close()
        await other.close()
    assert len(written) > ROUNDS * 2  # the writes went on during the reads
