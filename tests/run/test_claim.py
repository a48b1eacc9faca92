"""The claim: the pure decision, then real claims against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import re
import signal
import time
from collections import Counter
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError

from sidecar.config.load import Secrets, parse_config
from sidecar.core.clock import Clock, parse_rfc3339
from sidecar.core.errors import ClaimDisconnected, ClaimError, ClaimUnanswered
from sidecar.core.wire import new_token
from sidecar.run import claim as claim_module
from sidecar.run.claim import Claim, Claimer, claim_msg_id, decide, must_read_stored, token_of
from sidecar.store.connection import Connection
from sidecar.store.stream import StreamSpec, ensure_stream
from tests.support import NatsServer, until

OURS = "a" * 32
OTHER = "b" * 32
SPEC = StreamSpec("CRON", "cron.", 300.0, 1000, None)
SLOT = 1_791_633_610_000


# ----------------------------------------------------------------- pure logic


@pytest.mark.parametrize(
    ("duplicate", "stored", "won"),
    [
        # nats-py reports a first publish as None, not False
        (None, None, True),
        (None, OURS, True),
        (None, OTHER, True),
        (False, None, True),
        (False, OURS, True),
        (False, OTHER, True),
        # a duplicate is ours only when the stored claim carries our token
        (True, OURS, True),
        (True, OTHER, False),
        (True, None, False),
    ],
)
def test_decide(duplicate: bool | None, stored: str | None, won: bool) -> None:
    assert decide(duplicate, stored, OURS) is won


@pytest.mark.parametrize(
    ("duplicate", "retried", "stored", "outcome"),
    [
        # not a duplicate: won, nothing to read, whatever came before
        (None, False, OTHER, "won"),
        (None, True, OTHER, "won"),
        (False, True, None, "won"),
        # a duplicate of the first publish: somebody else's claim, no second request
        (True, False, OURS, "lost"),
        (True, False, OTHER, "lost"),
        # a duplicate after an earlier attempt (timeout, 10158, reconnect): read it
        (True, True, OURS, "won after a read"),
        (True, True, OTHER, "lost after a read"),
        (True, True, None, "lost after a read"),
    ],
)
def test_claim_decision_table(
    duplicate: bool | None, retried: bool, stored: str | None, outcome: str
) -> None:
    read = must_read_stored(duplicate, retried)
    won = decide(duplicate, stored if read else None, OURS)
    assert f"{'won' if won else 'lost'}{' after a read' if read else ''}" == outcome


@pytest.mark.parametrize(
    ("data", "token"),
    [
        (json.dumps({"token": OURS, "job": "sync"}).encode(), OURS),
        (b"", None),
        (b"not json at all", None),
        (b"\xff\xfe\x00garbage", None),
        (b'{"token": ', None),
        (b"[1, 2, 3]", None),
        (b'"a string"', None),
        (b"42", None),
        (b"null", None),
        (b'{"job": "sync"}', None),
        (b'{"token": 12345}', None),
        (b'{"token": null}', None),
        (b'{"token": ["x"]}', None),
    ],
)
def test_token_of(data: bytes, token: str | None) -> None:
    assert token_of(data) == token


def test_tokens_and_msg_ids() -> None:
    tokens = {new_token() for _ in range(1000)}
    assert len(tokens) == 1000
    assert all(re.fullmatch("[0-9a-f]{32}", t) for t in tokens)
    assert claim_msg_id("sync", SLOT, OURS, manual=False) == f"sync:{SLOT}"
    assert claim_msg_id("sync", SLOT, OURS, manual=True) == f"sync:manual:{OURS}"


# ----------------------------------------------------------------- real server


@pytest.fixture
async def nc(nc: NATS) -> NATS:
    """conftest's connection, with the stream SPEC made on its server."""
    await ensure_stream(nc.jetstream(), SPEC)
    return nc


def claimer_for(conn: NATS, instance: str, **extra: Any) -> Claimer:
    return Claimer(conn, conn.jetstream(), SPEC.name, SPEC.prefix, instance, Clock(), **extra)


def deadline_in(seconds: float) -> float:
    return time.monotonic() + seconds


