"""A claim given up without an answer: its slot's fate asked for (sidecar/run/unanswered.py).

In process, against a real nats-server and a real Claimer; the claims given up
are made by hand (``ClaimUnanswered``, as the Claimer raises it). The whole
path, sidecars and a frozen server, is tests/reliability/test_unanswered_claims.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from sidecar.config.load import JobConfig, parse_config
from sidecar.core.clock import Clock
from sidecar.core.errors import ClaimUnanswered
from sidecar.core.sleeper import Sleeper
from sidecar.core.tasks import TaskSet
from sidecar.core.wire import LOST, new_token
from sidecar.obs.metrics import Metrics
from sidecar.run import unanswered
from sidecar.run.claim import Claim, Claimer
from sidecar.run.context import Context
from sidecar.run.record import Outcome, Recorder
from sidecar.run.unanswered import REASON, Unanswered, asked_for
from sidecar.store.stream import StreamSpec, ensure_stream
from tests.support import NatsServer, until

SPEC = StreamSpec("CRON", "cron.", 300.0, 1000, None)
SLOT = 1_791_633_610_000


@pytest.fixture
async def nc(nc: NATS) -> NATS:
    """conftest's connection, with the stream SPEC made on its server."""
    await ensure_stream(nc.jetstream(), SPEC)
    return nc


class Sidecar:
    """What Unanswered reads of one sidecar's Context, and the claims it hands on."""

    def __init__(self, conn: NATS, instance: str) -> None:
        self.config = parse_config(
            {
                "instance_id": instance,
                "nats": {"servers": ["nats://127.0.0.1:1"], "duplicate_window": "2m"},
                "jobs": [{"name": "sync", "schedule": "* * * * * *", "max_late": "10s"}],
            },
            {},
        )
        self.clock = Clock()
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry)
        js = conn.jetstream()
        self.claimer = Claimer(conn, js, SPEC.name, SPEC.prefix, instance, self.clock)
        self.handed: list[Claim] = []
        ctx = SimpleNamespace(
            config=self.config,
            clock=self.clock,
            metrics=self.metrics,
            js=js,
            claimer=self.claimer,
            spec=SPEC,
            sleeper=Sleeper(self.clock, asyncio.Event()),
            tasks=TaskSet("test"),
        )
        self.unanswered = Unanswered(
            cast(Context, ctx), lambda job, claim: self.handed.append(claim)
        )

    @property
    def job(self) -> JobConfig:
        return self.config.job("sync")

    def recorded(self) -> float:
        sample = self.registry.get_sample_value(
            "anarchon_runs_skipped_total", {"job": "sync", "reason": REASON}
        )
        return sample or 0.0


def given_up(token: str, deadline: float | None = None, slot: int = SLOT) -> ClaimUnanswered:
    """A claim of `slot` given up at `deadline` (default: now), as the Claimer says it."""
    return ClaimUnanswered(
        f"sync:{slot}: no definite answer before the deadline",
        job="sync",
        slot=slot,
        msg_id=f"sync:{slot}",
        token=token,
        attempt=1,
        trigger="scheduled",
        extra=None,
        deadline=time.monotonic() if deadline is None else deadline,
    )


async def stored(conn: NATS) -> list[dict[str, Any]]:
    """Every message of the stream: its subject and its JSON."""
    js = conn.jetstream()
    state = (await js.stream_info(SPEC.name)).state
    out: list[dict[str, Any]] = []
    if not state.messages:
        return out
    for seq in range(state.first_seq, state.last_seq + 1):
        msg = await js.get_msg(SPEC.name, seq)
        out.append({"subject": msg.subject, **json.loads(msg.data or b"{}")})
    return out


