"""The pure checks of ``buffer.<job>`` and ``stop.<job>`` (sidecar/run/overlapcheck.py):
tables of values and stored claims. With processes: test_hostile_overlap_keys.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.config.load import parse_config
from sidecar.core.errors import Hostile
from sidecar.run.overlapcheck import (
    KeyClaim,
    StoredClaim,
    judge_claim,
    kept_problem,
    kept_window,
    parse_key,
    stop_problem,
)

NOW = 1_796_400_000.0  # a whole minute
SLOT = int(NOW * 1000)
TOKEN = "a" * 32
JOB = parse_config(
    {
        "jobs": [
            {
                "name": "sync",
                "schedule": "*/5 * * * *",
                "overlap": "buffer_one",
                "max_late": "10s",
                "request": {"timeout": "1m"},
            }
        ]
    },
    {},
).jobs[0]


def claim_body(**extra: Any) -> bytes:
    """A claim as sidecar/run/claim.py writes it, with `extra` changed."""
    body = {"job": "sync", "slot": SLOT, "token": TOKEN, "instance": "s0", "manual": False}
    return json.dumps({**body, **extra}).encode()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"slot": SLOT, "token": TOKEN, "fence": 7}, None),
        ([1, 2], "not a JSON object"),
        ({"slot": 10**20, "token": TOKEN, "fence": 7}, "slot is not a time"),
        ({"slot": True, "token": TOKEN, "fence": 7}, "slot is not a time"),
        ({"slot": SLOT, "token": TOKEN}, "fence is not a stream sequence"),
        ({"slot": SLOT, "token": TOKEN, "fence": 0}, "fence is not a stream sequence"),
        ({"slot": SLOT, "token": TOKEN, "fence": "7"}, "fence is not a stream sequence"),
        ({"slot": SLOT, "token": TOKEN, "fence": 2**64}, "fence is not a stream sequence"),
        ({"slot": SLOT, "token": "", "fence": 7}, "token is not a run id"),
        ({"slot": SLOT, "token": "x" * 129, "fence": 7}, "token is not a run id"),
        ({"slot": SLOT, "token": "é", "fence": 7}, "token is not a run id"),
    ],
)
def test_parse_key(value: Any, problem: str | None) -> None:
    if problem is None:
        assert parse_key(value) == KeyClaim(SLOT, TOKEN, 7)
    else:
        with pytest.raises(Hostile, match=problem):
            parse_key(value)


@pytest.mark.parametrize(
    ("data", "at", "problem", "attempt", "trigger"),
    [
        (claim_body(), NOW, None, 1, "scheduled"),
        (claim_body(attempt=3), NOW, None, 3, "retry"),
        (claim_body(trigger="catchup"), NOW, None, 1, "catchup"),
        (claim_body(trigger="at", slot=SLOT + 1234), NOW, None, 1, "at"),
        (b"\x00garbage", NOW, "not a claim of the job", 0, ""),
        (b"[" * 100_000, NOW, "not a claim of the job", 0, ""),
        (claim_body(job="other"), NOW, "not a claim of the job", 0, ""),
        (claim_body(slot=10**20), NOW, "not a claim of the job", 0, ""),
        (claim_body(token=5), NOW, "not a claim of the job", 0, ""),
        (claim_body(skipped="paused"), NOW, "skipped slot's record", 0, ""),
        (claim_body(manual=True), NOW, "manual run", 0, ""),
        (claim_body(attempt=99), NOW, "no usable attempt", 0, ""),
        (claim_body(trigger="manual"), NOW, "no usable trigger", 0, ""),
        (claim_body(trigger="evil"), NOW, "no usable trigger", 0, ""),
        (claim_body(), None, "no usable time", 0, ""),
    ],
)
def test_judge_claim(
    data: bytes, at: float | None, problem: str | None, attempt: int, trigger: str
) -> None:
    if problem is not None:
        with pytest.raises(Hostile, match=problem):
            judge_claim(JOB, 9, data, at)
        return
    got = judge_claim(JOB, 9, data, at)
    assert (got.seq, got.token, got.attempt, got.trigger, got.stored_at) == (
        9,
        TOKEN,
        attempt,
        trigger,
        NOW,
    )


def stored(**extra: Any) -> StoredClaim:
    fields: dict[str, Any] = {
        "seq": 9,
        "slot": SLOT,
        "token": TOKEN,
        "attempt": 1,
        "trigger": "scheduled",
        "stored_at": NOW,
    }
    return StoredClaim(**{**fields, **extra})


@pytest.mark.parametrize(
    ("key", "claim", "problem"),
    [
        (KeyClaim(SLOT, TOKEN, 9), stored(), None),
        (KeyClaim(SLOT + 1, TOKEN, 9), stored(slot=SLOT + 1), "not an instant of the job's"),
        (KeyClaim(SLOT + 1, TOKEN, 9), stored(slot=SLOT + 1, trigger="at"), None),
        (KeyClaim(SLOT + 300_000, TOKEN, 9), stored(), "of another slot"),
        (KeyClaim(SLOT, "b" * 32, 9), stored(), "another run id"),
    ],
)
def test_kept_problem(key: KeyClaim, claim: StoredClaim, problem: str | None) -> None:
    got = kept_problem(JOB, key, claim)
    assert got is None if problem is None else problem in (got or ""), got


@pytest.mark.parametrize(
    ("key", "running", "problem"),
    [
        (KeyClaim(SLOT, "r", 9), 5, None),
        (KeyClaim(SLOT, "r", 5), 5, "not newer"),
        (KeyClaim(SLOT, "r", 4), 5, "not newer"),
        (KeyClaim(1, "r", 9), 5, "of another slot"),  # slot 1970-01-01 said in the key
    ],
)
def test_stop_problem(key: KeyClaim, running: int, problem: str | None) -> None:
    got = stop_problem(key, stored(), running)
    assert got is None if problem is None else problem in (got or ""), got


def test_kept_window_covers_the_run_it_waited_for_twice() -> None:
    # request.timeout 1m, lease_ttl 30s, max_late 10s.
    assert kept_window(JOB, 30.0) == 2 * (60 + 30) + 10
