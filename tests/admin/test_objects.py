"""The recent runs kept per job (sidecar/admin/recent.py): what status and the page show.

Pure logic fed with stored messages as the stream gives them; the objects
built from it are checked against real sidecars in test_page.py.
"""

from __future__ import annotations

import json
from typing import Any

from sidecar.admin.jobfilter import problems
from sidecar.admin.objects import job_object, leases_by_job, problem_part
from sidecar.admin.recent import STRIP, Recent, consecutive_failures
from sidecar.config.load import parse_config
from sidecar.store.state import View


def claim(job: str, slot: int, token: str, **extra: Any) -> bytes:
    body = {"job": job, "slot": slot, "token": token, "instance": "i1", **extra}
    return json.dumps(body).encode()


def result(job: str, token: str, status: str) -> bytes:
    return json.dumps({"job": job, "token": token, "status": status, "instance": "i1"}).encode()


def test_a_strip_keeps_the_newest_runs_whatever_order_they_are_read_in() -> None:
    recent = Recent("cron.")
    # The newest first (a last-per-subject read), then the tail from older ones.
    recent.add(100, "cron.a.claims", claim("a", 100_000, "t100"))
    for seq in range(1, 40):
        recent.add(seq, "cron.a.claims", claim("a", seq * 1000, f"t{seq}"))
    strip = recent.strip("a")
    assert len(strip) == STRIP
    assert strip[0]["token"] == "t100"  # newest first
    assert [r["token"] for r in strip[1:4]] == ["t39", "t38", "t37"]
    assert all(r["status"] == "running" for r in strip)


def test_results_mark_their_runs_and_a_real_result_wins_over_lost() -> None:
    recent = Recent("cron.")
    recent.add(1, "cron.a.claims", claim("a", 1000, "x"))
    recent.add(2, "cron.a.claims", claim("a", 2000, "y", attempt=2, manual=True))
    recent.add(3, "cron.a.results", result("a", "x", "lost"))
    recent.add(4, "cron.a.results", result("a", "x", "succeeded"))
    recent.add(5, "cron.a.results", result("a", "y", "failed"))
    recent.add(6, "cron.a.results", result("a", "y", "lost"))  # after the real one: ignored
    strip = recent.strip("a")
    assert [(r["token"], r["status"], r["attempt"], r["manual"]) for r in strip] == [
        ("y", "failed", 2, True),
        ("x", "succeeded", 1, False),
    ]
    assert strip[0]["fence"] == 2  # the claim's stream sequence
    last = recent.last_run("a")
    assert last is not None and last["token"] == "y" and last["status"] == "failed"


def test_foreign_and_malformed_messages_are_skipped() -> None:
    recent = Recent("cron.")
    assert recent.add(1, "other.a.claims", claim("a", 1, "t")) is None
    assert recent.add(2, "cron.a.claims", b"{not json") is None
    assert recent.add(3, "cron.a.claims", claim("b", 1, "t")) is None  # body of another job
    assert recent.add(4, "cron.a.claims", claim("a", True, "t")) is None  # type: ignore[arg-type]
    assert recent.add(5, "cron.a.b.claims", claim("a.b", 1, "t")) is None
    assert recent.add(6, "cron.a.actions", b"{}") is None
    assert recent.strip("a") == [] and recent.last_run("a") is None
    assert recent.last_seq == 6


def test_consecutive_failures_count_finished_runs_newest_first() -> None:
    runs = [{"status": s} for s in ("running", "failed", "lost", "failed", "succeeded", "failed")]
    assert consecutive_failures(runs) == 3
    assert consecutive_failures([{"status": "succeeded"}, {"status": "failed"}]) == 0
    assert consecutive_failures([]) == 0
    # A skipped slot sent nothing: the row goes on, as health.<job> counts it.
    skipped = [{"status": s} for s in ("skipped", "failed", "skipped", "failed", "succeeded")]
    assert consecutive_failures(skipped) == 2


def test_problem_part_finds_the_problems_of_the_whole_object() -> None:
    """ "Problems only" picks jobs by ``problem_part`` before building any object
    (sidecar/admin/pagecache.py): for every kind of problem, and none, it says what
    the whole object says."""
    now_ms = 1_900_000_000_000
    yearly = "0 0 1 1 *"
    config = parse_config(
        {
            "jobs": [
                {"name": n, "schedule": yearly}
                for n in ("fine", "fails", "failed-once", "paused", "held", "differs", "nobody")
            ]
            + [
                {"name": "over", "schedule": yearly, "end_at": "2020-01-01T00:00:00Z"},
                {"name": "later", "schedule": yearly, "start_at": "2099-01-01T00:00:00Z"},
                {"name": "ended-pause", "schedule": yearly},
                {"name": "every", "schedule": "* * * * *", "run_on": "every"},
            ]
        },
        {},
    )
    recent = Recent("cron.")
    recent.add(1, "cron.fails.claims", claim("fails", now_ms - 60_000, "f1"))
    recent.add(2, "cron.fails.results", result("fails", "f1", "failed"))
    recent.add(3, "cron.failed-once.claims", claim("failed-once", now_ms - 60_000, "o1"))
    recent.add(4, "cron.failed-once.results", result("failed-once", "o1", "lost"))
    recent.add(5, "cron.failed-once.claims", claim("failed-once", now_ms - 30_000, "o2"))
    recent.add(6, "cron.failed-once.results", result("failed-once", "o2", "succeeded"))
    for i in range(3):  # run_on: every, by i1 only: i2 missed them
        slot = now_ms - (i + 2) * 60_000
        recent.add(10 + i, "cron.every.claims", claim("every", slot, f"e{i}", run_on="every"))
    oldest = now_ms - 4 * 60_000  # i2 ran the oldest slot, then none: it missed some
    recent.add(20, "cron.every.claims", claim("every", oldest, "x", run_on="every", instance="i2"))
    view = View()
    view.apply("paused.paused", json.dumps({"by": "me"}).encode(), 1, False)
    view.apply(
        "paused.ended-pause", json.dumps({"until": "2020-01-01T00:00:00Z"}).encode(), 2, False
    )
    held: dict[str, str | None] = {"held": "the stream's subjects do not cover it"}
    # Run by no live instance: a problem, unless paused, ended or not started (quiet).
    nobody = ("nobody", "paused", "over", "later")
    runners = {job.name: ["i1", "i2"] for job in config.jobs if job.name not in nobody}
    for live in (0, 1, 2):
        for job in config.jobs:
            args = (job, view, recent, now_ms, {"differs"}, held)
            whole = job_object(*args, runners=runners, leases=leases_by_job(view))
            assert problems(problem_part(*args, runners), live) == problems(whole, live), job.name
    shown = [
        j.name
        for j in config.jobs
        if problems(problem_part(j, view, recent, now_ms, {"differs"}, held, runners), 1)
    ]
    assert shown == ["fails", "held", "differs", "nobody", "every"]
