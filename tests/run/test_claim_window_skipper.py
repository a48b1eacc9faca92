"""A winner whose only loser skipped the slot (sidecar/run/skips.py ``LOCAL``), with
two real sidecars.

s1's own config excludes every slot of the test (its ``exclude``: another
replica mid-rollout, say), s0's runs them: s1 records each slot ``skipped``
under the slot's claim id, and where s0's claim was stored first s1's answer is
a duplicate naming s0's claim. s0 stops itself at its first win, its lease not
yet made, and is then killed, or left frozen. No other loser is there: s1, the
skipper, judges the winner as a losing claimer would, and records the slot
``lost`` once (docs/GUARANTEES.md, lost runs). Before, the slot kept a claim
and no fate, and no counter named it.

Only a skip the sidecar's own config decided is judged: a pause's (or a
``skip``'s) record that came second is not (every sidecar decides those alike
from the state bucket: what beat it is another skip record, and judging it
would cost a read a slot for nothing). Shown with one sidecar's parts built
in-process (the ``make_jobs`` fixture) against the real nats-server.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.run.test_claim_window import (
    ARMED,
    JUDGED_WITHIN,
    MAX_LATE,
    SCHEDULE,
    armed_last,
    calls,
    frozen_slot,
    lost_records,
)
from tests.run.test_job_life import life, results
from tests.support import MakeJobs, NatsServer, RecordingApp, base, job, until, wait_for

# What a woken winner says when it finds its run judged (sidecar/run/lease.py for a
# judge's copy still held, sidecar/run/claimwinner.py for the lost record).
WOKEN = ("judged this run lost before its lease existed", "judged lost while this sidecar")


def fleet(nats_server: NatsServer, app: RecordingApp) -> list[Any]:
    """s0 (armed) runs job w; s1 excludes every slot of the next hours and waits up
    to 1 s of jitter first, so that s0's claim is stored first for nearly every slot."""
    now = datetime.now(UTC)
    hours = f"{(now - timedelta(hours=1)).isoformat()}/{(now + timedelta(hours=2)).isoformat()}"
    runs = base(nats_server, app, [job("w", schedule=SCHEDULE, jitter="0s", max_late=MAX_LATE)])
    skips = base(
        nats_server,
        app,
        [job("w", schedule=SCHEDULE, jitter="1s", max_late=MAX_LATE, exclude=[hours])],
    )
    for config in (runs, skips):
        config["nats"]["lease_ttl"] = "2s"
    return [("s0", runs, ARMED), ("s1", skips, {})]


@pytest.mark.serial
@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_winner_whose_only_loser_skipped_the_slot_is_judged_by_the_skipper(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, how: str
) -> None:
    with armed_last(tmp_path, fleet(nats_server, http_app)) as procs:
        s0, s1 = procs
        assert s0.proc is not None
        slot = frozen_slot(nats_server, s0)
        if how == "killed":
            s0.kill()
        wait_for(
            lambda: lost_records(nats_server, slot), JUDGED_WITHIN, what="the slot recorded lost"
        )
        if how == "frozen":
            # Woken after the judging: it finds the judge's copy (or the lost record)
            # and does not run the slot.
            os.kill(s0.proc.pid, signal.SIGCONT)
            wait_for(lambda: any(said in s0.log() for said in WOKEN), 30, what="s0 told on waking")
        lost = s1.metric("anarchon_runs_lost_total", {"job": "w"})
    records = lost_records(nats_server, slot)
    assert [(m.data.get("attempt", 1), m.data["instance"]) for m in records] == [(1, "s0")]
    assert "never made" in records[0].data["error"]
    assert "judged by s1" in records[0].data["error"]
    assert calls(http_app, slot) == []
    assert lost == 1
    # s1 never ran a slot: its exclusion held (it skipped them all).
    assert [
        r for r in http_app.requests_for("/jobs/w") if r.headers["X-Anarchon-Instance"] == "s1"
    ] == []


async def test_a_skip_record_that_came_second_is_judged_for_an_exclusion_not_for_a_pause(
    make_jobs: MakeJobs,
    nats_server: NatsServer,
    http_app: RecordingApp,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.run.claimwindow")
    async with life(make_jobs, nats_server, http_app, "a", schedule="0 0 1 1 *") as one:
        jobs, work = one.jobs, one.job
        # Instance b, which is never in the fleet (a dead winner), claimed two slots
        # to run them before a's skip records of them.
        b = dataclasses.replace(jobs.claimer, instance="b")
        now = int(time.time()) * 1000
        excluded, paused = now - 1000, now - 2000
        for slot in (excluded, paused):
            assert (await b.claim(work.name, slot, jobs.clock.monotonic() + 5)).won
        recorder = jobs.unclaimed.recorder
        assert not await recorder.record_skip(work, excluded, "excluded", "excluded: a day off")
        assert not await recorder.record_skip(work, paused, "paused", "paused by ops")
        # b's presence never comes: a judged winner is found dead and recorded lost;
        # then every judge of the sidecar has ended (a pause's too, had it one).
        await until(
            lambda: one.metric("anarchon_runs_lost_total") >= 1 and not jobs.window.tasks,
            60,
            "the judging",
        )
        lost = one.metric("anarchon_runs_lost_total")
        said = [
            r.getMessage() for r in caplog.records if "no lease of its winner" in r.getMessage()
        ]
        records = [
            r
            for r in await results(jobs.js)
            if r["status"] == "lost" and r["slot"] in (excluded, paused)
        ]
    assert [(r["slot"], r["instance"]) for r in records] == [(excluded, "b")]
    assert len(said) == 1 and f"slot {excluded}:" in said[0], said
    assert lost == 1