@pytest.fixture(autouse=True)
def at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The questions are not spread here (one sidecar's few, not a burst's)."""
    monkeypatch.setattr(unanswered, "SPREAD", 0.0)


async def test_a_slot_nobody_stored_a_claim_of_gets_one_skip_record_and_its_result(
    nats_server: NatsServer, nc: NATS
) -> None:
    """Three sidecars gave up, none of their claims was stored: one skip record, one
    ``skipped`` result (counted once), the others follow it."""
    sidecars = [Sidecar(nc, f"web-{i}") for i in range(3)]
    settled = await asyncio.gather(
        *(s.unanswered.settle(s.job, given_up(new_token())) for s in sidecars)
    )
    assert sorted(settled) == [False, False, True]
    assert [s.recorded() for s in sidecars].count(1.0) == 1
    msgs = await stored(nc)
    claims = [m for m in msgs if m["subject"] == "cron.sync.claims"]
    results = [m for m in msgs if m["subject"] == "cron.sync.results"]
    assert len(claims) == 1 and claims[0]["skipped"] == REASON
    assert len(results) == 1
    result = results[0]
    assert result["token"] == claims[0]["token"] and result["status"] == "skipped"
    assert result["error"].startswith(f"{REASON}: not run:")
    # The ones that lost hand the stored claim to the claim window's judges (a skip
    # record: they read it and stop).
    assert sorted(len(s.handed) for s in sidecars) == [0, 1, 1]


async def test_a_claim_stored_after_its_sidecar_gave_up_is_recorded_by_it(
    nats_server: NatsServer, nc: NATS
) -> None:
    """The stored claim is web-1's, whose answer came too late: web-1 records it
    skipped; web-2, which gave up too, follows it and hands it to the judges."""
    one, two = Sidecar(nc, "web-1"), Sidecar(nc, "web-2")
    mine = await one.claimer.claim("sync", SLOT, time.monotonic() + 5)
    assert mine.won
    assert not await two.unanswered.settle(two.job, given_up(new_token()))
    assert [c.seq for c in two.handed] == [mine.seq]
    assert await one.unanswered.settle(one.job, given_up(mine.token))
    msgs = await stored(nc)
    assert [m["token"] for m in msgs] == [mine.token, mine.token]
    assert "skipped" not in msgs[0]  # the run's claim, never run
    assert msgs[1]["status"] == "skipped"
    assert (one.recorded(), two.recorded()) == (1.0, 0.0)


async def test_a_slot_won_in_time_elsewhere_is_left_to_its_winner(
    nats_server: NatsServer, nc: NATS
) -> None:
    winner, late = Sidecar(nc, "web-1"), Sidecar(nc, "web-2")
    won = await winner.claimer.claim("sync", SLOT, time.monotonic() + 5)
    assert not await late.unanswered.settle(late.job, given_up(new_token()))
    assert [c.seq for c in late.handed] == [won.seq]
    assert [m["token"] for m in await stored(nc)] == [won.token]


async def test_no_question_once_jetstream_may_have_forgotten_the_slot(
    nats_server: NatsServer, nc: NATS
) -> None:
    """Woken (frozen, suspended) after the slot's id may have left JetStream's memory:
    a question then could be stored beside the slot's claim, so none is asked."""
    sidecar = Sidecar(nc, "web-1")
    long_ago = time.monotonic() - asked_for(sidecar.job, 120.0) - 1
    assert not await sidecar.unanswered.settle(sidecar.job, given_up(new_token(), long_ago))
    assert await stored(nc) == []
    assert sidecar.handed == [] and sidecar.recorded() == 0.0


def test_the_question_is_asked_for_half_of_what_the_window_has_left() -> None:
    sidecar_job = SimpleNamespace(jitter=2.0, max_late=58.0)
    assert asked_for(cast(JobConfig, sidecar_job), 300.0) == 120.0
    assert asked_for(cast(JobConfig, sidecar_job), 60.0) == 0.0


