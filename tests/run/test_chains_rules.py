"""The pure rules of chains (sidecar/run/chains.py): which result is a run's last
word, which ending fires which ``on``, which message is a result of the job, and
the claim id that makes the chained run once per slot."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.config.load import JobConfig, parse_config
from sidecar.core.wire import after_msg_id
from sidecar.run.chains import final, fires, result_of

TOKEN = "5d8a0ddd930d5616b1e006bafbf38ed3"


def job_of(**extra: Any) -> JobConfig:
    config = parse_config(
        {
            "target": {"url": "http://127.0.0.1:8080"},
            "jobs": [{"name": "a", "schedule": "* * * * *", **extra}],
        },
        {},
    )
    return config.jobs[0]


@pytest.mark.parametrize(
    ("extra", "status", "attempt", "manual", "trigger", "last"),
    [
        ({}, "succeeded", 1, False, "scheduled", True),
        ({}, "failed", 1, False, "scheduled", True),  # no retry: the last word
        ({}, "lost", 1, False, None, True),
        ({"retry": {"max": 1}}, "failed", 1, False, "scheduled", False),  # a retry follows
        ({"retry": {"max": 1}}, "failed", 2, False, "retry", True),
        ({"retry": {"max": 1}}, "succeeded", 1, False, "scheduled", True),
        ({"retry": {"max": 1}}, "lost", 1, False, None, True),  # on_lost: record
        ({"retry": {"max": 1}, "on_lost": "rerun"}, "lost", 1, False, None, False),
        ({"retry": {"max": 1}, "on_lost": "rerun"}, "lost", 2, False, None, True),
        ({"retry": {"max": 2}}, "failed", 1, True, "manual", True),  # run-now: not retried
        ({"retry": {"max": 2}}, "failed", 1, False, "at", True),  # a one-off: not retried
    ],
)
def test_a_results_last_word(
    extra: dict[str, Any], status: str, attempt: int, manual: bool, trigger: Any, last: bool
) -> None:
    assert final(job_of(**extra), status, attempt, manual, trigger) is last


@pytest.mark.parametrize(
    ("on", "fired"),
    [
        ("success", {"succeeded"}),
        ("failure", {"failed", "lost"}),
        ("always", {"succeeded", "failed", "lost"}),
    ],
)
def test_which_endings_fire(on: str, fired: set[str]) -> None:
    assert {s for s in ("succeeded", "failed", "lost", "skipped") if fires(on, s)} == fired


GOOD = {"job": "a", "slot": 1_796_227_910_000, "token": TOKEN, "status": "succeeded"}


@pytest.mark.parametrize(
    "bad",
    [
        {"job": "b"},
        {"status": "skipped"},
        {"status": "running"},
        {"slot": -1},
        {"slot": "1796227910000"},
        {"slot": True},
        {"token": "../../x"},
        {"token": TOKEN.upper()},
        {"attempt": 0},
        {"attempt": 10**9},
        {"manual": "yes"},
    ],
)
def test_a_message_that_is_no_result_of_the_job_is_refused(bad: dict[str, Any]) -> None:
    assert result_of(json.dumps(GOOD).encode(), "a") == GOOD
    assert result_of(json.dumps({**GOOD, **bad}).encode(), "a") is None
    assert result_of(b"not json", "a") is None
    assert result_of(b"[1]", "a") is None


def test_the_claim_id_names_the_slot_not_the_attempt() -> None:
    assert after_msg_id("b", "a", 1000, TOKEN, False) == "b:after:a:1000"
    assert after_msg_id("b", "a", 1000, "other", False) == "b:after:a:1000"  # any attempt
    assert after_msg_id("b", "a", 1000, TOKEN, True) == f"b:after:a:manual:{TOKEN}"
