"""claim.candidates: the rendezvous ranking, the wait-or-claim decision, the config."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.candidates import ClaimConfig, decide, lease_slot, rank, score
from sidecar.config import parse_config
from sidecar.errors import ConfigError
from tests.support import run_cli, write_config

ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=20)
fleets = st.lists(ids, min_size=1, max_size=30, unique=True)
slots = st.integers(min_value=0, max_value=2**45)


def test_score_is_pinned() -> None:
    """SHA-256 of "job NUL slot NUL instance": the same on every replica, platform and
    Python (never the salted hash()); a change here would split a mixed-version fleet."""
    assert score("sync", 1791633610000, "web-1") == 6162656168369814243
    assert rank("sync", 1791633610000, ["web-1", "web-2", "web-3"], 2) == ["web-2", "web-3"]


@given(fleet=fleets, slot=slots, k=st.integers(1, 5), seed=st.randoms())
def test_every_replica_agrees_whatever_order_it_sees(
    fleet: list[str], slot: int, k: int, seed: Any
) -> None:
    shuffled = list(fleet)
    seed.shuffle(shuffled)
    assert rank("job", slot, fleet, k) == rank("job", slot, shuffled, k)
    assert rank("job", slot, fleet + fleet[:2], k) == rank("job", slot, fleet, k)
    assert len(rank("job", slot, fleet, k)) == min(k, len(fleet))


@given(fleet=fleets.filter(lambda f: len(f) >= 2), slot=slots, k=st.integers(1, 4))
def test_an_instance_leaving_moves_only_its_own_slots(fleet: list[str], slot: int, k: int) -> None:
    """Rendezvous: the others keep their places; a leaving candidate is replaced by the
    next one of the old ranking (no reshuffle of the whole fleet)."""
    before = rank("job", slot, fleet, k + 1)
    for gone in fleet:
        after = rank("job", slot, [i for i in fleet if i != gone], k)
        expected = [i for i in before if i != gone][:k]
        assert after == expected


@settings(max_examples=20)
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
    with pytest.raises(ConfigError, match="nats.ack_timeout"):
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
