"""The claim-to-lease window of one-off (``at``) runs and backfills, with three real sidecars.

A one-off run's winner killed at ``claim.won`` (won, its lease not yet made)
is recorded ``lost`` once by the losers and never rerun (a one-off is not).
A backfill's taker killed there is recorded ``lost`` once by the sidecar that
finds its ``running`` slot stale, and the backfill goes on. A scheduled
slot's winner killed there while a backfill of the same slot holds its run
key is still judged (the judge tells the two leases apart by their token).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.run.test_claim_window import ARMED, JUDGED_WITHIN, stopped
from tests.support import (
    NatsServer,
    RecordingApp,
    StoredMsg,
    base,
    cli_config,
    job,
    read_stream,
    run_cli,
    sidecars,
    wait_for,
)

# A schedule that never fires during a test: only one-offs and backfills run.
YEARLY = "0 0 1 1 *"
RERUN = {"on_lost": "rerun", "retry": {"max": 1, "backoff": "1s"}}


def fleet(nats_server: NatsServer, app: RecordingApp, **extra: Any) -> list[Any]:
    config = base(nats_server, app, [job("w", max_late="5s", **{"schedule": YEARLY, **extra})])
    config["nats"]["lease_ttl"] = "2s"
    return [("s0", config, ARMED), ("s1", config, {}), ("s2", config, {})]


def cli(tmp_path: Path, nats_server: NatsServer, app: RecordingApp) -> str:
    return cli_config(tmp_path, base(nats_server, app, [job("w", schedule=YEARLY)]))


def results_of(nats_server: NatsServer, slot: int) -> list[StoredMsg]:
    return [
        m
        for m in read_stream(nats_server.url)
        if m.subject == "cron.w.results" and m.data.get("slot") == slot
    ]


def lost_of(nats_server: NatsServer, slot: int) -> list[StoredMsg]:
    return [m for m in results_of(nats_server, slot) if m.data.get("status") == "lost"]


def claims_by(nats_server: NatsServer, instance: str) -> list[dict[str, Any]]:
    return [
        m.data
        for m in read_stream(nats_server.url)
        if m.subject == "cron.w.claims" and m.data.get("instance") == instance
    ]


def calls(app: RecordingApp, slot: int) -> list[tuple[str, str, str]]:
    """(instance, trigger, attempt) of each app call for `slot`."""
    return [
        (
            r.headers["X-Anarchon-Instance"],
            r.headers.get("X-Anarchon-Trigger", ""),
            r.headers.get("X-Anarchon-Attempt", "1"),
        )
        for r in app.requests_for("/jobs/w")
        if int(r.headers["X-Anarchon-Slot"]) == slot
    ]


def test_a_one_off_runs_winner_killed_before_its_lease_is_lost_once_and_not_rerun(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    cfg = cli(tmp_path, nats_server, http_app)
    with sidecars(tmp_path, fleet(nats_server, http_app, **RERUN)) as procs:
        s0 = procs[0]
        assert s0.proc is not None
        pid = s0.proc.pid
        # One one-off at a time until s0 wins one (about a third of them).
        for _ in range(12):
            done = run_cli("at", "w", "-c", cfg, "2s", "--json")
            assert done.returncode == 0, done.stderr
            slot = int(json.loads(done.stdout)["queued"]["slot"])
            wait_for(
                lambda s=slot: stopped(pid) or calls(http_app, s), 15, what="the one-off decided"
            )
            if stopped(pid):
                break
        assert stopped(pid), "s0 never won a one-off"
        assert [c["slot"] for c in claims_by(nats_server, "s0")] == [slot]
        s0.kill()
        wait_for(lambda: lost_of(nats_server, slot), JUDGED_WITHIN, what="the one-off lost")
        # A second judge's record, or a rerun, would have come by now.
        later = time.time() + 10
        wait_for(lambda: time.time() > later, 15, what="a second record's time")
        lost = sum(p.metric("anarchon_runs_lost_total", {"job": "w"}) or 0 for p in procs[1:])
    records = lost_of(nats_server, slot)
    assert [(m.data.get("attempt", 1), m.data["instance"]) for m in records] == [(1, "s0")]
    assert "never made" in records[0].data["error"]
    assert calls(http_app, slot) == []
    assert lost == 1
