"""Claims published pipelined (sidecar/store/pipe.py), against a real nats-server:
a burst of one instant's claims from two claimers, and a NATS restart mid-burst."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.errors import ConnectionClosedError

from sidecar.core.clock import Clock
from sidecar.core.errors import ClaimDisconnected, ClaimError
from sidecar.run.claim import Claim, Claimer, token_of
from sidecar.store.pipe import Expiry, Window
from sidecar.store.stream import StreamSpec, ensure_stream
from tests.run.test_claim import connection_for
from tests.support import NatsServer, until

SPEC = StreamSpec("CRON", "cron.", 300.0, 1000, None)
SLOT = 1_791_633_610_000


@pytest.fixture
async def two(nats_server: NatsServer) -> AsyncIterator[tuple[NATS, NATS]]:
    """Two connections (two sidecars) to one server with the claims stream."""
    first, second = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
    await ensure_stream(first.jetstream(), SPEC)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


def claimer_for(nc: NATS, instance: str, **extra: object) -> Claimer:
    return Claimer(nc, nc.jetstream(), SPEC.name, SPEC.prefix, instance, Clock(), **extra)  # type: ignore[arg-type]


async def test_a_burst_is_claimed_once_each_at_the_first_publish(two: tuple[NATS, NATS]) -> None:
    """5,000 jobs due at one instant on two claimers: every slot won exactly once,
    every claim decided by its first publish (no ack timed out while it waited
    behind the others of the instant), every loser lost by its duplicate ack
    without reading the stored claim. Claimed one awaited request each, all at
    once, most of these acks came after the 1 s ack timeout (retries, reads)."""
    jobs = 5000
    claimers = [claimer_for(nc, f"web-{i}", ack_timeout=1.0) for i, nc in enumerate(two)]
    deadline = time.monotonic() + 60
    claims = await asyncio.gather(
        *(c.claim(f"j{i}", SLOT, deadline) for i in range(jobs) for c in claimers)
    )
    won = Counter(c.job for c in claims if c.won)
    assert len(won) == jobs and set(won.values()) == {1}
    assert Counter(c.publish_tries for c in claims) == {1: 2 * jobs}
    assert all(c.duplicate_acks == 1 for c in claims if not c.won)
    # Nothing left behind: every place of the window given back, no ack waited for.
    for claimer in claimers:
        assert claimer.pipe.window.held == 0 and not claimer.pipe._pending


async def test_the_window_bounds_the_claims_in_flight(two: tuple[NATS, NATS]) -> None:
    """With a window of 8, never more than 8 claims of a claimer in flight; all decided."""
    claimer = claimer_for(two[0], "web-1", window=8)
    seen: list[int] = []
    real = claimer.pipe.publish

    async def publish(*args: object, **kwargs: object) -> object:
        seen.append(claimer.pipe.window.held)
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    claimer.pipe.publish = publish  # type: ignore[method-assign,assignment]
    deadline = time.monotonic() + 30
    claims = await asyncio.gather(*(claimer.claim(f"j{i}", SLOT, deadline) for i in range(200)))
    assert all(c.won for c in claims)
    assert len(seen) == 200 and max(seen) == 8


async def test_a_window_wait_ends_at_the_deadline() -> None:
    """No room before the claim's deadline: no place, nothing published."""
    window, expiry = Window(1), Expiry()
    assert await window.acquire(1.0, expiry)
    started = time.monotonic()
    assert not await window.acquire(0.2, expiry)
    assert 0.15 <= time.monotonic() - started < 1.0
    waiting = asyncio.ensure_future(window.acquire(5.0, expiry))
    await asyncio.sleep(0)
    window.release()  # handed on to the waiter
    assert await waiting and window.held == 1
    window.release()
    assert window.held == 0


async def test_a_place_goes_to_a_waiter_behind_only_when_no_other_waits() -> None:
    """The questions after claims given up wait ``behind``: a claim that came after
    them is handed the next place first; among themselves they keep their order."""
    window, expiry = Window(1), Expiry()
    assert await window.acquire(1.0, expiry)
    order: list[str] = []

    async def wait(name: str, behind: bool) -> None:
        assert await window.acquire(5.0, expiry, behind=behind)
        order.append(name)

    waiting = []
    for count, (name, behind) in enumerate(
        [("question-1", True), ("question-2", True), ("fresh", False)], 1
    ):
        waiting.append(asyncio.ensure_future(wait(name, behind)))
        await until(lambda n=count: window.waiting == n, 5, f"{name} waiting")
    for handed in range(1, len(waiting) + 1):
        window.release()
        await until(lambda n=handed: len(order) == n, 5, "the next one handed a place")
    await asyncio.gather(*waiting)
    assert order == ["fresh", "question-1", "question-2"]
    assert window.held == 1 and window.waiting == 0
    window.release()
    assert window.held == 0
    assert await window.acquire(0.0, expiry, behind=True)  # room and nobody waiting


