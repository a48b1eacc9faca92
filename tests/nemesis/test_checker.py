"""The checker and the schedule on made-up histories: each failure it must see, it sees."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.nemesis.checker import History, bucket_job_logs, check, leaderless_from_logs, slots_of
from tests.nemesis.faults import NETWORK, PROCESS, plan

T0 = 1_800_000_000.0  # a whole, even second
NODES = ["n1", "n2", "n3"]
SIDECARS = ["s1", "s2"]


def run_info(**extra: Any) -> dict[str, Any]:
    return {
        "seed": 1,
        "window": [T0, T0 + 9.5],
        "settle": 2.0,
        "nodes": NODES,
        "sidecars": SIDECARS,
        "jobs": {"tick": {"period_s": 1, "max_late": 3.0}},
        **extra,
    }


def request(
    slot_s: float, at: float, app: str = "s1", attempt: int = 1, token: str = ""
) -> dict[str, Any]:
    slot = int(slot_s * 1000)
    return {
        "app": app,
        "at": at,
        "path": "/jobs/tick",
        "job": "tick",
        "slot": str(slot),
        "attempt": str(attempt),
        "fence": "1",
        "run_id": token or f"tok-{slot}-{attempt}",
        "instance": app,
    }


def claim(
    seq: int, slot_s: float, token: str = "", attempt: int = 1, at: float = 0.0
) -> dict[str, Any]:
    slot = int(slot_s * 1000)
    data = {
        "job": "tick",
        "slot": slot,
        "token": token or f"tok-{slot}-{attempt}",
        "instance": "s1",
    }
    if attempt > 1:
        data["attempt"] = attempt
    return {
        "seq": seq,
        "subject": "cron.tick.claims",
        "headers": {"Nats-Msg-Id": f"tick:{slot}" + (f":{attempt}" if attempt > 1 else "")},
        "data": data,
        "time": at or slot_s,
    }


def result(
    seq: int, slot_s: float, status: str, token: str = "", at: float = 0.0, attempt: int = 1
) -> dict[str, Any]:
    slot = int(slot_s * 1000)
    data = {
        "job": "tick",
        "slot": slot,
        "token": token or f"tok-{slot}-{attempt}",
        "instance": "s1",
        "status": status,
    }
    if attempt > 1:
        data["attempt"] = attempt
    return {
        "seq": seq,
        "subject": "cron.tick.results",
        "headers": {},
        "data": data,
        "time": at or slot_s + 0.1,
    }


def clean(n: int = 10) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    reqs = [request(T0 + i, T0 + i + 0.05) for i in range(n)]
    stream = [claim(i + 1, T0 + i) for i in range(n)]
    return reqs, stream


def test_a_clean_history_passes() -> None:
    reqs, stream = clean()
    report = check(History(reqs, stream, [], run_info()))
    assert report.ok, report.failures
    assert report.figures["slots"] == 10
    assert report.figures["runs"] == 10
    assert report.figures["missed"] == 0


def test_a_double_run_is_a_failure() -> None:
    reqs, stream = clean()
    reqs.append(request(T0 + 3, T0 + 3.2, app="s2", token="other"))
    report = check(History(reqs, stream, [], run_info()))
    assert report.figures["doubles"] == 1
    assert report.figures["unclaimed"] == 1  # the second run has no stored claim of its own
    assert any(f.startswith("double: tick slot") for f in report.failures)


def test_a_late_run_is_a_failure_unless_its_clock_was_set_behind() -> None:
    reqs, stream = clean()
    reqs[4] = request(T0 + 4, T0 + 4 + 3.0 + 1.5)  # max_late 3 s + margin 1 s exceeded
    report = check(History(reqs, stream, [], run_info()))
    assert report.figures["late"] == 1
    skew = {"kind": "clock", "target": "s1", "offset": -1.0, "start": T0, "end": T0 + 9}
    assert check(History(reqs, stream, [skew], run_info())).figures["late"] == 0


def test_a_missed_slot_is_a_failure_only_when_nothing_was_near() -> None:
    reqs, stream = clean()
    del reqs[5]
    report = check(History(reqs, stream, [], run_info()))
    assert report.figures["missed_quiet"] == 1
    assert report.figures["missed_available"] == 1
    pause = {"kind": "pause-node", "target": "n1", "start": T0 + 4, "end": T0 + 6, "leader": "n1"}
    report = check(History(reqs, stream, [pause], run_info()))
    assert report.ok, report.failures
    assert report.figures["missed"] == 1
    assert report.figures["missed_available"] == 1  # n2, n3 and a sidecar were fine
    assert report.figures["missed_no_election"] == 0  # the leader was paused: an election
    # A follower paused instead: a claim could be made and no election explains the miss.
    report = check(History(reqs, stream, [{**pause, "leader": "n2"}], run_info()))
    assert report.figures["missed_no_election"] == 1
    assert report.failures == [
        "missed while a claim could be made, with no election nor starvation near: "
        f"tick slot {int((T0 + 5) * 1000)}"
    ]
    split = {
        "kind": "partition",
        "start": T0 + 4,
        "end": T0 + 6,
        "blocked": [["n1", "n2"], ["n1", "n3"], ["n2", "n3"], ["n1", "s1"], ["n2", "s2"]],
    }
    assert check(History(reqs, stream, [split], run_info())).figures["missed_available"] == 0


def test_lost_records_are_judged() -> None:
    reqs, stream = clean()
    # Slot 2: its own result came first, then a lost record: wrong.
    stream += [result(20, T0 + 2, "succeeded"), result(21, T0 + 2, "lost", at=T0 + 6)]
    # Slot 3: lost while its runner was paused: right.
    stream += [result(22, T0 + 3, "lost", at=T0 + 7)]
    pause = {"kind": "pause-sidecar", "target": "s1", "start": T0 + 3.1, "end": T0 + 8}
    report = check(History(reqs, stream, [pause], run_info()))
    assert report.figures["lost"] == 2
    assert report.figures["lost_wrong"] == 1
    assert any("its own succeeded result was stored first" in f for f in report.failures)
    # Without any fault, a lost record is wrong (a healthy runner taken for dead).
    assert check(History(reqs, stream, [], run_info())).figures["lost_wrong"] == 2


def test_a_claim_killed_before_its_lease_must_be_recorded() -> None:
    reqs, stream = clean(41)
    del reqs[2]  # slot 2: its winner s1, restarted armed, was killed at claim.won
    kill = {"kind": "claim-kill", "target": "s1", "start": T0 + 1.4, "applied": T0 + 1.5,
            "killed_at": T0 + 2.1, "end": T0 + 5}  # fmt: skip
    info = run_info(window=[T0, T0 + 40.5])
    report = check(History(reqs, stream, [kill], info))
    assert report.figures["claim_kills"] == 1
    assert report.figures["claim_kills_unjudged"] == 1
    assert report.figures["missed_claim_killed"] == 1  # not a miss to explain
    assert any("killed before its lease and never recorded" in f for f in report.failures)
    stream.append(result(60, T0 + 2, "lost", at=T0 + 9))
    report = check(History(reqs, stream, [kill], info))
    assert report.ok, report.failures


@pytest.mark.parametrize(
    ("slot_s", "extra"),
    [
        (T0 + 2.5, {"trigger": "at"}),
        (T0 + 2, {"job": "then", "trigger": "after", "after_job": "tick", "after_run": "r"}),
        (T0 + 2, {"trigger": "backfill", "backfill": "b"}),
    ],
    ids=["at", "after", "backfill"],
)
def test_a_one_off_or_backfill_claim_killed_before_its_lease_must_be_recorded(
    slot_s: float, extra: dict[str, Any]
) -> None:
    reqs, stream = clean(41)
    # Only the one-off's (or the backfill's) claim was stored while s1 was armed.
    kill = {"kind": "claim-kill", "target": "s1", "start": T0 + 2.2, "applied": T0 + 2.3,
            "killed_at": T0 + 2.8, "end": T0 + 6}  # fmt: skip
    killed = claim(60, slot_s, token="tok-killed", at=T0 + 2.6)
    killed["data"].update(extra)
    info = run_info(window=[T0, T0 + 40.5])
    report = check(History(reqs, [*stream, killed], [kill], info))
    assert report.figures["claim_kills"] == 1
    assert report.figures["claim_kills_unjudged"] == 1
    assert any(
        "killed before its lease and never recorded" in f and extra["trigger"] in f
        for f in report.failures
    )
    lost = result(61, slot_s, "lost", token="tok-killed", at=T0 + 9)
    report = check(History(reqs, [*stream, killed, lost], [kill], info))
    assert report.figures["claim_kills_unjudged"] == 0
    assert report.figures["lost_wrong"] == 0, report.failures
    assert report.figures["lost_wrong"] == 0


def test_a_rerun_must_carry_a_higher_fence() -> None:
    reqs, stream = clean()
    rerun = request(T0 + 3, T0 + 6, attempt=2)
    stream += [claim(30, T0 + 3, attempt=2, at=T0 + 6), result(29, T0 + 3, "lost", at=T0 + 5.9)]
    reqs.append(rerun)
    pause = {"kind": "pause-sidecar", "target": "s1", "start": T0 + 3.05, "end": T0 + 8}
    report = check(History(reqs, stream, [pause], run_info()))
    assert report.figures["reruns"] == 1
    assert report.figures["reruns_needless"] == 0
    assert report.figures["reruns_bad"] == 1  # both fences are 1
    rerun["fence"] = "31"
    report = check(History(reqs, stream, [pause], run_info()))
    assert report.figures["reruns_bad"] == 0, report.failures


def test_a_msg_id_stored_twice_is_a_failure() -> None:
    reqs, stream = clean()
    stream.append(claim(40, T0 + 1))
    assert check(History(reqs, stream, [], run_info())).figures["dup_ids"] == 1


@pytest.mark.parametrize("period", [1, 2])
def test_slots_of_an_every_n_seconds_schedule(period: int) -> None:
    slots = slots_of(period, T0 + 0.5, T0 + 10)
    assert all(s % (period * 1000) == 0 for s in slots)
    assert slots[0] > (T0 + 0.5) * 1000 and slots[-1] <= (T0 + 10) * 1000
    assert len(slots) == 10 // period


def test_the_plan_is_a_function_of_its_seed_and_heals_in_time() -> None:
    a = plan(7, 120, NODES, ["s1", "s2", "s3"])
    assert [f.describe() for f in a] == [
        f.describe() for f in plan(7, 120, NODES, ["s1", "s2", "s3"])
    ]
    assert [f.describe() for f in a] != [
        f.describe() for f in plan(8, 120, NODES, ["s1", "s2", "s3"])
    ]
    assert all(f.at + f.duration <= 120 for f in a)
    kinds = {f.kind for seed in range(20) for f in plan(seed, 300, NODES, ["s1", "s2"])}
    assert kinds == set(NETWORK) | set(PROCESS)
    for f in a:
        if f.kind in ("partition", "bridge"):
            assert sum(n in side for side in f.sides for n in NODES) == (
                3 if f.kind == "partition" else 2
            )


def test_a_miss_is_put_down_to_an_election_only_when_the_leader_was_hit() -> None:
    reqs, stream = clean()
    del reqs[5]
    cut_leader = {
        "kind": "leader",
        "leader": "n1",
        "start": T0 + 4,
        "end": T0 + 6,
        "blocked": [["n1", "n2"], ["n1", "n3"]],
    }
    report = check(History(reqs, stream, [cut_leader], run_info()))
    assert report.figures["missed_available"] == 1
    assert report.figures["missed_no_election"] == 0
    pause_follower = {
        "kind": "pause-node",
        "target": "n2",
        "leader": "n1",
        "start": T0 + 4,
        "end": T0 + 6,
    }
    report = check(History(reqs, stream, [pause_follower], run_info()))
    assert report.figures["missed_no_election"] == 1


def test_a_partition_is_read_from_its_sides() -> None:
    reqs, stream = clean()
    del reqs[5]
    split = {
        "kind": "partition",
        "start": T0 + 4,
        "end": T0 + 6,
        "sides": [["n3", "s1"], ["n2", "n1", "s2"]],
    }
    report = check(History(reqs, stream, [split], run_info()))
    assert report.figures["missed_quiet"] == 0  # the servers were split: not quiet
    assert report.figures["missed_available"] == 1  # s2 with n1 and n2 could claim


def test_a_rerun_after_a_stored_success_is_needless() -> None:
    reqs, stream = clean()
    stream += [result(28, T0 + 3, "succeeded", at=T0 + 3.1)]
    stream += [result(29, T0 + 3, "lost", at=T0 + 5.9), claim(30, T0 + 3, attempt=2, at=T0 + 6)]
    reqs.append({**request(T0 + 3, T0 + 6, attempt=2), "fence": "30"})
    pause = {"kind": "pause-sidecar", "target": "s1", "start": T0 + 3.05, "end": T0 + 8}
    report = check(History(reqs, stream, [pause], run_info()))
    assert report.figures["reruns_needless"] == 1
    assert report.figures["lost_wrong"] == 1


def stall(at: float, late: float) -> dict[str, Any]:
    return {"kind": "stall", "t": at, "late": late}


def wait(at: float, proc: str, seconds: float, dt: float = 0.25) -> dict[str, Any]:
    return {"kind": "wait", "t": at, "dt": dt, "proc": proc, "wait": seconds}


def test_a_miss_is_put_down_to_starvation_only_with_evidence_in_its_window() -> None:
    """Slot 5 missed, a follower paused (no election): a failure, unless the run
    measured that the CPU was missing for a quarter of [slot, slot + max_late]."""
    reqs, stream = clean()
    del reqs[5], stream[5]  # nobody stored a claim of slot 5
    follower = {
        "kind": "pause-node",
        "target": "n2",
        "leader": "n1",
        "start": T0 + 4,
        "end": T0 + 6,
    }

    def judged(cpu: list[dict[str, Any]], more: list[dict[str, Any]] | None = None) -> Any:
        return check(History(reqs, stream + (more or []), [follower], run_info(), cpu))

    slot = int((T0 + 5) * 1000)
    assert judged([]).figures["missed_no_election"] == 1
    # The harness's own thread could not run for 0.8 s of the 3 s window (>= 0.75 s).
    report = judged([stall(T0 + 5.9, 0.4), stall(T0 + 7.0, 0.4)])
    assert report.ok, report.failures
    assert report.figures["missed_starved"] == 1
    assert report.figures["missed_no_election"] == 0
    assert report.notes == [
        f"starved: tick slot {slot}: the harness's sampling thread could not run for 0.80s of 3s"
    ]
    assert report.figures["stall_max_s"] == 0.4
    # Too little, or outside the window (before the slot, after slot + max_late): no excuse.
    assert judged([stall(T0 + 6, 0.5)]).figures["missed_no_election"] == 1
    assert judged([stall(T0 + 4.9, 2.0), stall(T0 + 9.5, 1.0)]).figures["missed_no_election"] == 1
    # Run-queue waits: every sidecar that could claim must have waited (s1 did, s2 did not) ...
    s1_waits = [wait(T0 + 5.25 + i * 0.25, "s1", 0.2) for i in range(8)]  # 1.6 s of 3 s
    assert judged(s1_waits).figures["missed_no_election"] == 1
    s2_waits = [wait(T0 + 5.25 + i * 0.25, "s2", 0.1) for i in range(8)]  # 0.8 s
    report = judged(s1_waits + s2_waits)
    assert report.figures["missed_starved"] == 1
    assert (
        "every sidecar that could claim waited on the run queue for s1 1.60s, s2 0.80s"
        in (report.notes[0])
    )
    # ... unless a claim was stored: then its winner is the one that had to run.
    won_by_s2 = [{**claim(50, T0 + 5), "data": {**claim(50, T0 + 5)["data"], "instance": "s2"}}]
    assert judged(s1_waits, won_by_s2).figures["missed_no_election"] == 1
    report = judged(s2_waits, won_by_s2)
    assert report.figures["missed_starved"] == 1
    assert "its winner s2 waited on the run queue for s2 0.80s" in report.notes[0]


def log_line(at: float, text: str) -> str:
    stamp = datetime.fromtimestamp(at).strftime("%Y/%m/%d %H:%M:%S.%f")
    return f"[4242] {stamp} {text}\n"


def test_an_election_the_servers_logged_explains_a_miss_the_faults_did_not(
    tmp_path: Path,
) -> None:
    """Seed 477497: a bridge cut follower n3 from leader n1 (n2 saw both); n3's
    higher term deposed n1 though n1 kept its majority, and no leader was elected
    for 5.8 s. Only a leaderless stretch over half of [slot, slot + max_late],
    logged by the servers for the stream's own Raft group, explains a miss."""
    n1, n2 = tmp_path / "n1.log", tmp_path / "n2.log"
    n1.write_text(
        log_line(
            T0 + 4.6,
            "[WRN] RAFT [abc - S-R3F-cron] Detected another leader with higher term, will stepdown",
        )
        + log_line(
            T0 + 4.6,
            "[WRN] RAFT [abc - S-R3F-kv] Detected another leader with higher term, will stepdown",
        )
        + log_line(T0 + 9.0, "[INF] JetStream cluster new stream leader for '$G > KV'")
    )
    n2.write_text(log_line(T0 + 6.6, "[INF] JetStream cluster new stream leader for '$G > CRON'"))
    logs = {"n1": n1, "n2": n2, "n3": tmp_path / "n3.log"}
    spans = leaderless_from_logs(logs, "CRON", "S-R3F-cron")
    assert spans == [
        (pytest.approx(T0 + 4.6), pytest.approx(T0 + 6.6), "n1 lost its leadership, n2 was elected")
    ]
    assert leaderless_from_logs(logs, "CRON", None) == []  # the group unknown: nothing
    reqs, stream = clean()
    del reqs[4], reqs[3]  # slots 3 and 4 (max_late 3 s): 1.4 s and 2.0 s of theirs without a leader
    follower = {
        "kind": "pause-node",
        "target": "n2",
        "leader": "n1",
        "start": T0 + 2,
        "end": T0 + 3,
    }
    report = check(History(reqs, stream, [follower], run_info(), [], spans))
    assert report.figures["missed_elections_logged"] == 1
    assert report.figures["missed_no_election"] == 1
    assert report.failures == [
        "missed while a claim could be made, with no election nor starvation near: "
        f"tick slot {int((T0 + 3) * 1000)}"
    ]
    assert report.notes[0].startswith(f"election logged: tick slot {int((T0 + 4) * 1000)}")
    # "has NO quorum, stalled" (the leader's own word) starts a stretch too.
    n1.write_text(
        log_line(T0 + 3.0, "[WRN] JetStream cluster stream '$G > CRON' has NO quorum, stalled")
    )
    assert leaderless_from_logs(logs, "CRON", None)[0][:2] == (
        pytest.approx(T0 + 3.0),
        pytest.approx(T0 + 6.6),
    )


