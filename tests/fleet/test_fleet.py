"""Fleet state on NATS KV, with real sidecar processes and a real nats-server.

Pause seen by every sidecar and by sidecars started later, status with a
config mismatch and a killed instance, a NATS restart while paused, and
catch-up after every sidecar was down.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nats
import pytest

from sidecar.core.clock import parse_rfc3339
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    base,
    cli_config,
    job,
    read_stream,
    run_cli,
    sidecars,
    slots,
    wait_for,
)


def paused_everywhere(procs: list[Sidecar], job_name: str, value: float) -> bool:
    return all(p.metric("anarchon_job_paused", {"job": job_name}) == value for p in procs)


def test_pause_is_honoured_everywhere_survives_restarts_and_resume_brings_runs_back(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a"), job("b")])
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: len(slots(http_app, "/jobs/a")) >= 2, 20, what="runs of a")
        paused = run_cli("pause", "a", "-c", cfg, "--reason", "db migration")
        assert paused.returncode == 0, paused.stderr
        assert "a: paused by " in paused.stdout and "(db migration)" in paused.stdout
        assert "a slot whose claim was already published still runs" in paused.stdout
        stored = time.time()
        wait_for(lambda: paused_everywhere(procs, "a", 1), 5, what="job_paused on all three")
        seen_after = time.time() - stored
        # The watch carries the pause in milliseconds; allow for a loaded machine.
        assert seen_after < 3, seen_after
        b_before = len(slots(http_app, "/jobs/b"))
        time.sleep(4)
        late = [s for s in slots(http_app, "/jobs/a") if s / 1000 > stored + 1]
        assert late == [], "a ran while paused"
        assert len(slots(http_app, "/jobs/b")) >= b_before + 3, "b must not be paused"
        skipped = sum(
            p.metric("anarchon_claims_skipped_total", {"job": "a", "reason": "paused"}) or 0
            for p in procs
        )
        assert skipped >= 3
        # Never paused: no series (issue 49), or 0.
        assert all(not p.metric("anarchon_job_paused", {"job": "b"}) for p in procs)
        # A sidecar started while the job is paused stays paused.
        assert procs[0].terminate() == 0
        procs[0].start()
        procs[0].wait_ready()
        assert procs[0].metric("anarchon_job_paused", {"job": "a"}) == 1
        time.sleep(2)
        assert [s for s in slots(http_app, "/jobs/a") if s / 1000 > stored + 1] == []
        status = json.loads(run_cli("status", "-c", cfg, "--json").stdout)
        a = next(j for j in status["jobs"] if j["name"] == "a")
        assert a["paused"] and a["paused_reason"] == "db migration"
        resumed = run_cli("resume", "a", "-c", cfg)
        assert resumed.returncode == 0, resumed.stderr
        resumed_at = time.time()
        wait_for(lambda: paused_everywhere(procs, "a", 0), 5, what="resumed everywhere")
        wait_for(
            lambda: [s for s in slots(http_app, "/jobs/a") if s / 1000 > resumed_at],
            10,
            what="a runs again",
        )
        again = run_cli("resume", "a", "-c", cfg)
        assert again.returncode == 1
        assert "a was not paused" in again.stderr
    unknown = run_cli("pause", "nosuch", "-c", cfg)
    assert unknown.returncode == 2 and "no job named 'nosuch'" in unknown.stderr
    assert max(Counter(slots(http_app, "/jobs/a")).values()) == 1


def test_status_lists_instances_flags_a_mismatch_and_drops_a_killed_one(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a"), job("b")])
    odd = base(nats_server, http_app, [job("a", schedule="*/2 * * * * *"), job("b")])
    cfg = cli_config(tmp_path, config)
    procs_spec = [("s0", config, {}), ("s1", config, {}), ("odd", odd, {})]
    with sidecars(tmp_path, procs_spec) as procs:

        def status() -> dict[str, Any]:
            done = run_cli("status", "-c", cfg, "--json")
            assert done.returncode == 0, done.stderr
            return dict(json.loads(done.stdout))

        view = wait_for(
            lambda: (s := status()) and len(s["instances"]) == 3 and s["jobs"][0]["last_run"] and s,
            20,
            what="three instances and a last run",
        )
        assert {i["id"] for i in view["instances"]} == {"s0", "s1", "odd"}
        assert view["config_mismatch"] is True
        assert view["mismatched_jobs"] == ["a"]
        hashes = {i["id"]: i["config_hash"] for i in view["instances"]}
        assert hashes["s0"] == hashes["s1"] != hashes["odd"]
        a, b = view["jobs"]
        assert a["settings_differ"] and not b["settings_differ"]
        assert a["last_run"]["status"] in ("succeeded", "running")
        assert set(a) >= {"name", "paused", "paused_by", "paused_reason", "running", "next_slot"}
        wait_for(lambda: procs[0].metric("anarchon_fleet_config_mismatch") == 1, 10)
        assert procs[0].metric("anarchon_fleet_instances") == 3
        assert "different settings: a" in procs[0].log()
        table = run_cli("status", "-c", cfg)
        assert "instances: 3 live" in table.stdout
        assert "WARNING: live instances run these jobs with different settings: a" in table.stdout
        procs[2].kill()  # kill -9: no clean exit deletes its key
        killed = time.time()
        wait_for(lambda: len(status()["instances"]) == 2, 25, what="the killed one gone")
        assert time.time() - killed < 15 + 5  # its TTL, plus the expiry's lag
        wait_for(lambda: procs[0].metric("anarchon_fleet_config_mismatch") == 0, 10)
        assert status()["config_mismatch"] is False
        # A clean exit deletes the key at once.
        assert procs[1].terminate() == 0
        wait_for(lambda: [i["id"] for i in status()["instances"]] == ["s0"], 5)


def test_a_nats_restart_while_paused_keeps_the_job_paused(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a")])
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [("s0", config, {})]) as procs:
        assert run_cli("pause", "a", "-c", cfg).returncode == 0
        wait_for(lambda: paused_everywhere(procs, "a", 1), 5)
        nats_server.stop()
        wait_for(lambda: procs[0].metric("anarchon_nats_connected") == 0, 10)
        nats_server.start()
        procs[0].wait_ready(30)
        back = time.time()
        time.sleep(3)
        assert procs[0].metric("anarchon_job_paused", {"job": "a"}) == 1
        assert [s for s in slots(http_app, "/jobs/a") if s / 1000 > back - 1] == []
        assert run_cli("resume", "a", "-c", cfg).returncode == 0
        wait_for(lambda: len(slots(http_app, "/jobs/a")) >= 1, 10, what="runs after resume")


class ClaimSpy:
    """Every claim published on a subject, duplicates included (core NATS sees them all)."""

    def __init__(self, url: str, subject: str) -> None:
        self.claims: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, subject), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self, url: str, subject: str) -> None:
        async def main() -> None:
            nc = await nats.connect(url)

            async def on_msg(msg: Any) -> None:
                self.claims.append(json.loads(msg.data))

            await nc.subscribe(subject, cb=on_msg)
            await nc.flush()
            self._ready.set()
            await asyncio.to_thread(self._stop.wait)
            await nc.close()

        asyncio.run(main())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.parametrize("mode", ["none", "latest", "all"])
def test_catch_up_after_every_sidecar_was_down(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, mode: str
) -> None:
    config = base(
        nats_server, http_app, [job("sync", catchup=mode, max_late="10s", jitter="100ms")]
    )
    first = Sidecar(tmp_path, "s0", config, {}).start()
    try:
        first.wait_ready()
        wait_for(lambda: len(slots(http_app, "/jobs/sync")) >= 3, 20, what="runs")
    finally:
        assert first.terminate() == 0
    before = set(slots(http_app, "/jobs/sync"))
    time.sleep(4)  # four or more slots nobody claims
    second = Sidecar(tmp_path, "s1", config, {}).start()
    try:
        second.wait_ready()
        wait_for(lambda: len(set(slots(http_app, "/jobs/sync")) - before) >= 3, 20, what="runs")
    finally:
        assert second.terminate() == 0
    ran = slots(http_app, "/jobs/sync")
    assert max(Counter(ran).values()) == 1, f"a slot ran twice: {Counter(ran)}"
    after = sorted(set(ran) - before)
    hole = [s for s in range(max(before) + 1000, after[0], 1000)]
    contiguous = after == list(range(after[0], after[-1] + 1000, 1000))
    assert contiguous, after
    caught = [ln for ln in second.log().splitlines() if "catching up" in ln]
    if mode == "all":
        assert hole == [], f"missed slots not caught up: {hole}"
        assert len(caught) == 1 and "catching up" in caught[0]
    elif mode == "latest":
        assert len(hole) >= 2, (before, after)
        # "1 missed slot(s)", or "1 slot(s), missed or not" when its own first claim
        # came before the catch-up's read (sidecar/run/catchup.py).
        assert len(caught) == 1 and "catching up 1 " in caught[0], caught
    else:
        assert len(hole) >= 3, (before, after)
        assert caught == []


def test_a_restart_that_missed_nothing_makes_no_catch_up_claim(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("sync", catchup="all", max_late="10s")])
    spy = ClaimSpy(nats_server.url, "cron.sync.claims")
    try:
        with sidecars(tmp_path, [("keeper", config, {}), ("again", config, {})]) as procs:
            wait_for(lambda: len(slots(http_app, "/jobs/sync")) >= 2, 20, what="runs")
            assert procs[1].terminate() == 0
            restarted = time.time()
            procs[1].start()
            procs[1].wait_ready()
            time.sleep(2)
        # The keeper claimed every slot meanwhile: the restarted one's catch-up
        # read its last claim and claimed nothing before its own first slot.
        early = [
            c
            for c in spy.claims
            if c["instance"] == "again"
            and parse_rfc3339(c["claimed_at"]) >= restarted
            and c["slot"] / 1000 < restarted - 1  # long claimed by the keeper
        ]
        assert early == [], early
    finally:
        spy.stop()
    assert max(Counter(slots(http_app, "/jobs/sync")).values()) == 1


def test_fences_grow_with_the_slots_across_instances(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a")])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]):
        wait_for(lambda: len(http_app.requests_for("/jobs/a")) >= 8, 30, what="eight runs")
    runs = sorted(
        (int(r.headers["X-Anarchon-Slot"]), int(r.headers["X-Anarchon-Fence"]), r.headers)
        for r in http_app.requests_for("/jobs/a")
    )
    fences = [fence for _slot, fence, _h in runs]
    assert fences == sorted(fences) and len(set(fences)) == len(fences), runs
    assert len({h["X-Anarchon-Instance"] for _s, _f, h in runs}) >= 2  # several winners
    assert all(h["X-Anarchon-Attempt"] == "1" for _s, _f, h in runs)
    # The fence is the won claim's stream sequence.
    stored = {m.data["slot"]: m.seq for m in read_stream(nats_server.url) if "claims" in m.subject}
    assert all(stored[slot] == fence for slot, fence, _h in runs)
