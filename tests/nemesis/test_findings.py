"""Failures the nemesis found, reproduced at the exact instant (docs/RELIABILITY.md).

Each failed before its fix (a lease that never ended; 3,300 renewals in 2 s;
no won slot run while the state bucket could not answer; no slot run while the
sidecar's server answered PINGs but not claims) and passes after it.
The writes go to a real nats-server; what the test controls is only *when*
(or whether) an answer arrives, the one thing the nemesis could not aim.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from sidecar.core.clock import Clock
from sidecar.obs.metrics import Metrics
from sidecar.run.lease import RUN_LEASE_WAIT, Lease
from sidecar.store.bucketcheck import StateSpec
from sidecar.store.kv import Keys
from sidecar.store.state import Bucket, ensure_bucket
from tests.reliability.proxy import AckProxy
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    free_port,
    read_stream,
    until,
    wait_for,
)

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
    metrics = Metrics(CollectorRegistry())
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
    metrics = Metrics(CollectorRegistry())
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


# ---------------------------------------------------------------- finding 6 (seed 185111)


def test_a_won_slot_runs_while_its_run_lease_cannot_be_created(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Finding 6: the state bucket's stream has a Raft leader of its own. With it
    cut off and the claims' leader not, claims were won but each run waited for
    its lease until slot + max_late and was then recorded skipped (late): a slot
    won and never run. Here every lease create goes unanswered for 2 s (the
    write timeout), for the whole test: the slots must still run, at most
    RUN_LEASE_WAIT late."""
    config = {
        "nats": {"servers": [nats_server.url], "lease_ttl": "3s"},
        "target": {"url": http_app.url, "timeout": "5s"},
        "jobs": [{"name": "tick", "schedule": "* * * * * *", "jitter": "0s", "max_late": "3s"}],
    }
    sidecar = Sidecar(tmp_path, "s", config, {"ANARCHON_FAILPOINTS": "lease.create=timeout(2)"})
    sidecar.start()
    try:
        wait_for(
            lambda: (
                len(http_app.requests_for("/jobs/tick")) >= 3 or "status=skipped" in sidecar.log()
            ),
            30,
            what="three runs (or a won slot skipped)",
        )
    finally:
        code = sidecar.terminate()
    assert code == 0
    log = sidecar.log()
    assert "failpoint lease.create: timeout" in log
    assert "status=skipped" not in log, log[-2000:]
    requests = http_app.requests_for("/jobs/tick")
    assert len(requests) >= 3
    delays = [r.at - int(r.headers["X-Anarchon-Slot"]) / 1000 for r in requests]
    assert max(delays) < RUN_LEASE_WAIT + 1.0, delays  # not held until max_late (3 s)
    assert "not created within 1.0s; running, creating it meanwhile" in log
    stored = [m.data for m in read_stream(nats_server.url) if m.subject.endswith(".results")]
    assert stored and all(r["status"] == "succeeded" for r in stored), stored


class SlowCreate(Keys):
    """The first create is answered after `delay` seconds (a leader being elected)."""

    def __init__(self, bucket: Bucket, delay: float) -> None:
        super().__init__(bucket)
        self.delay = delay

    async def create(
        self, key: str, value: dict[str, Any], ttl: float | None, expected: int = 0
    ) -> int:
        if self.delay:
            await asyncio.sleep(self.delay)
            self.delay = 0.0
        return await super().create(key, value, ttl, expected)


async def test_a_run_lease_created_while_its_run_goes_on_is_renewed_and_released(
    nc: NATS,
) -> None:
    """The other half of finding 6's fix: the run does not wait, the lease still
    comes (a dead runner is then seen), is renewed, and is released at the end."""
    keys = SlowCreate(await ensure_bucket(nc.jetstream(), SPEC), 0.8)
    metrics = Metrics(CollectorRegistry())
    lease = Lease(keys, KEY, lease_value(), 1.0, metrics, Clock(), 1e12)
    try:
        assert not await lease.start(0.2)  # the run goes on without it ...
        assert await keys.last(KEY) is None
        await until(lambda: lease.created, 5, "the lease created in the background")
        assert (await keys.last(KEY) or (0, None))[1] == lease_value()
        await until(lambda: lease.renewals >= 2, 5, "renewals")  # every 1/3 s
    finally:
        await lease.__aexit__(None, None, None)
    last = await keys.last(KEY)
    assert last is not None and last[1] is None  # released: a delete marker
    assert not metrics.registry.get_sample_value(
        "anarchon_lease_renewal_failures_total", {"job": "j"}
    )


async def test_a_run_lease_never_created_leaves_nothing_behind(nc: NATS) -> None:
    keys = SlowCreate(await ensure_bucket(nc.jetstream(), SPEC), 30.0)
    metrics = Metrics(CollectorRegistry())
    lease = Lease(keys, KEY, lease_value(), 1.0, metrics, Clock(), 1e12)
    assert not await lease.start(0.1)
    ending = asyncio.create_task(lease.__aexit__(None, None, None))
    done, _ = await asyncio.wait({ending}, timeout=3)
    assert ending in done, "the pending create held the run's end"
    assert lease._renewer is not None and lease._renewer.done()
    assert await keys.last(KEY) is None