# ---------------------------------------------------------------- the operated job


def ops_claim(seq: int, slot_s: float, token: str, **extra: Any) -> dict[str, Any]:
    slot = int(slot_s * 1000)
    tag = extra.get("backfill")
    return {
        "seq": seq,
        "subject": "cron.ops.claims",
        "headers": {"Nats-Msg-Id": f"ops:{slot}" + (f":{tag}" if tag else "")},
        "data": {"job": "ops", "slot": slot, "token": token, "instance": "s1", **extra},
        "time": slot_s + 0.5,
    }


def ops_call(slot_s: float, token: str, trigger: str = "scheduled") -> dict[str, Any]:
    return {
        "app": "s1",
        "at": slot_s + 0.5,
        "path": "/jobs/ops",
        "job": "ops",
        "slot": str(int(slot_s * 1000)),
        "attempt": "1",
        "fence": "1",
        "run_id": token,
        "instance": "s1",
        "trigger": trigger,
    }


def operated_history(stream: list[dict[str, Any]], reqs: list[dict[str, Any]]) -> History:
    """Slots T0, T0+2, ... T0+8 of `ops`: each given a fate by the caller."""
    info = run_info(operated={"ops": {"period_s": 2, "max_late": 3.0, "jitter": 1.0}})
    info["jobs"] = {}
    return History(reqs, stream, [], info)


