"""The checker's rules for ``run_on: every`` and chains (tests/nemesis/kinds.py), on
made-up histories: each safety figure fails on what it names and only on that."""

from __future__ import annotations

from typing import Any

from tests.nemesis.checker import Report
from tests.nemesis.kinds import check_chain, check_every

EVERY = {"each": {"period_s": 2, "max_late": 4.0}}
CHAINED = {"then": {"after": "lease", "on": "always", "retry_max": 1}}
SLOT = 1_000_000


def claim(msg_id: str, token: str, **data: Any) -> dict[str, Any]:
    return {
        "subject": f"CRON.{msg_id.split(':')[0]}.claims",
        "headers": {"Nats-Msg-Id": msg_id},
        "data": {"token": token, **data},
    }


def result(job: str, token: str, status: str, attempt: int, slot: int = SLOT) -> dict[str, Any]:
    data = {"job": job, "token": token, "status": status, "attempt": attempt, "slot": slot}
    return {"subject": f"CRON.{job}.results", "headers": {}, "data": data}


def req(job: str, app: str, run_id: str, **extra: Any) -> dict[str, Any]:
    return {"job": job, "slot": str(SLOT), "app": app, "instance": app, "run_id": run_id, **extra}


def test_every_is_once_per_instance_and_slot_under_its_own_claim() -> None:
    stream = [claim(f"each:{SLOT}:every:{s}", f"t{s}") for s in ("s1", "s2")]
    ok = [req("each", "s1", "ts1"), req("each", "s2", "ts2")]
    report = Report()
    check_every(ok, stream, EVERY, report)
    assert report.failures == [] and report.figures["every_pairs"] == 2
    report = Report()
    check_every([*ok, req("each", "s1", "ts1")], stream, EVERY, report)
    assert report.figures["every_doubles"] == 1, report.failures
    report = Report()
    check_every([req("each", "s1", "ts2", instance="s2")], stream, EVERY, report)
    assert report.figures["every_foreign"] == 1, report.failures


def test_a_chain_runs_once_per_final_run_of_the_job_it_follows() -> None:
    # lease's attempt 1 failed (a retry follows: fires nothing), attempt 2 was lost
    # (retry.max 1 used up: final, fires `always`).
    stream = [
        result("lease", "a1", "failed", 1),
        result("lease", "a2", "lost", 2),
        claim(f"then:after:lease:{SLOT}", "b1"),
    ]
    ok = [req("then", "s3", "b1", after_run="a2")]
    report = Report()
    check_chain(ok, stream, CHAINED, report)
    assert report.failures == [], report.failures
    assert (report.figures["chain_fired"], report.figures["chain_ran"]) == (1, 1)
    report = Report()
    check_chain([*ok, req("then", "s1", "b2", after_run="a2")], stream, CHAINED, report)
    assert report.figures["chain_doubles"] == 1, report.failures
    report = Report()  # after the attempt a retry followed: not a final run
    check_chain([req("then", "s3", "b1", after_run="a1")], stream, CHAINED, report)
    assert report.figures["chain_wrong"] == 1, report.failures
    report = Report()  # nothing ran after it: liveness only
    check_chain([], stream, CHAINED, report)
    assert report.failures == [] and report.figures["chain_missed"] == 1
