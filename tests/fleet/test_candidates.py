"""claim.candidates: the rendezvous ranking, the wait-or-claim decision, the config."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import nats
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sidecar.config.jobset import JobSet
from sidecar.config.load import parse_config
from sidecar.config.model import ClaimConfig
from sidecar.core.clock import Clock
from sidecar.core.errors import ConfigError
from sidecar.fleet.candidates import Candidates, decide, lease_slot, rank, score
from sidecar.fleet.member import Fleet
from sidecar.obs.metrics import Metrics
from sidecar.store.kv import put_with_ttl
from sidecar.store.state import PRESENCE_TTL
from tests.support import NatsServer, run_cli, until, write_config

ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=20)
fleets = st.lists(ids, min_size=1, max_size=30, unique=True)
slots = st.integers(min_value=0, max_value=2**45)


def test_score_is_pinned() -> None:
    """SHA-256 of "job NUL slot NUL instance": the same on every replica, platform and
    Python (never the salted hash()); a change here would split a mixed-version fleet."""
    assert score("sync", 1791633610000, "web-1") == 6162656168369814243
    assert rank("sync", 1791633610000, ["web-1", "web-2", "web-3"], 2) == ["web-2", "web-3"]


@settings(deadline=None)
@given(fleet=fleets, slot=slots, k=st.integers(1, 5), seed=st.randoms())
def test_every_replica_agrees_whatever_order_it_sees(
    fleet: list[str], slot: int, k: int, seed: Any
) -> None:
    shuffled = list(fleet)
    seed.shuffle(shuffled)
    assert rank("job", slot, fleet, k) == rank("job", slot, shuffled, k)
    assert rank("job", slot, fleet + fleet[:2], k) == rank("job", slot, fleet, k)
    assert len(rank("job", slot, fleet, k)) == min(k, len(fleet))


@settings(deadline=None)
@given(fleet=fleets.filter(lambda f: len(f) >= 2), slot=slots, k=st.integers(1, 4))
def test_an_instance_leaving_moves_only_its_own_slots(fleet: list[str], slot: int, k: int) -> None:
    """Rendezvous: the others keep their places; a leaving candidate is replaced by the
    next one of the old ranking (no reshuffle of the whole fleet)."""
    before = rank("job", slot, fleet, k + 1)
    for gone in fleet:
        after = rank("job", slot, [i for i in fleet if i != gone], k)
        expected = [i for i in before if i != gone][:k]
        assert after == expected


@settings(max_examples=20, deadline=None)
@given(fleet=st.lists(ids, min_size=10, max_size=10, unique=True))
def test_slots_spread_evenly(fleet: list[str]) -> None:
    """Over 5,000 slots each of 10 instances is the one candidate of about a tenth."""
    counts = Counter(rank("j", 1_000 * s, fleet, 1)[0] for s in range(5_000))
    assert set(counts) == set(fleet)
    # 500 expected each; 6 standard deviations (about 127) either side.
    assert all(370 <= n <= 630 for n in counts.values()), counts


def test_jobs_rank_independently() -> None:
    """The same slot of two jobs usually has different candidates: load spreads over jobs."""
    fleet = [f"s{i}" for i in range(10)]
    same = sum(rank("a", s * 1000, fleet, 1) == rank("b", s * 1000, fleet, 1) for s in range(1000))
    assert same < 200  # about 100 expected


@pytest.mark.parametrize(
    ("me", "live", "k", "claim_now", "why"),
    [
        ("a", ["a", "b", "c"], 0, True, "off"),
        ("a", None, 1, True, "open: the fleet view is unknown"),
        ("z", ["a", "b", "c"], 1, True, "open: this instance is not in the fleet view yet"),
        ("a", ["a", "b"], 2, True, "candidate: no more live instances than candidates"),
        ("a", ["a", "b", "c"], 1, True, "candidate"),  # rank(...) == ["a"] for slot 0
        ("b", ["a", "b", "c"], 1, False, "deferred"),
        ("c", ["a", "b", "c"], 1, False, "deferred"),
    ],
)
def test_decide(me: str, live: list[str] | None, k: int, claim_now: bool, why: str) -> None:
    assert rank("job", 0, ["a", "b", "c"], 1) == ["a"]
    decision = decide("job", 0, me, live, k)
    assert (decision.claim_now, decision.why) == (claim_now, why)


@settings(deadline=None)
@given(fleet=fleets, slot=slots, k=st.integers(1, 5))
def test_exactly_the_candidates_claim_at_the_slot(fleet: list[str], slot: int, k: int) -> None:
    claiming = {me for me in fleet if decide("j", slot, me, fleet, k).claim_now}
    assert claiming == set(rank("j", slot, fleet, k))


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("run.sync.1000", {}, ("sync", 1000)),
        ("run.sync.1000.2", {}, None),  # a later attempt
        ("run.sync.x", {}, None),
        ("lock.sync", {"slot": 1000, "attempt": 1}, ("sync", 1000)),
        ("lock.sync", {"slot": 1000}, ("sync", 1000)),
        ("lock.sync", {"slot": 1000, "attempt": 2}, None),
        ("lock.sync", {"slot": "1000"}, None),
        ("lock.sync", {"slot": True}, None),
        ("due.sync.1000.2", {}, None),
    ],
)
def test_lease_slot(key: str, value: dict[str, Any], expected: tuple[str, int] | None) -> None:
    assert lease_slot(key, value) == expected


# ---------------------------------------------------------------------- config


def _config(job: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "nats": {"servers": "nats://127.0.0.1:4222"},
        "jobs": [{"name": "sync", "schedule": "* * * * *", **job}],
        **top,
    }


def test_off_by_default() -> None:
    assert parse_config(_config({}), {}).jobs[0].claim == ClaimConfig(0, 1.0)


def test_job_and_defaults() -> None:
    cfg = parse_config(_config({"claim": {"candidates": 2}}), {})
    assert cfg.jobs[0].claim == ClaimConfig(2, 1.0)
    cfg = parse_config(_config({}, defaults={"claim": {"candidates": 3, "fallback": "2s"}}), {})
    assert cfg.jobs[0].claim == ClaimConfig(3, 2.0)
    # The job's own keys win, one by one; 0 turns it off for that job.
    cfg = parse_config(
        _config(
            {"claim": {"candidates": 0}}, defaults={"claim": {"candidates": 3, "fallback": "2s"}}
        ),
        {},
    )
    assert cfg.jobs[0].claim == ClaimConfig(0, 2.0)


@pytest.mark.parametrize(
    ("job", "top", "key", "words"),
    [
        ({"claim": {"candidates": -1}}, {}, "jobs[0].claim.candidates", "between 0 and 1000"),
        ({"claim": {"candidates": "two"}}, {}, "jobs[0].claim.candidates", "whole number"),
        ({"claim": {"candidates": 1.5}}, {}, "jobs[0].claim.candidates", "whole number"),
        ({"claim": {"candidates": True}}, {}, "jobs[0].claim.candidates", "whole number"),
        ({"claim": {"candidate": 1}}, {}, "jobs[0].claim.candidate", "unknown key"),
        ({"claim": 2}, {}, "jobs[0].claim", "expected a map"),
        ({"claim": {"candidates": 1, "fallback": "10ms"}}, {}, "jobs[0].claim.fallback", "100ms"),
        ({}, {"defaults": {"claim": {"candidates": -2}}}, "defaults.claim.candidates", "between"),
        (
            {"max_late": "4s", "jitter": "1s", "claim": {"candidates": 1, "fallback": "1s"}},
            {},
            "jobs[0].claim.fallback",
            "must be shorter than max_late (4s)",
        ),
    ],
)
def test_bad_claim_names_the_key(
    job: dict[str, Any], top: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_config(job, **top), {})
    assert err.value.key == key
    assert words in str(err.value)


def test_fit_counts_ack_timeout() -> None:
    """jitter + fallback + nats.ack_timeout < max_late; off, nothing is checked."""
    job = {"max_late": "5s", "jitter": "1s", "claim": {"candidates": 1, "fallback": "1s"}}
    parse_config(_config(job), {})  # 1 + 1 + 2 < 5
    with pytest.raises(ConfigError, match=r"nats\.ack_timeout"):
        cfg = _config(job)
        cfg["nats"]["ack_timeout"] = "3s"
        parse_config(cfg, {})
    parse_config(_config({**job, "claim": {"candidates": 0, "fallback": "10s"}}), {})


def test_check_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yaml", _config({"claim": {"candidates": -1}}))
    done = run_cli("check", "-c", str(path))
    assert done.returncode == 2
    assert "jobs[0].claim.candidates" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------------- with a real bucket


async def test_candidates_read_the_fleet_view_and_the_run_leases(nats_server: NatsServer) -> None:
    """A real Fleet on a real nats-server: the view fails open until read and while this
    instance is not in it; the live instances are those that run the job; a run lease
    seen in the bucket spares the fallback its claim; an unseen one makes it claim."""
    cfg = parse_config(
        {
            "instance_id": "me",
            "nats": {"servers": nats_server.url},
            "jobs": [
                {
                    "name": "j",
                    "schedule": "* * * * * *",
                    "jitter": 0,
                    "max_late": "5s",
                    "claim": {"candidates": 1, "fallback": "100ms"},
                }
            ],
        },
        {},
    )
    job = cfg.jobs[0]
    metrics = Metrics(CollectorRegistry())
    fleet = Fleet(cfg, metrics, Clock(), jobs=JobSet(cfg.jobs))
    nc = await nats.connect(nats_server.url)
    claimed: list[int] = []
    tasks: list[asyncio.Task[None]] = []

    async def sleep_until(wall: float) -> bool:
        await asyncio.sleep(max(0.0, wall - Clock().wall()))
        return False

    async def claim_later(job: Any, slot: int) -> None:
        claimed.append(slot)

    candidates = Candidates(
        "me",
        metrics,
        Clock(),
        fleet,
        lambda coro: tasks.append(asyncio.create_task(coro)),
        sleep_until,
        claim_later,
    )
    try:
        assert candidates.live("j") is None  # not read yet: everyone claims
        assert not candidates.defer(job, 1000, 1, "scheduled")
        fleet.start(nc.jetstream())
        await until(lambda: fleet.view.synced and fleet.leases_ok, 20, "the bucket read")
        assert fleet.bucket is not None
        await until(lambda: "me" in fleet.view.instances(), 10, "own presence")
        for other, jobs in (("o1", {"j": "x"}), ("o2", {"j": "x"}), ("x9", {"other": "x"})):
            await put_with_ttl(fleet.bucket, f"instance.{other}", {"jobs": jobs}, PRESENCE_TTL)
        await until(lambda: len(fleet.view.instances()) == 4, 10, "the other instances")
        assert sorted(candidates.live("j") or []) == ["me", "o1", "o2"]  # x9 runs no j
        # The presences are read from the view once per change of them, not once per
        # job: a burst of 10,000 jobs due at once read the whole view 10,000 times.
        instances = fleet.view.instances
        reads = 0

        def counted() -> dict[str, dict[str, Any]]:
            nonlocal reads
            reads += 1
            return instances()

        def live(*names: str) -> list[list[str] | None]:
            """`live` of each name, counting the view's reads (nothing else runs meanwhile)."""
            fleet.view.instances = counted  # type: ignore[method-assign]
            try:
                return [candidates.live(name) for name in names]
            finally:
                fleet.view.instances = instances  # type: ignore[method-assign]

        assert live(*(f"t{i}" for i in range(200))) == [[]] * 200
        assert reads == 0
        await put_with_ttl(fleet.bucket, "instance.o3", {"jobs": {"t7": "x"}}, PRESENCE_TTL)
        await until(lambda: "o3" in instances(), 10, "a new instance")
        t7, t8, t9, j = live("t7", "t8", "t9", "j")
        assert (t7, t8, sorted(j or [])) == (["o3"], [], ["me", "o1", "o2"])
        assert t9 is t8  # jobs run by the same instances share one list
        assert reads == 1  # read again for the new presence, once
        await fleet.bucket.kv.delete("instance.o3")
        await until(lambda: "o3" not in instances(), 10, "the new instance gone")
        now_ms = Clock().wall_ms()
        slots = [now_ms - now_ms % 1000 + 1000 * i for i in range(40)]
        mine = [s for s in slots if rank("j", s, ["me", "o1", "o2"], 1) == ["me"]]
        others = [s for s in slots if s not in mine]
        assert mine and len(others) >= 4
        # Candidate: claims now (False: no deferral), nothing spawned.
        assert not candidates.defer(job, mine[0], 1, "scheduled")
        # Not a candidate, but a retry, catch-up or manual claim: claims now.
        assert not candidates.defer(job, others[0], 2, "scheduled")
        assert not candidates.defer(job, others[0], 1, "catchup")
        assert tasks == []
        # Two slots whose run leases appear in the bucket, two whose do not.
        seen, unseen = others[:2], others[2:4]
        await fleet.bucket.kv.put(f"run.j.{seen[0]}", b'{"slot": 1}')
        await fleet.bucket.kv.put("lock.j", json_bytes({"slot": seen[1], "attempt": 1}))
        await until(lambda: all(candidates.was_run("j", s) for s in seen), 10, "leases seen")
        for slot in seen + unseen:
            assert candidates.defer(job, slot, 1, "scheduled")
        await asyncio.gather(*tasks)
        assert sorted(claimed) == sorted(unseen)
        value = metrics.registry.get_sample_value
        assert value("anarchon_claims_deferred_total", {"job": "j", "outcome": "seen"}) == 2
        assert value("anarchon_claims_deferred_total", {"job": "j", "outcome": "fallback"}) == 2
    finally:
        await fleet.stop()
        await nc.close()


def json_bytes(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()