def test_an_operated_slot_ends_as_one_run_or_one_skip_record() -> None:
    stream = [
        ops_claim(1, T0, "a"),
        ops_claim(2, T0 + 2, "b", skipped="paused"),
        ops_claim(3, T0 + 4, "c", skipped="skip"),
        ops_claim(4, T0 + 6, "d"),
        ops_claim(5, T0 + 8, "e", skipped="paused"),
        ops_claim(6, T0 + 2, "f", backfill="b", trigger="catchup"),  # a paused slot caught up
        ops_claim(7, T0, "g", backfill="b", trigger="backfill"),  # a backfill runs it anew
    ]
    reqs = [
        ops_call(T0, "a"),
        ops_call(T0 + 6, "d"),
        ops_call(T0 + 2, "f", "catchup"),
        ops_call(T0 + 0, "g", "backfill"),
    ]
    report = check(operated_history(stream, reqs))
    assert report.ok, report.failures
    fig = report.figures
    assert (fig["ops_runs"], fig["ops_skip_records"], fig["ops_catchups"]) == (2, 3, 1)
    assert fig["fate_violations"] == 0


@pytest.mark.parametrize(
    ("stream", "reqs", "says"),
    [
        # issue 39, item 3: one sidecar recorded it skipped, another ran it
        (
            [ops_claim(1, T0, "a", skipped="paused"), ops_claim(9, T0, "b")],
            [ops_call(T0, "b")],
            "fate messages",
        ),
        # a skip record (older sidecar's <job>:<slot>:s) and a run of the slot
        (
            [ops_claim(1, T0, "a")],
            [ops_call(T0, "a"), ops_call(T0, "x", "catchup")],
            "caught up",
        ),
        # issue 39, item 1: run as scheduled and caught up
        (
            [ops_claim(1, T0, "a"), ops_claim(2, T0, "x", backfill="b", trigger="catchup")],
            [ops_call(T0, "a"), ops_call(T0, "x", "catchup")],
            "caught up",
        ),
        # issue 39, item 2: a skipped slot triggered
        (
            [ops_claim(1, T0, "a", skipped="skip"), ops_claim(2, T0, "b")],
            [ops_call(T0, "b")],
            "a skip record",
        ),
        # nothing at all, no fault near
        ([], [], "no fate"),
    ],
)
def test_an_operated_slot_with_two_fates_or_none_is_a_failure(
    stream: list[dict[str, Any]], reqs: list[dict[str, Any]], says: str
) -> None:
    rest = [ops_claim(10 + i, T0 + 2 * i, f"r{i}") for i in range(1, 5)]
    calls = [ops_call(T0 + 2 * i, f"r{i}") for i in range(1, 5)]
    report = check(operated_history(stream + rest, reqs + calls))
    assert report.figures["fate_violations"] >= 1
    assert any(says in f for f in report.failures), report.failures