async def test_first_claim_wins_and_stores_the_wire_format(nc: NATS) -> None:
    before = time.time()
    won = await claimer_for(nc, "web-1").claim("sync", SLOT, deadline_in(5))
    assert won.won and won.duplicate_acks == 0 and won.publish_tries == 1
    assert (won.job, won.slot, won.manual) == ("sync", SLOT, False)
    assert won.ack_seconds >= 0
    msg = await nc.jetstream().get_msg(SPEC.name, won.seq)
    assert msg.subject == "cron.sync.claims"
    assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == f"sync:{SLOT}"
    body = json.loads(msg.data)
    assert body["job"] == "sync" and body["slot"] == SLOT
    assert body["token"] == won.token and body["instance"] == "web-1"
    assert body["manual"] is False
    assert body["scheduled_at"] == "2026-10-10T12:00:10.000Z"
    assert parse_rfc3339(body["scheduled_at"]) * 1000 == SLOT
    assert body["claimed_at"].endswith("Z")
    assert before - 0.01 <= parse_rfc3339(body["claimed_at"]) <= time.time() + 0.01


async def test_second_instance_loses_the_same_slot(nats_server: NatsServer, nc: NATS) -> None:
    other = await nats.connect(nats_server.url)
    try:
        first = await claimer_for(nc, "web-1").claim("sync", SLOT, deadline_in(5))
        second = await claimer_for(other, "web-2").claim("sync", SLOT, deadline_in(5))
        # the same instance claiming again is a new claim with a new token: lost too
        again = await claimer_for(nc, "web-1").claim("sync", SLOT, deadline_in(5))
    finally:
        await other.close()
    assert first.won and not second.won and not again.won
    assert second.seq == first.seq == again.seq
    assert second.duplicate_acks == 1 and again.duplicate_acks == 1
    assert len({first.token, second.token, again.token}) == 3
    # another slot of the same job, and the same slot of another job, are free
    assert (await claimer_for(nc, "web-2").claim("sync", SLOT + 1000, deadline_in(5))).won
    assert (await claimer_for(nc, "web-2").claim("other", SLOT, deadline_in(5))).won
    info = await nc.jetstream().stream_info(SPEC.name)
    assert info.state.messages == 3


def lose_first_ack(claimer: Claimer, publish_it: bool = True) -> list[int]:
    """The claimer's first publish reaches JetStream (or not), but its ack is lost.

    Returns a list that gets the stored sequence of that publish (0 if not sent).
    """
    # Claims go out through the claimer's pipeline (sidecar/store/pipe.py).
    real = claimer.pipe.publish
    lost: list[int] = []

    async def publish(*args: Any, **kwargs: Any) -> Any:
        if not lost:
            ack = await real(*args, **kwargs) if publish_it else None
            lost.append(ack.seq if ack else 0)
            raise NatsTimeoutError
        return await real(*args, **kwargs)

    claimer.pipe.publish = publish  # type: ignore[method-assign]
    return lost


async def test_own_retry_is_recognised_by_token(nc: NATS) -> None:
    """An earlier attempt of ours was stored but its ack got lost: the retry wins."""
    claimer = claimer_for(nc, "web-1")
    lost = lose_first_ack(claimer)
    retried = await claimer.claim("sync", SLOT, deadline_in(5))
    assert retried.won and [retried.seq] == lost
    assert retried.publish_tries == 2 and retried.duplicate_acks == 1


