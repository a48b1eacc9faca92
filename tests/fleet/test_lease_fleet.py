"""Run leases on NATS KV (docs/GUARANTEES.md), with real sidecar processes and a real nats-server.

Overlap protection, lost runs after `kill -9` and SIGSTOP, reruns and retries
as further attempts of the same slot, and the cluster leader killed while
leases are held. The app records every request, its headers and how many of a
path were in flight at once.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sidecar.core.clock import parse_rfc3339
from tests.support import (
    NatsCluster,
    NatsServer,
    RecordingApp,
    Request,
    Sidecar,
    StoredMsg,
    job,
    read_stream,
    results,
    run_cli,
    sidecars,
    slow_run,
    wait_for,
    write_config,
)

TTL = "2s"


def base(
    urls: list[str], app: RecordingApp, jobs: list[dict[str, Any]], lease_ttl: str = TTL
) -> dict[str, Any]:
    return {
        "nats": {"servers": urls, "lease_ttl": lease_ttl},
        "target": {"url": app.url, "timeout": "20s"},
        "jobs": jobs,
    }


def claims(url: str, job_name: str) -> list[StoredMsg]:
    return [m for m in read_stream(url) if m.subject == f"cron.{job_name}.claims"]


def attempt_of(req: Request) -> int:
    return int(req.headers["X-Anarchon-Attempt"])


def runs_of(app: RecordingApp, path: str) -> Counter[tuple[int, int]]:
    """How many requests each (slot, attempt) got."""
    return Counter(
        (int(r.headers["X-Anarchon-Slot"]), attempt_of(r)) for r in app.requests_for(path)
    )


def total(procs: list[Sidecar], name: str, labels: dict[str, str]) -> float:
    return sum(p.metric(name, labels) or 0 for p in procs if p.proc and p.proc.poll() is None)


def history(tmp_path: Path, config: dict[str, Any], job_name: str) -> list[dict[str, Any]]:
    path = write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config})
    res = run_cli("history", job_name, "-c", str(path), "--json", "--limit", "1000")
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def test_overlap_skip_never_runs_two_at_once_and_records_skipped_slots(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.delay["/jobs/long"] = 3.5
    config = base([nats_server.url], http_app, [job("long", overlap="skip")])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(
            lambda: sum(1 for r in http_app.requests_for("/jobs/long") if r.finished) >= 2,
            30,
            what="two finished runs",
        )
        overlap = {"job": "long", "reason": "overlap"}
        wait_for(
            lambda: total(procs, "anarchon_runs_skipped_total", overlap) >= 4,
            20,
            what="skipped slots counted",
        )
        skipped = total(procs, "anarchon_runs_skipped_total", overlap)
        cfg = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))

        def running_now() -> list[dict[str, Any]]:
            status = json.loads(run_cli("status", "-c", cfg, "--json").stdout)
            return list(next(j for j in status["jobs"] if j["name"] == "long")["running"])

        # While a run is going, status lists it: one lock, with its instance.
        running = wait_for(running_now, 20, what="status lists the running run")
        wait_for(
            lambda: "long running: slot " in run_cli("status", "-c", cfg).stdout,
            20,
            what="the status table shows the running run",
        )
        procs_total = total(procs, "anarchon_runs_total", {"job": "long", "status": "skipped"})
    assert http_app.max_in_flight["/jobs/long"] == 1
    # One request per slot at most, and never a request for a skipped slot.
    stored = results(nats_server.url, "long")
    skipped_results = [m.data for m in stored if m.data["status"] == "skipped"]
    assert len(skipped_results) >= skipped
    assert procs_total >= skipped
    assert all(r["error"].startswith("overlap") for r in skipped_results)
    ran = {int(r.headers["X-Anarchon-Slot"]) for r in http_app.requests_for("/jobs/long")}
    assert not ran & {r["slot"] for r in skipped_results}
    assert max(runs_of(http_app, "/jobs/long").values()) == 1
    assert len(running) == 1
    assert running[0]["instance"] in {"s0", "s1", "s2"}
    assert running[0]["key"] == "lock.long" and running[0]["attempt"] == 1


def in_flight_at(app: RecordingApp, path: str, instance: str, at: float) -> list[Request]:
    """The requests of `instance` that had arrived and not yet finished at `at`."""
    return [
        r
        for r in app.requests_for(path)
        if r.headers.get("X-Anarchon-Instance") == instance
        and r.at <= at
        and (not r.finished or r.finished > at)
    ]


def test_killed_runner_is_recorded_lost_once_and_rerun_once_elsewhere(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    rerun = job("work", on_lost="rerun", retry={"max": 1, "backoff": "1s"})
    config = base([nats_server.url], http_app, [rerun])
    path = "/jobs/work"
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: len(http_app.requests_for(path)) >= 2, 20, what="first runs")
        first, victim = slow_run(http_app, procs, path, 4.0)
        time.sleep(0.3)  # its lease is created and renewed
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        killed_at = time.time()
        victim.proc.wait(10)
        http_app.delay[path] = 0.0
        lost_runs = in_flight_at(http_app, path, victim.name, killed_at)
        tokens = {r.headers["X-Anarchon-Run-Id"] for r in lost_runs}
        assert first.headers["X-Anarchon-Run-Id"] in tokens

        def lost_results() -> list[StoredMsg]:
            return [m for m in results(nats_server.url, "work") if m.data["status"] == "lost"]

        wait_for(
            lambda: {m.data["token"] for m in lost_results()} >= tokens,
            15,
            interval=0.2,
            what="a lost result for every run of the killed runner",
        )
        alive = [p for p in procs if p is not victim]
        # The reruns: attempt 2 of each lost slot, once, on another instance.
        lost_slots = {int(r.headers["X-Anarchon-Slot"]) for r in lost_runs}
        wait_for(
            lambda: {s for (s, a) in runs_of(http_app, path) if a == 2} >= lost_slots,
            15,
            what="attempt 2 of every lost slot",
        )
        time.sleep(1.5)  # a second rerun would come now
        counted = total(alive, "anarchon_runs_lost_total", {"job": "work"})
        due = total(alive, "anarchon_attempts_due_total", {"job": "work", "reason": "lost"})
        hist = history(tmp_path, config, "work")
        table = run_cli("history", "work", "-c", str(tmp_path / "cli.yaml"), "--limit", "1000")
    lost = lost_results()
    # Exactly one lost result per run, each stored within lease_ttl + 2 s of the kill.
    assert sorted(m.data["token"] for m in lost) == sorted(tokens)
    for m in lost:
        assert m.headers["Nats-Msg-Id"] == f"work:{m.data['slot']}:1:lost"
        assert m.time - killed_at <= 2.0 + 2.0, (m.time - killed_at, m.data)
        assert m.data["instance"] == victim.name and "lease run.work." in m.data["error"]
        assert parse_rfc3339(m.data["finished_at"]) <= m.time
    assert counted == len(tokens) and due == len(tokens)
    reruns = [r for r in http_app.requests_for(path) if attempt_of(r) == 2]
    assert {int(r.headers["X-Anarchon-Slot"]) for r in reruns} == lost_slots
    assert all(r.headers["X-Anarchon-Instance"] != victim.name for r in reruns)
    # No (slot, attempt) ran twice.
    assert max(runs_of(http_app, path).values()) == 1
    attempt2 = [m for m in claims(nats_server.url, "work") if m.data.get("attempt") == 2]
    assert {m.headers["Nats-Msg-Id"] for m in attempt2} == {f"work:{s}:a2" for s in lost_slots}
    # History: one row per attempt; the lost ones read lost, their reruns succeeded.
    rows = {(r["slot"], r["attempt"]): r for r in hist}
    for slot in lost_slots:
        assert rows[(slot, 1)]["status"] == "lost"
        assert rows[(slot, 2)]["status"] == "succeeded"
    assert " lost " in table.stdout and "(rerun, attempt 2)" in table.stdout, table.stdout
    # Attempt 1 claims are the reference's: no attempt field, id <job>:<slot>.
    first_claims = [m for m in claims(nats_server.url, "work") if "attempt" not in m.data]
    assert all(m.headers["Nats-Msg-Id"] == f"work:{m.data['slot']}" for m in first_claims)


def test_failed_attempts_are_retried_once_mostly_on_the_healthy_replica(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = "/jobs/flaky"
    broken = RecordingApp()
    broken.status[path] = 500
    broken.start()
    try:
        spec = job("flaky", schedule="*/2 * * * * *", retry={"max": 2, "backoff": "1s"})
        good = base([nats_server.url], http_app, [spec])
        bad = base([nats_server.url], broken, [spec])
        with sidecars(tmp_path, [("good", good, {}), ("bad", bad, {})]) as procs:

            def retried_slots() -> set[int]:
                failed = {s for (s, a) in runs_of(broken, path) if a == 1}
                both = runs_of(http_app, path) + runs_of(broken, path)
                return {s for s in failed if (s, 2) in both}

            wait_for(lambda: len(retried_slots()) >= 3, 40, what="three retried slots")
            time.sleep(3)  # attempts after a good retry would come now
            due = total(procs, "anarchon_attempts_due_total", {"job": "flaky", "reason": "retry"})
    finally:
        broken.stop()
    ok, failed = runs_of(http_app, path), runs_of(broken, path)
    both = ok + failed
    # No attempt of any slot ran twice, anywhere.
    assert max(both.values()) == 1
    # Every failed attempt N <= 2 is followed by attempt N + 1 (the last ones may
    # still be due); a succeeded one never is.
    for slot, attempt in failed:
        if attempt <= 2 and (slot, attempt + 1) not in both:
            assert slot / 1000 > time.time() - 12, (slot, attempt)
    for slot, attempt in ok:
        assert (slot, attempt + 1) not in both
    assert all(a <= 3 for (_, a) in both)
    # The healthy replica takes most retries: the failing one waits max(jitter, 500ms) more.
    retries_good = sum(1 for (_, a) in ok if a > 1)
    retries_bad = sum(1 for (_, a) in failed if a > 1)
    assert retries_good > retries_bad, (retries_good, retries_bad)
    # Each retry that ran was made due once, by the replica whose attempt failed.
    assert sum(1 for (_, a) in both if a > 1) <= due <= sum(1 for (_, a) in failed if a <= 2)
    # The app sees the attempt, and the claims of attempt N > 1 have their own id.
    stored = claims(nats_server.url, "flaky")
    for m in stored:
        attempt = m.data.get("attempt", 1)
        suffix = "" if attempt == 1 else f":a{attempt}"
        assert m.headers["Nats-Msg-Id"] == f"flaky:{m.data['slot']}{suffix}"


def test_a_runner_stopped_past_its_lease_is_recorded_lost_rerun_once_and_its_late_result_wins(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = "/jobs/work"
    rerun = job("work", on_lost="rerun", retry={"max": 1, "backoff": "1s"})
    config = base([nats_server.url], http_app, [rerun])
    with sidecars(tmp_path, [("s0", config, {}), ("s1", config, {})]) as procs:
        wait_for(lambda: len(http_app.requests_for(path)) >= 2, 20, what="first runs")
        first, victim = slow_run(http_app, procs, path, 1.0)
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        token = first.headers["X-Anarchon-Run-Id"]
        slot = int(first.headers["X-Anarchon-Slot"])
        try:
            wait_for(
                lambda: any(
                    m.data["token"] == token and m.data["status"] == "lost"
                    for m in results(nats_server.url, "work")
                ),
                10,
                interval=0.2,
                what="the stopped runner's run recorded lost",
            )
            wait_for(lambda: (slot, 2) in runs_of(http_app, path), 10, what="the rerun")
        finally:
            victim.proc.send_signal(signal.SIGCONT)
        assert time.time() - stopped_at > 2.0
        http_app.delay[path] = 0.0
        # Back: its real result comes late, and its renewal failures are counted.
        wait_for(
            lambda: any(
                m.data["token"] == token and m.data["status"] == "succeeded"
                for m in results(nats_server.url, "work")
            ),
            15,
            what="the late real result",
        )
        wait_for(
            lambda: (
                (victim.metric("anarchon_lease_renewal_failures_total", {"job": "work"}) or 0) >= 1
            ),
            10,
            what="the failed renewal counted",
        )
        time.sleep(1.5)
        hist = history(tmp_path, config, "work")
    assert runs_of(http_app, path)[(slot, 2)] == 1 and max(runs_of(http_app, path).values()) == 1
    rows = [r for r in hist if r["slot"] == slot]
    assert sorted(r["attempt"] for r in rows) == [1, 2]
    by_attempt = {r["attempt"]: r for r in rows}
    # The real result wins over lost; each attempt is one row.
    assert by_attempt[1]["status"] == "succeeded" and by_attempt[1]["instance"] == victim.name
    assert by_attempt[2]["status"] == "succeeded" and by_attempt[2]["instance"] != victim.name
    # The rerun's fence is higher: an app that keeps the highest fence refuses the stale runner.
    rerun_req = next(
        r
        for r in http_app.requests_for(path)
        if r.headers["X-Anarchon-Run-Id"] != token and int(r.headers["X-Anarchon-Slot"]) == slot
    )
    assert int(rerun_req.headers["X-Anarchon-Fence"]) > int(first.headers["X-Anarchon-Fence"])
    lost = [m for m in results(nats_server.url, "work") if m.data["status"] == "lost"]
    tokens = [m.data["token"] for m in lost]
    assert token in tokens and len(tokens) == len(set(tokens))
    assert all(m.data["instance"] == victim.name for m in lost)


def test_a_drain_keeps_renewing_until_its_runs_are_recorded(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = "/jobs/slow"
    config = base([nats_server.url], http_app, [job("slow", schedule="*/2 * * * * *")])
    with sidecars(tmp_path, [("s0", config, {}), ("s1", config, {})]) as procs:
        http_app.delay[path] = 4.0  # 2 lease TTLs
        run = wait_for(lambda: next(iter(http_app.requests_for(path)), None), 20, what="a run")
        runner = next(p for p in procs if p.name == run.headers["X-Anarchon-Instance"])
        time.sleep(0.3)
        http_app.delay[path] = 0.0  # later runs are quick
        assert runner.terminate() == 0
        token = run.headers["X-Anarchon-Run-Id"]
        time.sleep(2.5)  # the watcher would have seen an expiry by now
    stored = {m.data["token"]: m.data for m in results(nats_server.url, "slow")}
    assert stored[token]["status"] == "succeeded"
    assert [m for m in stored.values() if m["status"] == "lost"] == []
    assert "renewal failed" not in runner.log()


def test_the_leader_killed_while_leases_are_held_loses_no_run_and_runs_none_twice(
    tmp_path: Path, http_app: RecordingApp
) -> None:
    cluster = NatsCluster(tmp_path / "cluster")
    cluster.start()
    try:
        path = "/jobs/tick"
        http_app.delay[path] = 3.0
        config = base(cluster.urls, http_app, [job("tick")], lease_ttl="30s")
        config["nats"]["replicas"] = 3
        with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
            wait_for(lambda: len(http_app.requests_for(path)) >= 3, 30, what="runs")
            leader = wait_for(lambda: cluster.stream_leader("KV_CRON_STATE"), 10, what="leader")
            cluster.node(leader).kill()
            killed_at = time.time()
            wait_for(
                lambda: len([r for r in http_app.requests_for(path) if r.at > killed_at + 5]) >= 3,
                40,
                what="runs after the new leader took over",
            )
            # Every run around the kill records its result (while the new leader
            # settles) and then releases its lease: none is left to expire later.
            alive = cluster.urls[0] if leader != "n1" else cluster.urls[1]
            cfg = {**config, "nats": {**config["nats"], "servers": [alive]}}
            cli = write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **cfg})

            def only_fresh_leases() -> bool:
                status = json.loads(run_cli("status", "-c", str(cli), "--json").stdout)
                running = next(j for j in status["jobs"] if j["name"] == "tick")["running"]
                return bool(running) and all(r["seconds"] < 3.0 + 2.0 for r in running)

            wait_for(only_fresh_leases, 45, interval=0.5, what="the old leases released")
            failures = total(procs, "anarchon_lease_renewal_failures_total", {"job": "tick"})
            lost = total(procs, "anarchon_runs_lost_total", {"job": "tick"})
            stored = results(alive, "tick")
    finally:
        cluster.stop()
    assert lost == 0 and [m for m in stored if m.data["status"] == "lost"] == []
    assert max(runs_of(http_app, path).values()) == 1
    print(f"lease renewal failures across the leader change: {failures:g}")


async def test_lease_traffic_per_run_is_a_create_its_renewals_and_a_delete(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Every write of a lease is a publish on its key's subject: count them per run."""
    import asyncio

    import nats

    path = "/jobs/t"
    http_app.delay[path] = 2.3  # renewed at 1 s and 2 s with lease_ttl 3s
    config = base([nats_server.url], http_app, [job("t", jitter="0s")], lease_ttl="3s")
    writes: dict[str, list[str]] = {}
    nc = await nats.connect(nats_server.url)

    async def seen(msg: Any) -> None:
        op = (msg.headers or {}).get("KV-Operation", "PUT")
        writes.setdefault(msg.subject.rsplit(".", 1)[1], []).append(op)

    await nc.subscribe("$KV.CRON_STATE.run.t.>", cb=seen)
    try:
        with sidecars(tmp_path, [("s0", config, {}), ("s1", config, {})]):
            deadline = time.monotonic() + 40
            while sum(1 for ops in writes.values() if ops[-1] == "DEL") < 4:
                assert time.monotonic() < deadline, writes
                await asyncio.sleep(0.2)
    finally:
        await nc.close()
    done = {slot: ops for slot, ops in writes.items() if ops[-1] == "DEL"}
    per_run = [len(ops) for ops in done.values()]
    renewals = [len(ops) - 2 for ops in done.values()]
    print(f"lease writes per run of 2.3 s with lease_ttl 3s: {sorted(per_run)}")
    for ops in done.values():
        assert ops[0] == "PUT" and ops.count("DEL") == 1
    # One renewal per lease_ttl / 3 of the lease's life: 2 for a 2.3 s run, 3 on
    # a slow machine. Each renewal waits lease_ttl / 3 from the one before, so a
    # first renewal that a loaded machine makes 0.3 s late leaves room for only
    # one before the run ends: 1 now and then, never more than 3, never 1 for all.
    assert all(1 <= n <= 3 for n in renewals), renewals
    assert max(renewals) >= 2, renewals