# ---------------------------------------------------------------- one-off runs


def at_claim(seq: int, slot_ms: int, token: str, stored: float) -> dict[str, Any]:
    return {
        "seq": seq,
        "subject": "cron.ops.claims",
        "headers": {"Nats-Msg-Id": f"ops:{slot_ms}:at"},
        "data": {"job": "ops", "slot": slot_ms, "token": token, "instance": "s1", "trigger": "at"},
        "time": stored,
    }


def at_call(slot_ms: int, token: str, at: float, app: str = "s1") -> dict[str, Any]:
    return {
        "app": app,
        "at": at,
        "path": "/jobs/ops",
        "job": "ops",
        "slot": str(slot_ms),
        "attempt": "1",
        "fence": "1",
        "run_id": token,
        "instance": app,
        "trigger": "at",
    }


def op(
    action: str, at: float, done: float, params: dict[str, Any], detail: Any = None
) -> dict[str, Any]:
    return {
        "action": action,
        "at": at,
        "done": done,
        "ok": True,
        "detail": detail,
        "params": params,
    }


ONE = int((T0 + 3.25) * 1000)  # a one-off's instant, off every schedule
TWO = int((T0 + 5.5) * 1000)


def at_history(
    stream: list[dict[str, Any]], reqs: list[dict[str, Any]], ops: list[dict[str, Any]]
) -> History:
    info = run_info(operated={"ops": {"period_s": 2, "max_late": 3.0, "jitter": 1.0}})
    info["jobs"] = {}
    # The operated job's own slots, each run once, so only the one-offs are judged.
    slots = [ops_claim(100 + i, T0 + 2 * i, f"r{i}") for i in range(5)]
    calls = [ops_call(T0 + 2 * i, f"r{i}") for i in range(5)]
    return History(reqs + calls, stream + slots, [], info, ops=ops)