async def test_a_claim_judged_lost_meanwhile_is_not_recorded_skipped_as_well(
    nats_server: NatsServer, nc: NATS
) -> None:
    """web-1's claim was stored but its answer never came (web-1 frozen or cut off past
    its deadline, its presence gone): web-2, whose claim lost to it, saw no lease and
    no presence for lease_ttl + 11 s and recorded the run ``lost`` (the claim window's
    record, as sidecar/run/claimwindow.py makes it). web-1 comes back within the
    question's time and asks: the stored claim is its own, but its slot already has
    a fate; recording it ``skipped`` too gives the slot two."""
    one = Sidecar(nc, "web-1")
    mine = await one.claimer.claim("sync", SLOT, time.monotonic() + 5)
    assert mine.won
    judge = Recorder(nc.jetstream(), SPEC.name, SPEC.prefix, "web-2", None)
    now = time.time()
    lost = Outcome(
        kind=LOST, job="sync", slot=SLOT, token=mine.token, started_at=now, finished_at=now,
        error="lease never made: instance web-1 left the fleet; judged by web-2",
    )  # fmt: skip
    assert await judge.record_lost(one.job, lost, last=0)
    await one.unanswered.settle(one.job, given_up(mine.token))
    results = [m for m in await stored(nc) if m["subject"] == "cron.sync.results"]
    assert [r["status"] for r in results] == ["lost"]
    assert one.recorded() == 0.0


# A burst's claims all given up: this many questions put at once (bench/burst.py gave
# up thousands), and the claims of slots due meanwhile.
BACKLOG = 3000
FRESH = 20
# How long after the thaw the fresh claims must be decided: half of a max_late of 1 s.
# Measured on an idle loopback server: 0.003 s without the questions; with 3,000
# (2,000) queued ahead of them 2.0 s (1.24 s) when they shared the claims' window in
# turn, 0.03 s once they waited behind the fresh claims.
FRESH_BY = 0.5


async def fresh_claims_after_thaw(
    server: NatsServer, sidecar: Sidecar, backlog: int, first_slot: int
) -> tuple[list[float], list[bool]]:
    """Freeze the server, put `backlog` questions to it at once (the window's worth in
    flight, the rest waiting for room), then claim FRESH slots due now and thaw it:
    how long after the thaw each fresh claim was decided, and what each question
    settled."""
    assert server.proc is not None
    pid = server.proc.pid
    window = sidecar.claimer.pipe.window
    os.kill(pid, signal.SIGSTOP)
    try:
        asked = [
            asyncio.create_task(
                sidecar.unanswered.settle(
                    sidecar.job, given_up(new_token(), slot=first_slot + i * 1000)
                )
            )
            for i in range(backlog)
        ]
        queued = max(0, backlog - window.size)
        await until(
            lambda: window.held == min(backlog, window.size) and window.waiting == queued,
            10,
            what="the questions in flight and waiting for room",
        )
        fresh = [
            asyncio.create_task(
                sidecar.claimer.claim("fresh", first_slot + i * 1000, time.monotonic() + 60)
            )
            for i in range(FRESH)
        ]
        if backlog >= window.size:  # else the fresh ones went out at once
            await until(lambda: window.waiting == queued + FRESH, 10, what="the fresh claims")
    finally:
        os.kill(pid, signal.SIGCONT)
    thawed = time.monotonic()
    delays: list[float] = []
    for task in asyncio.as_completed(fresh):
        assert (await task).won
        delays.append(time.monotonic() - thawed)
    return delays, list(await asyncio.gather(*asked))


async def test_a_backlog_of_questions_does_not_hold_back_the_claims_of_slots_due_now(
    nats_server: NatsServer, nc: NATS
) -> None:
    """A burst's claims all went unanswered (the server frozen): thousands of questions
    of their fates wait for room among the claims in flight when slots fall due. The
    fresh claims go out first: a question has until its slot's id may leave
    JetStream's memory (a minute here), a fresh claim only max_late. Every question is
    still asked, and records its slot, soon after."""
    sidecar = Sidecar(nc, "web-1")
    # Nothing in flight times out while the server is frozen (however slowly the
    # loaded machine queues the questions): every one waits where it was put.
    sidecar.claimer.ack_timeout = 30.0
    alone, _ = await fresh_claims_after_thaw(nats_server, sidecar, 0, SLOT)
    behind, settled = await fresh_claims_after_thaw(
        nats_server, sidecar, BACKLOG, SLOT + 10_000_000
    )
    assert max(alone) < FRESH_BY, alone
    assert max(behind) < FRESH_BY, f"fresh claims decided {max(behind):.2f}s after the thaw"
    assert all(settled) and sidecar.recorded() == BACKLOG