def test_a_killed_runner_holding_the_overlap_lock_is_lost_and_the_job_runs_again(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    path = "/jobs/solo"
    http_app.delay[path] = 6.0
    config = base([nats_server.url], http_app, [job("solo", overlap="skip")])
    with sidecars(tmp_path, [("s0", config, {}), ("s1", config, {})]) as procs:
        first = wait_for(lambda: next(iter(http_app.requests_for(path)), None), 20, what="a run")
        victim = next(p for p in procs if p.name == first.headers["X-Anarchon-Instance"])
        other = next(p for p in procs if p is not victim)
        time.sleep(0.3)
        victim.kill()
        killed_at = time.time()
        http_app.delay[path] = 0.0
        token = first.headers["X-Anarchon-Run-Id"]
        # The lock expires (no delete): the run is lost, and the lock is taken
        # again over the server's expiry marker for a later slot.
        wait_for(
            lambda: [r for r in http_app.requests_for(path) if r.at > killed_at],
            15,
            what="a run after the lock expired",
        )
        skipped = other.metric("anarchon_runs_skipped_total", {"job": "solo", "reason": "overlap"})
    lost = [m.data for m in results(nats_server.url, "solo") if m.data["status"] == "lost"]
    assert [m["token"] for m in lost] == [token]
    assert "lease lock.solo expired" in lost[0]["error"]
    # While the dead runner's lock lived, the other sidecar skipped its slots.
    assert skipped and skipped >= 1
    after = [r for r in http_app.requests_for(path) if r.at > killed_at]
    assert all(r.headers["X-Anarchon-Instance"] == other.name for r in after)
    assert min(r.at for r in after) - killed_at < 2.0 + 3.0  # lease_ttl, the next slot, slack