QUEUED = [
    op("at", T0, T0 + 0.1, {"job": "ops", "slot": ONE}, {"slot": ONE, "new": True}),
    op("at", T0 + 1, T0 + 1.1, {"job": "ops", "slot": TWO}, {"slot": TWO, "new": True}),
]


def test_one_offs_run_once_each_and_a_cancel_that_came_first_holds() -> None:
    ops = [
        *QUEUED,
        # TWO is cancelled; ONE's cancel came after its claim: nothing to cancel.
        op(
            "cancel-at", T0 + 2, T0 + 2.1, {"job": "ops", "slot": TWO}, {"slot": TWO, "gone": [TWO]}
        ),
        op("cancel-at", T0 + 4, T0 + 4.1, {"job": "ops", "slot": ONE}, {"slot": ONE, "gone": []}),
    ]
    report = check(
        at_history([at_claim(1, ONE, "x", T0 + 3.3)], [at_call(ONE, "x", T0 + 3.31)], ops)
    )
    assert report.ok, report.failures
    fig = report.figures
    assert (fig["at_queued"], fig["at_cancelled"], fig["at_ran"], fig["at_missed"]) == (2, 1, 1, 0)
    assert fig["at_violations"] == 0
    # One-offs are not the operated job's slots: its figures count its schedule only.
    assert fig["ops_runs"] == 5 and fig["fate_violations"] == 0