# ---------------------------------------------------------------- finding 7 (seeds 696732, 51613)


class DeafProxy(AckProxy):
    """Every claim's ack dropped, retries' too: a server that cannot reach the
    stream's leader (everything else, PINGs included, passes)."""

    def _verdict(self, msg_id: str) -> str:
        with self._lock:
            self.dropped.append(msg_id)
        return "drop"


def test_a_sidecar_leaves_a_server_that_answers_pings_but_not_its_claims(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Finding 7: a server cut from the stream's leader (a bridge), or one cut from
    the sidecar for less than the pings take to notice (4-6 s, a whole max_late),
    answers PINGs and not claims. The sidecar stayed, and every claim timed out.
    Here the sidecar's first server is a proxy that answers everything but claims
    (their acks are dropped, for ever); the second refuses connections until the
    sidecar is up, so it starts on the deaf one. Slots must run all the same."""
    deaf = DeafProxy(nats_server.port).start()
    other = free_port()
    config = {
        "nats": {
            "servers": [deaf.url, f"nats://127.0.0.1:{other}"],
            "lease_ttl": "3s",
            "ack_timeout": "1s",
        },
        "target": {"url": http_app.url, "timeout": "5s"},
        "jobs": [{"name": "tick", "schedule": "* * * * * *", "jitter": "0s", "max_late": "3s"}],
    }
    log, requests = runs_after_leaving(tmp_path, nats_server, http_app, deaf, config, other, 3, 30)
    assert "did not answer a claim within nats.ack_timeout; trying another server" in log
    delays = [r.at - int(r.headers["X-Anarchon-Slot"]) / 1000 for r in requests]
    assert max(delays) < 3.0, delays  # each within max_late


def runs_after_leaving(
    tmp_path: Path,
    nats_server: NatsServer,
    app: RecordingApp,
    deaf: AckProxy,
    config: dict[str, Any],
    other: int,
    runs: int,
    within: float,
) -> tuple[str, list[Any]]:
    """A sidecar started on `deaf` (the first server of `config`; `other`, the second,
    refuses connections until it is ready); then `other` comes up, and `deaf` is
    made deaf when it can be. Returns the sidecar's log and the runs of job tick
    after that, once there are `runs` of them."""
    sidecar = Sidecar(tmp_path, "s", config, {}).start()
    good = None
    try:
        sidecar.wait_ready(30)
        good = AckProxy(nats_server.port, port=other).start()  # the other server comes up
        if isinstance(deaf, BucketDeafProxy):
            deaf.deaf = True
        cut_at = time.time()
        wait_for(lambda: deaf.tampered, 20, what="a write dropped by the deaf server")

        def after() -> list[Any]:
            return [r for r in app.requests_for("/jobs/tick") if r.at > cut_at]

        wait_for(lambda: len(after()) >= runs, within, what="runs after the deaf server was left")
    finally:
        code = sidecar.terminate()
        deaf.stop()
        if good is not None:
            good.stop()
    assert code == 0
    return sidecar.log(), after()


class BucketDeafProxy(AckProxy):
    """Once `deaf`, every write to the state bucket and every claim is dropped on its
    way to the server (PINGs and all else pass): a server cut from the leaders of
    the bucket and the stream (one side of a bridge) while the sidecar's
    connection to it stays up."""

    deaf = False

    def _forward(self, op: bytes, parts: list[bytes]) -> bool:
        subject = parts[1] if op in (b"PUB", b"HPUB") else b""
        if self.deaf and (subject.startswith(b"$KV.") or subject.endswith(b".claims")):
            with self._lock:
                self.dropped.append(subject.decode())
            return False
        return True


def test_a_sidecar_leaves_a_server_cut_from_the_state_buckets_leader(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """A bridge's side node answers PINGs, not the bucket nor the stream. Each slot
    first waits up to 2 s for the bucket's freshness probe (GUARANTEES rule 3), so
    its claim has less than its ack timeout left and does not move the sidecar;
    the question about that given-up claim, asked with its whole ack timeout
    (sidecar/run/claim.py), does. A job due every 5 s runs again within a few
    slots, each run within max_late. (A probe left unanswered moving the sidecar
    at once was tried and left: a probe also times out on a healthy server, behind
    a burst's writes or a re-read, and hops would feed on themselves.)"""
    deaf = BucketDeafProxy(nats_server.port).start()
    other = free_port()
    config = {
        "nats": {"servers": [deaf.url, f"nats://127.0.0.1:{other}"]},  # ack_timeout 2 s
        "target": {"url": http_app.url, "timeout": "5s"},
        "jobs": [{"name": "tick", "schedule": "*/5 * * * * *", "jitter": "0s", "max_late": "4s"}],
    }
    log, requests = runs_after_leaving(tmp_path, nats_server, http_app, deaf, config, other, 2, 40)
    assert "did not answer a claim within nats.ack_timeout; trying another server" in log
    delays = [r.at - int(r.headers["X-Anarchon-Slot"]) / 1000 for r in requests]
    assert max(delays) < 4.0, delays  # each within max_late