async def test_a_nats_restart_mid_burst_loses_no_slot_silently(nats_server: NatsServer) -> None:
    """The server restarts while two claimers' 600 claims are in flight: no slot is
    won twice, a slot's winner is the one whose token is stored, and a slot nobody
    won has a claimer that said so (ClaimError, ClaimDisconnected), never two quiet
    losers."""
    jobs = 600
    conns = [connection_for(nats_server) for _ in range(2)]
    ncs = [await conn.connect() for conn in conns]
    try:
        await ensure_stream(ncs[0].jetstream(), SPEC)
        claimers = [
            claimer_for(nc, f"web-{i}", ack_timeout=0.5, window=16, wait_connected=c.wait_connected)
            for i, (nc, c) in enumerate(zip(ncs, conns, strict=True))
        ]
        deadline = time.monotonic() + 30
        tasks = [
            asyncio.ensure_future(c.claim(f"j{i}", SLOT, deadline))
            for i in range(jobs)
            for c in claimers
        ]
        await until(lambda: sum(t.done() for t in tasks) >= 100, what="100 claims decided")
        await asyncio.to_thread(nats_server.stop)
        await asyncio.to_thread(nats_server.start)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        failed: Counter[str] = Counter()
        winners: dict[str, list[Claim]] = {}
        for task_result in results:
            if isinstance(task_result, (ClaimError, ClaimDisconnected)):
                failed[str(task_result).split(":")[0]] += 1
                continue
            assert isinstance(task_result, Claim), task_result
            winners.setdefault(task_result.job, [])
            if task_result.won:
                winners[task_result.job].append(task_result)
        assert sum(t.done() for t in tasks) == 2 * jobs
        js = ncs[0].jetstream()
        for i in range(jobs):
            job = f"j{i}"
            won = winners.get(job, [])
            assert len(won) <= 1, f"{job} won twice"
            if won:
                stored = await js.get_last_msg(SPEC.name, f"{SPEC.prefix}{job}.claims")
                assert token_of(stored.data or b"") == won[0].token
            else:
                assert failed[job] >= 1, f"{job}: nobody won, nobody said why"
    finally:
        for conn in conns:
            await conn.close(drain=False)


async def test_a_claim_that_cannot_be_sent_leaves_nothing_waiting(nats_server: NatsServer) -> None:
    """The connection closed: the publish raises, and neither its place in the
    window nor a future for its ack is left behind."""
    nc = await nats.connect(nats_server.url)
    await ensure_stream(nc.jetstream(), SPEC)
    claimer = claimer_for(nc, "web-1")
    assert (await claimer.claim("j0", SLOT, time.monotonic() + 5)).won
    await nc.close()
    with pytest.raises(ConnectionClosedError):
        await claimer.claim("j1", SLOT, time.monotonic() + 5)
    assert claimer.pipe.window.held == 0 and not claimer.pipe._pending


async def test_the_first_claims_together_share_one_inbox(two: tuple[NATS, NATS]) -> None:
    """Claims started together before any inbox exists: one subscription, not one each."""
    nc = two[0]
    claimer = claimer_for(nc, "web-1")
    before = len(nc._subs)
    deadline = time.monotonic() + 10
    claims = await asyncio.gather(*(claimer.claim(f"j{i}", SLOT, deadline) for i in range(20)))
    assert all(c.won for c in claims)
    assert len(nc._subs) == before + 1


async def test_a_waiter_whose_wait_ran_out_as_it_was_cancelled_frees_no_place() -> None:
    """Its wait's time up (Expiry) and its task cancelled in one pass of the loop: it
    never held a place, so it hands none on; the window's bound still holds."""
    from nats.errors import TimeoutError as NatsTimeoutError

    window, expiry = Window(1), Expiry()
    assert await window.acquire(1, expiry)  # the one place, held
    late = asyncio.ensure_future(window.acquire(5, expiry))
    await until(lambda: len(window._waiters) == 1, 5, "the second one waiting")
    window._waiters[0].set_exception(NatsTimeoutError())
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
    assert window.held == 1
    assert not await window.acquire(0.01, expiry)  # still full: the first one holds it
