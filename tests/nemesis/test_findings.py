"""Failures the nemesis found, reproduced at the exact instant (docs/RELIABILITY.md).

Both failed before their fix (a lease that never ended; 3,300 renewals in
2 s) and pass after it. The writes go to a real nats-server; what the test
controls is only *when* an answer arrives, the one thing the nemesis could
not aim.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from sidecar.clock import Clock
from sidecar.lease import Keys, Lease
from sidecar.metrics import Metrics
from sidecar.state import Bucket, StateSpec, ensure_bucket

SPEC = StateSpec("F_STATE", 1, 1.0)
KEY = "run.j.1000"


def lease_value() -> dict[str, object]:
    return {"job": "j", "slot": 1000, "attempt": 1, "token": "t1", "instance": "me"}


class AckInFlight(Keys):
    """Real renewals whose acks the test hands over, the way nats-py waits for one.

    nats-py's request (``nats/aio/client.py``) awaits the reply future with
    ``asyncio.wait_for``; here the write is made for real first, then the
    renewal waits the same way for a future the test resolves.
    """

    def __init__(self, bucket: Bucket) -> None:
        super().__init__(bucket)
        self.pending: asyncio.Future[int] | None = None
        self.asked = asyncio.Event()

    async def renew(self, key: str, value: dict[str, Any], revision: int, ttl: float) -> int:
        written = await super().renew(key, value, revision, ttl)
        self.pending = asyncio.get_running_loop().create_future()
        self.asked.set()
        await asyncio.wait_for(self.pending, 5)
        return written


async def test_a_lease_ends_when_its_run_ends_as_a_renewal_is_answered(nc: NATS) -> None:
    """Failure 1: the renewer was stopped by cancel() alone, which Python 3.11's
    asyncio.wait_for drops when the awaited answer is already there (CPython gh-86296)."""
    keys = AckInFlight(await ensure_bucket(nc.jetstream(), SPEC))
    metrics = Metrics(CollectorRegistry(), ("j",))
    lease = Lease(keys, KEY, lease_value(), 1.0, metrics, Clock(), 1e12)
    await lease.__aenter__()
    ending: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(keys.asked.wait(), 5)  # a renewal waits for its ack
        assert keys.pending is not None
        keys.pending.set_result(0)  # the ack arrives ...
        ending = asyncio.create_task(lease.__aexit__(None, None, None))  # ... as the run ends
        done, _ = await asyncio.wait({ending}, timeout=3)
        assert ending in done, "the run's lease never ended: its renewer outlived the cancel"
        last = await keys.last(KEY)
        assert last is not None and last[1] is None  # released
        value = metrics.registry.get_sample_value(
            "anarchon_lease_renewal_failures_total", {"job": "j"}
        )
        assert not value  # no renewal failed
    finally:
        for task in (ending, lease._renewer):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await asyncio.wait_for(task, 5)


class StaleReads(Keys):
    """Reads of the key answer an old revision, as a lagging replica can after a leader change."""

    def __init__(self, bucket: Bucket) -> None:
        super().__init__(bucket)
        self.stale: tuple[int, dict[str, Any] | None] | None = None
        self.renewals = 0

    async def renew(self, key: str, value: dict[str, Any], revision: int, ttl: float) -> int:
        self.renewals += 1
        return await super().renew(key, value, revision, ttl)

    async def last(self, key: str) -> tuple[int, dict[str, Any] | None] | None:
        return self.stale if self.stale is not None else await super().last(key)


async def test_renewals_back_off_while_reads_are_stale(nc: NATS) -> None:
    """Failure 4: after a CAS conflict, a still-ours stale read renewed at once, for ever."""
    keys = StaleReads(await ensure_bucket(nc.jetstream(), SPEC))
    metrics = Metrics(CollectorRegistry(), ("j",))
    async with Lease(keys, KEY, lease_value(), 3.0, metrics, Clock(), 1e12) as lease:
        first = lease.revision
        # Our own value written again behind the lease's back: every renewal by
        # the lease's revision now conflicts, and reads keep answering the old one.
        await keys._publish(KEY, b'{"instance":"me","token":"t1"}', {}, 3.0)
        keys.stale = (first, lease_value())
        before = keys.renewals
        await asyncio.sleep(2.0)  # one renewal is due in this time (every 1 s)
        spun = keys.renewals - before
        keys.stale = None
    # A back-off may retry a few times a second; the sidecar retried thousands.
    assert spun <= 20, f"{spun} renewals in 2 s"
