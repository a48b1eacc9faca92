"""The claim-to-lease window (sidecar/run/claimwindow.py), with three real sidecars.

A winner killed at ``claim.won`` (won, its lease not yet made) is recorded
``lost`` once and, with ``on_lost: rerun``, run again once; a winner frozen
there for a few seconds runs its slot once and nobody records it lost; one
frozen until its presence is gone is recorded lost and rerun, and does not
run the slot itself when it wakes. The same for a job whose runs hold
``lock.<job>`` (overlap: skip): killed before its lock, lost once and the job
goes on; frozen a while, it runs once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.errors import KeyNotFoundError

from sidecar.run.claim import Claim
from sidecar.run.claimwindow import _winner
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    StoredMsg,
    base,
    job,
    read_stream,
    sidecars,
    stopped,
    wait_for,
)

# The tests marked serial failed under a loaded first pass of make test (a judge
# or a taker starved): they run alone, in its second pass.
SERIAL = pytest.mark.serial

# Every 2 s, no jitter: each sidecar wins about a third of the slots; only s0 is
# armed, and stops itself at its first win, its lease not yet made.
SCHEDULE = "*/2 * * * * *"
ARMED = {"ANARCHON_FAILPOINTS": "claim.won=1*sigstop"}
RERUN = {"on_lost": "rerun", "retry": {"max": 1, "backoff": "1s"}}
# Longer than any freeze here: a woken winner would still send its request.
MAX_LATE = "90s"
# Presence expiry (15 s) plus the judge's grace (11 s) plus lease_ttl and a margin.
JUDGED_WITHIN = 120.0  # a deadline, not a wait: about 20 s alone, over 60 under a loaded CI


def fleet(nats_server: NatsServer, app: RecordingApp, **extra: Any) -> list[Any]:
    config = base(
        nats_server, app, [job("w", schedule=SCHEDULE, jitter="0s", max_late=MAX_LATE, **extra)]
    )
    config["nats"]["lease_ttl"] = "2s"
    return [("s0", config, ARMED), ("s1", config, {}), ("s2", config, {})]


@contextlib.contextmanager
def armed_last(tmp_path: Path, configs: list[Any]) -> Iterator[list[Sidecar]]:
    """As ``sidecars``, s0 (armed, first in `configs`) started once the others are
    ready: its first win is then a slot the others claimed too, and lost, so a loser
    is there to judge it (a slot won before the others were up has none)."""
    with sidecars(tmp_path, configs[1:]) as others, sidecars(tmp_path, configs[:1]) as first:
        yield [*first, *others]


def frozen_slot(nats_server: NatsServer, s0: Sidecar) -> int:
    """Wait until s0 stopped itself at its first win; the slot it won."""
    assert s0.proc is not None
    pid = s0.proc.pid
    wait_for(lambda: stopped(pid), 40, what="s0 stopped at its first won claim")
    won = [
        m.data
        for m in read_stream(nats_server.url)
        if m.subject == "cron.w.claims" and m.data.get("instance") == "s0"
    ]
    assert len(won) == 1, won
    return int(won[0]["slot"])


def bucket_value(url: str, key: str) -> dict[str, Any] | None:
    """What `key` of the state bucket holds now (None: nothing), read as any bucket
    reader can."""

    async def read() -> dict[str, Any] | None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value("CRON_STATE")
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:
                return None
            value = json.loads(entry.value) if entry.value else None
            return value if isinstance(value, dict) else None
        finally:
            await nc.close()

    return asyncio.run(read())


def lost_records(nats_server: NatsServer, slot: int) -> list[StoredMsg]:
    return [
        m
        for m in read_stream(nats_server.url)
        if m.subject == "cron.w.results"
        and m.data.get("slot") == slot
        and m.data.get("status") == "lost"
    ]


def calls(app: RecordingApp, slot: int) -> list[tuple[str, str]]:
    """(instance, attempt) of each app call for `slot`."""
    return [
        (r.headers["X-Anarchon-Instance"], r.headers.get("X-Anarchon-Attempt", "1"))
        for r in app.requests_for("/jobs/w")
        if int(r.headers["X-Anarchon-Slot"]) == slot
    ]


def test_a_winner_killed_before_its_lease_is_recorded_lost_once_and_rerun_once(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    with armed_last(tmp_path, fleet(nats_server, http_app, **RERUN)) as procs:
        s0 = procs[0]
        slot = frozen_slot(nats_server, s0)
        s0.kill()
        wait_for(
            lambda: lost_records(nats_server, slot), JUDGED_WITHIN, what="the slot recorded lost"
        )
        wait_for(lambda: calls(http_app, slot), 15, what="its rerun")
        # A second judge's record or rerun would have come by now.
        later = time.time() + 10
        wait_for(lambda: time.time() > later, 15, what="a second rerun's time")
        lost = sum(p.metric("anarchon_runs_lost_total", {"job": "w"}) or 0 for p in procs[1:])
    records = lost_records(nats_server, slot)
    assert [(m.data.get("attempt", 1), m.data["instance"]) for m in records] == [(1, "s0")]
    assert "never made" in records[0].data["error"]
    assert [attempt for _, attempt in calls(http_app, slot)] == ["2"]
    assert lost == 1


@pytest.mark.parametrize("freeze", [6.0])
def test_a_winner_frozen_a_while_before_its_lease_runs_once_and_is_not_lost(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, freeze: float
) -> None:
    with armed_last(tmp_path, fleet(nats_server, http_app, **RERUN)) as procs:
        s0 = procs[0]
        slot = frozen_slot(nats_server, s0)
        assert s0.proc is not None
        # Longer than lease_ttl (the judges look, find no lease, read the claim),
        # shorter than its presence takes to expire: a late lease, not a death.
        wait_for(lambda: time.time() > slot / 1000 + freeze, 20, what="frozen a while")
        os.kill(s0.proc.pid, signal.SIGCONT)
        wait_for(lambda: calls(http_app, slot), 15, what="its run")
        # Past the time a judge of a dead winner would have recorded it.
        wait_for(lambda: time.time() > slot / 1000 + 35, 40, what="the judges' time")
        assert s0.proc.poll() is None
        # The judges did look: no lease within lease_ttl, the claim read.
        assert any("no lease of its winner s0" in p.log() for p in procs[1:])
    assert calls(http_app, slot) == [("s0", "1")]
    assert lost_records(nats_server, slot) == []


def judge_copy(url: str, slot: int) -> dict[str, Any] | None:
    """The judge's copy of s0's lease (``run.w.<slot>`` naming ``judged_by``) as the
    bucket holds it now; None when the key is gone (or is not a judge's copy)."""
    value = bucket_value(url, f"run.w.{slot}")
    return value if value is not None and value.get("judged_by") else None


@SERIAL
@pytest.mark.parametrize(
    ("copy_held", "said"),
    [
        (True, "judged this run lost before its lease existed"),
        (False, "judged lost while this sidecar was away"),
    ],
    ids=["copy-held", "copy-expired"],
)
def test_a_winner_frozen_past_its_presence_is_lost_once_and_does_not_run_on_waking(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, copy_held: bool, said: str
) -> None:
    with armed_last(tmp_path, fleet(nats_server, http_app, **RERUN)) as procs:
        s0 = procs[0]
        slot = frozen_slot(nats_server, s0)
        assert s0.proc is not None
        wait_for(
            lambda: lost_records(nats_server, slot), JUDGED_WITHIN, what="the slot recorded lost"
        )
        # Woken while the judge's copy of its lease is held, or once it expired: on
        # what the bucket holds, not after a fixed time (the copy lives lease_ttl +
        # COPY_EXTRA, 12 s, from the judging: a thaw after the rerun, which may take
        # that long under load, found it expired; a fixed 20 s may find it held).
        if copy_held:
            assert judge_copy(nats_server.url, slot), "the judge's copy gone already"
        else:
            wait_for(lambda: judge_copy(nats_server.url, slot) is None, 30, what="the copy expired")
        os.kill(s0.proc.pid, signal.SIGCONT)
        wait_for(
            lambda: said in s0.log().split("claim.won: sig", 1)[-1],
            15,
            what="s0 woke and found its run judged",
        )
        wait_for(lambda: calls(http_app, slot), 15, what="its rerun")
        thawed = time.time()
        wait_for(lambda: time.time() > thawed + 5, 10, what="a run of s0's would have come")
    assert [attempt for _, attempt in calls(http_app, slot)] == ["2"]
    assert len(lost_records(nats_server, slot)) == 1


# A lock job (overlap: skip): its winner takes lock.<job>, not a run lease.
LOCKED = {"overlap": "skip", **RERUN}


def test_a_lock_jobs_winner_killed_before_its_lock_is_lost_once_and_the_job_goes_on(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    with armed_last(tmp_path, fleet(nats_server, http_app, **LOCKED)) as procs:
        s0 = procs[0]
        slot = frozen_slot(nats_server, s0)
        s0.kill()
        wait_for(
            lambda: lost_records(nats_server, slot), JUDGED_WITHIN, what="the slot recorded lost"
        )
        wait_for(lambda: calls(http_app, slot), 15, what="its rerun")
        judged = time.time()
        # Later slots still run (the lock was never taken), and no second record comes.
        wait_for(
            lambda: any(
                int(r.headers["X-Anarchon-Slot"]) / 1000 > judged + 4
                for r in http_app.requests_for("/jobs/w")
            ),
            20,
            what="a later slot's run",
        )
        lost = sum(p.metric("anarchon_runs_lost_total", {"job": "w"}) or 0 for p in procs[1:])
    records = lost_records(nats_server, slot)
    assert [(m.data.get("attempt", 1), m.data["instance"]) for m in records] == [(1, "s0")]
    assert "never made" in records[0].data["error"]
    assert [attempt for _, attempt in calls(http_app, slot)] == ["2"]
    assert lost == 1


def test_a_lock_jobs_winner_frozen_a_while_before_its_lock_runs_once_and_is_not_lost(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    with armed_last(tmp_path, fleet(nats_server, http_app, **LOCKED)) as procs:
        s0 = procs[0]
        slot = frozen_slot(nats_server, s0)
        assert s0.proc is not None
        # Woken between two slots (every 2 s): the lock it takes is free.
        wait_for(lambda: time.time() > slot / 1000 + 7, 20, what="frozen a while")
        os.kill(s0.proc.pid, signal.SIGCONT)
        wait_for(lambda: calls(http_app, slot), 15, what="its run")
        wait_for(lambda: time.time() > slot / 1000 + 35, 40, what="the judges' time")
        assert s0.proc.poll() is None
        assert any("no lease of its winner s0" in p.log() for p in procs[1:])
    assert calls(http_app, slot) == [("s0", "1")]
    assert lost_records(nats_server, slot) == []


def lock_token(url: str) -> str | None:
    """The token ``lock.w`` holds now (None: free), read as any bucket reader can."""
    token = (bucket_value(url, "lock.w") or {}).get("token")
    return token if isinstance(token, str) else None


@SERIAL
def test_a_lock_jobs_winner_woken_after_its_judging_while_the_lock_is_held_does_nothing(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    # Runs of 3 s every 2 s (skip): the lock is held most of the time.
    http_app.delay["/jobs/w"] = 3.0
    with armed_last(tmp_path, fleet(nats_server, http_app, **LOCKED)) as procs:
        s0 = procs[0]
        slot = frozen_slot(nats_server, s0)
        assert s0.proc is not None
        wait_for(
            lambda: lost_records(nats_server, slot), JUDGED_WITHIN, what="the slot recorded lost"
        )
        wait_for(lambda: lock_token(nats_server.url), 20, what="the lock held by a run")
        os.kill(s0.proc.pid, signal.SIGCONT)
        wait_for(
            lambda: "judged" in s0.log().split("claim.won: sig", 1)[-1],
            15,
            what="s0 woke and found its run judged",
        )
        later = time.time() + 5
        wait_for(lambda: time.time() > later, 10, what="a record of s0's would have come")
    # Neither run nor skipped (nor kept, nor a stop asked): the lost record alone.
    first = [
        m.data["status"]
        for m in read_stream(nats_server.url)
        if m.subject == "cron.w.results"
        and m.data.get("slot") == slot
        and m.data.get("attempt", 1) == 1
    ]
    assert first == ["lost"]
    assert ("s0", "1") not in calls(http_app, slot)


def won(**fields: Any) -> dict[str, object]:
    return {"job": "w", "slot": 2000, "token": "t", "instance": "s0",
            "claimed_at": "2026-01-01T00:00:02.001Z", **fields}  # fmt: skip


@pytest.mark.parametrize(
    ("stored", "judged"),
    [
        (won(), True),
        (won(attempt=1), True),
        (won(attempt=2), False),  # another attempt's claim
        (won(slot=4000), False),
        (won(job="x"), False),
        (won(skipped="paused"), False),  # a skipped slot's record: no run, no lease
        (won(token=7), False),
        (won(instance=None), False),
        (won(claimed_at="yesterday"), False),
        (won(slot=True), False),
        (None, False),
    ],
)
def test_only_a_claim_of_the_same_run_is_judged(
    stored: dict[str, object] | None, judged: bool
) -> None:
    claim = Claim("w", 2000, "mine", False, 7, 1, 1, 0.001)
    assert (_winner(stored, claim) is not None) == judged