def test_a_cancel_answered_after_the_claim_was_stored_allows_the_run() -> None:
    # The claim was stored while the cancel was on its way (between ask and answer):
    # the cancel found the entry the winner had not dropped yet.
    cancel = op("cancel-at", T0 + 3.2, T0 + 3.4, {"job": "ops", "slot": ONE}, {"gone": [ONE]})
    report = check(
        at_history(
            [at_claim(1, ONE, "x", T0 + 3.3)], [at_call(ONE, "x", T0 + 3.31)], [*QUEUED, cancel]
        )
    )
    assert report.figures["at_violations"] == 0, report.failures


@pytest.mark.parametrize(
    ("stream", "reqs", "ops", "says"),
    [
        # claimed twice under two ids, seen twice by the apps
        (
            [at_claim(1, ONE, "x", T0 + 3.3), at_claim(2, ONE, "y", T0 + 3.4)],
            [at_call(ONE, "x", T0 + 3.31), at_call(ONE, "y", T0 + 3.41, "s2")],
            QUEUED,
            "claimed 2 times",
        ),
        # one claim, but the app saw the run twice
        (
            [at_claim(1, ONE, "x", T0 + 3.3)],
            [at_call(ONE, "x", T0 + 3.31), at_call(ONE, "x", T0 + 3.5)],
            QUEUED,
            "the app saw it 2 times",
        ),
        # cancelled (the cancel removed it), claimed after the cancel answered
        (
            [at_claim(1, ONE, "x", T0 + 3.3)],
            [at_call(ONE, "x", T0 + 3.31)],
            [
                *QUEUED,
                op("cancel-at", T0 + 3, T0 + 3.1, {"job": "ops", "slot": ONE}, {"gone": [ONE]}),
            ],
            "ran though cancelled",
        ),
        # never queued
        (
            [at_claim(1, ONE, "x", T0 + 3.3)],
            [at_call(ONE, "x", T0 + 3.31)],
            QUEUED[1:],
            "nobody queued",
        ),
    ],
)
def test_each_kind_of_one_off_violation_is_flagged(
    stream: list[dict[str, Any]], reqs: list[dict[str, Any]], ops: list[dict[str, Any]], says: str
) -> None:
    report = check(at_history(stream, reqs, ops))
    assert report.figures["at_violations"] >= 1
    assert any(says in f for f in report.failures), report.failures