async def test_first_duplicate_is_lost_even_with_our_token_stored(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decided without reading: on a first publish the stored claim cannot be ours.

    (Here it carries our token, which no real claim can arrange: the proof
    that the claimer did not read it.)
    """
    body = {"job": "sync", "slot": SLOT, "token": OURS, "instance": "web-1", "manual": False}
    first = await nc.jetstream().publish(
        "cron.sync.claims", json.dumps(body).encode(), headers={"Nats-Msg-Id": f"sync:{SLOT}"}
    )
    monkeypatch.setattr(claim_module, "new_token", lambda: OURS)
    claimed = await claimer_for(nc, "web-1").claim("sync", SLOT, deadline_in(5))
    assert not claimed.won and claimed.seq == first.seq
    assert claimed.publish_tries == 1 and claimed.duplicate_acks == 1


async def test_duplicate_of_a_foreign_message_is_lost(nc: NATS) -> None:
    """Whatever holds the msg id without our token (not even JSON) is not ours."""
    await nc.jetstream().publish(
        "cron.sync.claims", b"garbage", headers={"Nats-Msg-Id": f"sync:{SLOT}"}
    )
    lost = await claimer_for(nc, "web-1").claim("sync", SLOT, deadline_in(5))
    assert not lost.won and lost.duplicate_acks == 1


async def test_manual_claims_never_collide(nc: NATS) -> None:
    claimer = claimer_for(nc, "web-1")
    scheduled = await claimer.claim("sync", SLOT, deadline_in(5))
    manual = [await claimer.claim("sync", SLOT, deadline_in(5), manual=True) for _ in range(3)]
    assert scheduled.won
    assert all(m.won and m.manual and m.duplicate_acks == 0 for m in manual)
    assert len({scheduled.seq, *(m.seq for m in manual)}) == 4
    js = nc.jetstream()
    for m in manual:
        msg = await js.get_msg(SPEC.name, m.seq)
        assert msg.headers is not None
        assert msg.headers["Nats-Msg-Id"] == f"sync:manual:{m.token}"
        assert json.loads(msg.data)["manual"] is True
    # the scheduled slot is still taken for everybody else
    assert not (await claimer_for(nc, "web-2").claim("sync", SLOT, deadline_in(5))).won


async def test_many_claimers_many_slots_one_winner_each(nats_server: NatsServer) -> None:
    instances, slots = 6, 60
    conns = [await nats.connect(nats_server.url) for _ in range(instances)]
    try:
        await ensure_stream(conns[0].jetstream(), SPEC)
        claimers = [claimer_for(c, f"web-{i}") for i, c in enumerate(conns)]
        deadline = deadline_in(20)
        keys: list[tuple[int, str, int]] = []
        claims: list[Claim] = []
        for s in range(slots):
            # One wave per slot: every instance claims it at once, each over its
            # own connection, in an order that differs from wave to wave.
            wave = [
                (i, job, SLOT + 1000 * s) for job in ("alpha", "beta") for i in range(instances)
            ]
            random.shuffle(wave)
            keys += wave
            claims += await asyncio.gather(
                *(claimers[i].claim(job, slot, deadline) for i, job, slot in wave)
            )
        info = await conns[0].jetstream().stream_info(SPEC.name)
    finally:
        for c in conns:
            await c.close()
    winners = Counter((c.job, c.slot) for c in claims if c.won)
    assert len(winners) == 2 * slots
    assert set(winners.values()) == {1}
    seqs: dict[tuple[str, int], set[int]] = {}
    for c in claims:
        seqs.setdefault((c.job, c.slot), set()).add(c.seq)
    assert all(len(s) == 1 for s in seqs.values())  # losers were shown the winner's message
    assert info.state.messages == 2 * slots
    # the race was real: more than one instance won something
    assert len({i for (i, _, _), c in zip(keys, claims, strict=True) if c.won}) >= 2


async def test_claim_without_a_stream_fails_at_the_deadline(nats_server: NatsServer) -> None:
    conn = await nats.connect(nats_server.url)
    try:
        claimer = Claimer(conn, conn.jetstream(), "NOPE", "nope.", "web-1", Clock(), 0.2)
        started = time.monotonic()
        with pytest.raises(ClaimError) as info:
            await claimer.claim("sync", SLOT, started + 0.6)
        took = time.monotonic() - started
    finally:
        await conn.close()
    assert not isinstance(info.value, ClaimDisconnected)
    assert "no definite answer before the deadline" in str(info.value)
    assert f"sync:{SLOT}" in str(info.value)
    assert 0.55 <= took < 1.5, took


async def test_claim_refused_by_jetstream_fails_at_once(nc: NATS) -> None:
    """A stream that does not hold the subject is a definite refusal, not worth retrying."""
    await ensure_stream(nc.jetstream(), StreamSpec("OTHER", "other.", 300.0, 1000, None))
    claimer = Claimer(nc, nc.jetstream(), "OTHER", "cron.", "web-1", Clock())
    started = time.monotonic()
    with pytest.raises(ClaimError, match="JetStream refused the claim"):
        await claimer.claim("sync", SLOT, started + 10)
    assert time.monotonic() - started < 2


async def test_duplicate_whose_stored_claim_is_gone_is_not_won(nc: NATS) -> None:
    """JetStream still remembers the id, but the message to compare tokens with is gone.

    A first publish is lost at once (nothing to read); a retry cannot tell.
    """
    first = await claimer_for(nc, "web-1").claim("sync", SLOT, deadline_in(5))
    assert await nc.jetstream().delete_msg(SPEC.name, first.seq)
    assert not (await claimer_for(nc, "web-2").claim("sync", SLOT, deadline_in(5))).won
    retrying = claimer_for(nc, "web-3")
    lose_first_ack(retrying, publish_it=False)
    with pytest.raises(ClaimError, match=f"stored claim {first.seq} is gone"):
        await retrying.claim("sync", SLOT, deadline_in(5))


async def test_jetstream_requests_per_slot(nats_server: NatsServer) -> None:
    """N claimers, one slot each wave: N claim publishes, no reads; a retry reads once.

    Counted on the server's side: a core subscription sees every claim publish
    (duplicates too) and every stored-message read the claimers make.
    """
    instances, slots = 3, 10
    watcher = await nats.connect(nats_server.url)
    conns = [await nats.connect(nats_server.url) for _ in range(instances)]
    seen: Counter[str] = Counter()

    async def count(msg: Msg) -> None:
        seen["read" if msg.subject.startswith("$JS.API") else "claim"] += 1

    try:
        await ensure_stream(watcher.jetstream(), SPEC)
        for subject in ("cron.*.claims", "$JS.API.STREAM.MSG.GET.>", "$JS.API.DIRECT.GET.>"):
            await watcher.subscribe(subject, cb=count)
        # Under load the first publishes of a connection could reach the server before
        # the watcher's interest did (28 of 30 claims seen, 1 run in 15 beside three
        # CPU burners): each claimer's publishes are seen by the watcher before counting.
        probed: set[str] = set()

        async def probe(msg: Msg) -> None:
            probed.add(msg.subject)

        await watcher.subscribe("probe.*", cb=probe)
        await watcher.flush()
        for _ in range(50):
            for i, c in enumerate(conns):
                await c.publish(f"probe.{i}", b"")
                await c.flush()
            with contextlib.suppress(AssertionError):
                await until(lambda: len(probed) == instances, 0.2, "each claimer's probe seen")
                break
        assert len(probed) == instances, probed
        claimers = [claimer_for(c, f"web-{i}") for i, c in enumerate(conns)]
        claims = []
        for s in range(slots):
            claims += await asyncio.gather(
                *(c.claim("sync", SLOT + 1000 * s, deadline_in(10)) for c in claimers)
            )
        await watcher.flush()
        await until(lambda: seen["claim"] >= instances * slots, what="every claim seen")
        plain = dict(seen)
        # One instance's first ack of the next slot is lost: its retry reads once.
        lose_first_ack(claimers[0])
        retried = await claimers[0].claim("sync", SLOT + 1000 * slots, deadline_in(10))
        others = await asyncio.gather(
            *(c.claim("sync", SLOT + 1000 * slots, deadline_in(10)) for c in claimers[1:])
        )
        await watcher.flush()
        await until(lambda: seen["claim"] >= instances * (slots + 1) + 1, what="the retry")
        await until(lambda: seen["read"] >= 1, what="the retry's read")
    finally:
        for c in conns:
            await c.close()
        await watcher.close()
    assert sum(c.won for c in claims) == slots
    assert all(c.publish_tries == 1 for c in claims)
    assert plain == {"claim": instances * slots}  # N requests per slot, no reads
    assert retried.won and retried.publish_tries == 2 and not any(o.won for o in others)
    assert seen == {"claim": instances * (slots + 1) + 1, "read": 1}


def connection_for(server: NatsServer) -> Connection:
    config = parse_config(
        {"nats": {"servers": [server.url]}, "jobs": [{"name": "sync", "schedule": "* * * * *"}]},
        {},
    )
    return Connection(config, Secrets())


async def test_claim_while_disconnected(nats_server: NatsServer) -> None:
    conn = connection_for(nats_server)
    nc = await conn.connect()
    try:
        await ensure_stream(nc.jetstream(), SPEC)
        claimer = claimer_for(nc, "web-1", ack_timeout=0.5, wait_connected=conn.wait_connected)
        await asyncio.to_thread(nats_server.stop)
        await until(lambda: not conn.connected.is_set(), what="disconnected")
        started = time.monotonic()
        with pytest.raises(ClaimDisconnected, match=f"sync:{SLOT}: NATS disconnected"):
            await claimer.claim("sync", SLOT, started + 0.5)
        assert 0.45 <= time.monotonic() - started < 1.5
        # a claim whose deadline outlasts the outage waits for the connection and wins
        pending = asyncio.create_task(claimer.claim("sync", SLOT, deadline_in(20)))
        await asyncio.to_thread(nats_server.start)
        claimed = await pending
        assert claimed.won and claimed.publish_tries >= 1
    finally:
        await conn.close(drain=False)


def process_state(pid: int) -> str:
    """The state letter of a process (``T`` when stopped), from procfs."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


async def test_timed_out_ack_of_a_stored_claim_is_decided_by_token(
    nats_server: NatsServer, nc: NATS, caplog: pytest.LogCaptureFixture
) -> None:
    """The first publish reaches the server but its ack comes too late: still won.

    The server is frozen (SIGSTOP) so the first publish waits in its socket
    past the ack timeout; once the claimer has given up on that attempt the
    server resumes, stores the first copy and answers the retry as a
    duplicate, whose stored token is ours.
    """
    caplog.set_level(logging.DEBUG, logger="sidecar.run.claim")
    assert nats_server.proc is not None
    pid = nats_server.proc.pid
    claimer = claimer_for(nc, "web-1", ack_timeout=0.3)
    os.kill(pid, signal.SIGSTOP)
    try:
        await until(lambda: process_state(pid) == "T", what="nats-server stopped")
        pending = asyncio.create_task(claimer.claim("sync", SLOT, deadline_in(20)))
        await until(
            lambda: (
                pending.done()
                or any("publish 1: TimeoutError" in r.getMessage() for r in caplog.records)
            ),
            what="the first attempt to time out",
        )
        assert not pending.done(), "answered by a stopped server?"
    finally:
        os.kill(pid, signal.SIGCONT)
    claimed = await pending
    assert claimed.won
    assert claimed.publish_tries >= 2 and claimed.duplicate_acks >= 1
    info = await nc.jetstream().stream_info(SPEC.name)
    assert info.state.messages == 1
    stored = await nc.jetstream().get_msg(SPEC.name, claimed.seq)
    assert json.loads(stored.data)["token"] == claimed.token
    # a second instance still loses it
    assert not (await claimer_for(nc, "web-2").claim("sync", SLOT, deadline_in(5))).won


async def test_a_claim_given_up_is_asked_again_under_its_token(nats_server: NatsServer) -> None:
    """A claim with no definite answer by its deadline says what it was
    (ClaimUnanswered); asked again later under its id and token, the stored claim
    is found ours when it was (its answer came too late), and a skip record is
    stored when nothing was (it never went out). Another's token loses either.

    The server is frozen (SIGSTOP) while two claims share a window of one: the
    first goes out and waits in the server's socket, the second never gets room.
    """
    conn = await nats.connect(nats_server.url)
    try:
        await ensure_stream(conn.jetstream(), SPEC)
        # The first publish holds the window's place until its deadline, unanswered.
        claimer = claimer_for(conn, "web-1", ack_timeout=5.0, window=1)
        assert nats_server.proc is not None
        pid = nats_server.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await until(lambda: process_state(pid) == "T", what="nats-server stopped")
            sent = asyncio.create_task(claimer.claim("sync", SLOT, deadline_in(1.0)))
            await asyncio.sleep(0)  # it takes the window's one place first
            never_sent = asyncio.create_task(claimer.claim("sync", SLOT + 1000, deadline_in(0.8)))
            given_up = await asyncio.gather(sent, never_sent, return_exceptions=True)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert all(isinstance(exc, ClaimUnanswered) for exc in given_up), given_up
        first, second = (exc for exc in given_up if isinstance(exc, ClaimUnanswered))
        assert (first.msg_id, second.msg_id) == (f"sync:{SLOT}", f"sync:{SLOT + 1000}")
        assert "in flight" in str(second)
        js = conn.jetstream()
        # Another sidecar asking for the first slot now loses: the stored claim is web-1's.
        other = await claimer_for(conn, "web-2").claim("sync", SLOT, deadline_in(5))
        assert not other.won
        for exc, fresh in ((first, False), (second, True)):
            again = await claimer.claim(
                exc.job,
                exc.slot,
                deadline_in(5),
                msg_id=exc.msg_id,
                extra={"skipped": "unanswered"},
                token=exc.token,
            )
            assert again.won, exc
            stored = json.loads((await js.get_msg(SPEC.name, again.seq)).data)
            assert stored["token"] == exc.token
            # The claim that went out is the stored one; the other is a skip record.
            assert ("skipped" in stored) is fresh, stored
        # Asked again by another token: lost, whatever is stored.
        late = await claimer_for(conn, "web-3").claim(
            "sync", SLOT + 1000, deadline_in(5), extra={"skipped": "unanswered"}
        )
        assert not late.won
        assert (await js.stream_info(SPEC.name)).state.messages == 2
    finally:
        await conn.close()
