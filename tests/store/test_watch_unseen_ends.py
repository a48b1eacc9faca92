"""A lease whose end a full re-read did not see (sidecar/store/watch.py, ``UNSEEN``).

A re-read after a reconnect or a stall compares the view before with what it
read. A lock that expired meanwhile and was taken again by another run is still
there, with another run's token: without a word of it to the lost-run judges,
the dead run was never recorded lost (one way the upgrade test's kill could go
unjudged when both judges re-read at once on a loaded machine). It is told as
``UNSEEN``, and the judges look for its run's result. A lease deleted (its
runner's clean release) and one that expired (its marker read) are told as
their markers say.
"""

from __future__ import annotations

import asyncio
import time

import nats

from sidecar.store.bucketcheck import StateSpec
from sidecar.store.kv import Keys
from sidecar.store.state import DELETED, EXPIRED, UNSEEN, Removal, View, ensure_bucket
from sidecar.store.watch import Watch
from tests.support import NatsServer

SPEC = StateSpec("CRON_STATE", 1, 60.0)


def lease(token: str) -> dict[str, object]:
    return {"job": "j", "slot": 1000, "attempt": 1, "token": token, "instance": "a"}


async def test_a_re_read_tells_the_judges_of_every_lease_end_it_did_not_see(
    nats_server: NatsServer,
) -> None:
    nc = await nats.connect(nats_server.url)
    bucket = await ensure_bucket(nc.jetstream(), SPEC)
    keys = Keys(bucket)
    removed: list[Removal] = []
    watch = Watch(bucket, View(on_removed=removed.append))

    async def expired(key: str) -> None:  # its MaxAge marker is its last message
        deadline = time.monotonic() + 20
        while (last := await keys.last(key)) is not None and last[1] is not None:
            assert time.monotonic() < deadline, f"{key} did not expire"
            await asyncio.sleep(0.05)

    try:
        await keys.create("lock.retaken", lease("dead"), 3.0)  # expires, then taken again
        released = await keys.create("lock.released", lease("r1"), 30.0)
        await keys.create("run.j.1000", lease("gone"), 3.0)  # expires, nothing after
        done = await keys.create("run.j.2000", lease("done"), 30.0)  # released cleanly
        await keys.create("lock.alive", lease("alive"), 30.0)  # held all along
        await watch._start()
        assert len(watch.view.leases()) == 5
        await watch._stop()  # a reconnect: nothing is followed until the re-read

        await expired("lock.retaken")
        await keys.create("lock.retaken", lease("next"), 30.0, expected=0)
        await keys.delete("lock.released", released)
        again = await keys.create("lock.released", lease("r2"), 30.0)
        await keys.delete("lock.released", again)
        await keys.delete("run.j.2000", done)
        await expired("run.j.1000")

        await watch._start()
        told = {r.key: (r.how, r.entry.value["token"]) for r in removed}
        assert told == {
            "lock.retaken": (UNSEEN, "dead"),
            "lock.released": (DELETED, "r1"),
            "run.j.1000": (EXPIRED, "gone"),
            "run.j.2000": (DELETED, "done"),
        }, removed
        assert watch.view.keys["lock.retaken"].value["token"] == "next"
    finally:
        await watch._stop()
        await nc.close()