# ---------------------------------------------------------------- a job of the state bucket


def rt_claim(seq: int, slot_s: float, token: str, stored: float) -> dict[str, Any]:
    slot = int(slot_s * 1000)
    return {
        "seq": seq,
        "subject": "cron.rt.claims",
        "headers": {"Nats-Msg-Id": f"rt:{slot}"},
        "data": {"job": "rt", "slot": slot, "token": token, "instance": "s1"},
        "time": stored,
    }


def rt_call(slot_s: float, token: str, at: float, app: str = "s1") -> dict[str, Any]:
    return {
        "app": app,
        "at": at,
        "path": "/jobs/rt",
        "job": "rt",
        "slot": str(int(slot_s * 1000)),
        "attempt": "1",
        "fence": "1",
        "run_id": token,
        "instance": app,
        "trigger": "scheduled",
    }


def rt_history(
    slots: list[float],
    ops: list[dict[str, Any]],
    faults: list[dict[str, Any]] | None = None,
    logs: dict[str, list[tuple[float, str, str]]] | None = None,
) -> History:
    info = run_info(runtime={"rt": {"period_s": 2, "max_late": 3.0}})
    info["jobs"] = {}
    stream = [rt_claim(i + 1, s, f"t{i}", s + 0.2) for i, s in enumerate(slots)]
    reqs = [rt_call(s, f"t{i}", s + 0.21) for i, s in enumerate(slots)]
    return History(reqs, stream, faults or [], info, ops=ops, bucket_job_logs=logs or {})


RT = {"job": "rt"}
ADDED = op("job-add", T0 + 0.5, T0 + 0.6, RT, {"what": "created"})
REMOVED = op("job-remove", T0 + 4.5, T0 + 4.6, RT, {"what": "removed"})


def test_a_bucket_job_runs_from_its_add_to_its_removal() -> None:
    report = check(rt_history([T0 + 2, T0 + 4], [ADDED, REMOVED]))
    assert report.ok, report.failures
    assert (report.figures["rt_runs"], report.figures["rt_removals"]) == (2, 1)
    # Inside the window after the removal (its answer plus REMOVAL_WINDOW): allowed.
    report = check(rt_history([T0 + 2, T0 + 4, T0 + 6], [ADDED, REMOVED]))
    assert report.ok, report.failures


def test_a_removal_taken_up_late_under_a_fault_is_excused() -> None:
    pause = {"kind": "pause-sidecar", "target": "s1", "start": T0 + 4, "end": T0 + 7.5}
    report = check(rt_history([T0 + 2, T0 + 8], [ADDED, REMOVED], [pause]))
    assert report.figures["runtime_violations"] == 0, report.failures
    assert report.figures["rt_after_removal_excused"] == 1


@pytest.mark.parametrize(
    ("slots", "ops", "logs", "says"),
    [
        # a slot before the job was ever added
        ([T0], [ADDED], None, "before any job add"),
        # a slot well after `job remove` answered, nothing touched anything
        ([T0 + 2, T0 + 8], [ADDED, REMOVED], None, "after `job remove` answered"),
        # claimed by a sidecar that had logged letting the job go (even in the window)
        (
            [T0 + 2, T0 + 6],
            [ADDED, REMOVED],
            {"s1": [(T0 + 0.7, "rt", "taken"), (T0 + 4.7, "rt", "left")]},
            "logged letting the job go",
        ),
        # run twice
        ([T0 + 2, T0 + 2], [ADDED], None, "double: rt slot"),
    ],
)
def test_each_kind_of_bucket_job_violation_is_flagged(
    slots: list[float],
    ops: list[dict[str, Any]],
    logs: dict[str, list[tuple[float, str, str]]] | None,
    says: str,
) -> None:
    report = check(rt_history(slots, ops, logs=logs))
    assert not report.ok
    assert any(says in f for f in report.failures), report.failures


def test_the_sidecars_logs_say_when_each_took_a_bucket_job_up_or_let_it_go(
    tmp_path: Path,
) -> None:
    log = tmp_path / "s1.log"
    log.write_text(
        "2026-12-05 11:00:00,250 INFO sidecar.admin.bucket_jobs: job rt (id nemesis/rt) taken up "
        "from the state bucket: */2 * * * * *\n"
        "2026-12-05 11:00:01,500 INFO sidecar.run.job_loop: something else\n"
        "2026-12-05 11:00:04,000 INFO sidecar.admin.bucket_jobs: job rt (id nemesis/rt) changed "
        "in the state bucket\n"
        "2026-12-05 11:00:09,000 INFO sidecar.admin.bucket_jobs: job rt (id nemesis/rt) left the "
        "state bucket: not run any more\n"
    )
    events = bucket_job_logs({"s1": log, "s2": tmp_path / "none.log"})
    base = datetime(2026, 12, 5, 11, 0, 0).timestamp()
    assert events["s2"] == []
    assert [(round(at - base, 3), job, kind) for at, job, kind in events["s1"]] == [
        (0.25, "rt", "taken"),
        (4.0, "rt", "changed"),
        (9.0, "rt", "left"),
    ]


def test_a_removal_taken_up_late_says_what_the_runner_logged_of_the_job() -> None:
    logs = {"s1": [(T0 + 0.7, "rt", "taken"), (T0 + 3.5, "rt", "changed"), (T0 + 9, "rt", "left")]}
    report = check(rt_history([T0 + 2, T0 + 8], [ADDED, REMOVED], logs=logs))
    late = [f for f in report.failures if "after `job remove` answered" in f]
    assert late and "s1 logged, from the removal: " in late[0], report.failures
    removed = float(REMOVED["done"])
    assert f"changed {T0 + 3.5 - removed:+.2f}s, left {T0 + 9 - removed:+.2f}s" in late[0], late


def test_a_partition_that_cuts_off_the_state_buckets_leader_hits_a_leader(tmp_path: Path) -> None:
    """Seed 876563: the claims' stream led by n1, the state bucket's by n2; a partition
    cut n2 off. Claims wait for the bucket's view and runs for their lease, so the
    fault hit a leader although the stream's own leader kept its majority."""
    from tests.nemesis.checker import leaders_from_logs, touches

    log = tmp_path / "n2.log"
    log.write_text(
        "[7] 2026/12/06 13:49:16.888979 [INF] JetStream cluster new stream leader "
        "for '$G > KV_CRON_STATE'\n"
    )
    leaders = leaders_from_logs({"n2": log, "n1": tmp_path / "none.log"}, "KV_CRON_STATE")
    at = leaders[0][0]
    cut = {
        "kind": "partition",
        "start": at + 2,
        "end": at + 8,
        "leader": "n1",
        "sides": [["n2", "s2"], ["n1", "n3", "s1", "s3"]],
    }
    nodes = {"n1", "n2", "n3"}
    assert leaders == [(at, "n2")]
    assert not touches([cut], nodes)[0].leader_hit  # the stream's leader alone: kept
    assert touches([cut], nodes, leaders)[0].leader_hit
    before = {**cut, "start": at - 10, "end": at - 5}  # n2 did not lead yet
    assert not touches([before], nodes, leaders)[0].leader_hit


def test_a_bridge_hits_a_leader_on_a_side_node_not_one_on_the_bridge() -> None:
    """A replay of seed 768265 missed a tick slot in a bridge with the stream's
    leader on a side node: a sidecar on the other side node (no route to the
    leader) or across the cut learns it only from an unanswered claim, then
    moves; the model does not know who is connected where. A leader on the
    bridge node reaches every server: a miss then is still a failure."""
    from tests.nemesis.checker import touches

    nodes = {"n1", "n2", "n3"}
    bridge = {
        "kind": "bridge",
        "start": T0 + 4,
        "end": T0 + 8,
        "sides": [["n1", "s1", "s2"], ["n3", "s3"]],
        "bridge": "n2",
    }
    assert touches([{**bridge, "leader": "n1"}], nodes)[0].leader_hit
    assert touches([{**bridge, "leader": "n3"}], nodes)[0].leader_hit
    assert not touches([{**bridge, "leader": "n2"}], nodes)[0].leader_hit
    # The state bucket's leader alone on a side node delays a claim, does not stop it.
    assert not touches([{**bridge, "leader": "n2"}], nodes, [(T0, "n1")])[0].leader_hit
    reqs, stream = clean()
    del reqs[5]
    report = check(History(reqs, stream, [{**bridge, "leader": "n2"}], run_info()))
    assert report.figures["missed_no_election"] == 1
    report = check(History(reqs, stream, [{**bridge, "leader": "n1"}], run_info()))
    assert report.figures["missed_available"] == 1
    assert report.figures["missed_no_election"] == 0
