"""NATS killed mid-run and started again on the same store.

Sidecars reconnect and resume; no slot runs twice; slots lost to the outage
are counted (skipped or claim error) and no run starts later than max_late.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from tests.reliability.conftest import Figures
from tests.reliability.helpers import (
    config,
    every_second,
    lateness,
    metric_sum,
    metric_total,
    next_second_ms,
    slot_of,
    tally,
    unclaimed_runs,
    wait_all_ran,
)
from tests.support import NatsServer, RecordingApp, Sidecar, read_stream, sidecars, wait_for

JOBS = ["a", "b", "c", "d"]
MAX_LATE = 2.0
# Scheduling noise allowed on top of max_late (claim won at the deadline, then sent).
MARGIN = 0.5


def lost_counted(proc: Sidecar, job: str) -> float:
    """Slots of `job` this sidecar counted as not run: skipped (any reason) or claim errors."""
    return metric_total(proc, "anarchon_claims_skipped_total", {"job": job}) + metric_total(
        proc, "anarchon_claim_errors_total", {"job": job}
    )


def test_nats_restart_mid_run(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    cfg = config(
        [nats_server.url],
        http_app,
        [every_second(name, max_late=f"{MAX_LATE:g}s") for name in JOBS],
        ack_timeout="500ms",
    )
    with sidecars(tmp_path, [(f"s{i}", cfg, {}) for i in range(3)]) as running:
        before_start = next_second_ms() + 1000
        before_end = before_start + 2000
        assert wait_all_ran(http_app, JOBS, before_start, before_end, timeout=15)

        down_at = time.time()
        nats_server.kill()
        # Down until every sidecar has counted two slots of every job as not run:
        # the later of the two came due after the kill, so nobody can have run it.
        wait_for(
            lambda: all(lost_counted(p, job) >= 2 for p in running for job in JOBS),
            30,
            what="every sidecar to count two lost slots of every job",
        )
        up_at = time.time()
        nats_server.start()
        for p in running:
            p.wait_ready(30)
        ready_at = time.time()
        first_after = wait_for(
            lambda: [r.at for r in http_app.requests if slot_of(r) / 1000 >= up_at],
            15,
            what="a run of a slot after the restart",
        )
        resumed_after = min(first_after) - up_at

        after_start = next_second_ms(ready_at) + 1000
        after_end = after_start + 3000
        wait_all_ran(http_app, JOBS, after_start, after_end, timeout=15)
        skipped = {
            reason: metric_sum(running, "anarchon_claims_skipped_total", {"reason": reason})
            for reason in ("disconnected", "late")
        }
        errors = metric_sum(running, "anarchon_claim_errors_total")
        per_job_counted = {
            job: metric_sum(running, "anarchon_claims_skipped_total", {"job": job})
            + metric_sum(running, "anarchon_claim_errors_total", {"job": job})
            for job in JOBS
        }
        reconnects = metric_sum(running, "anarchon_nats_reconnects_total")
        codes = [p.terminate() for p in running]

    before = tally(http_app, JOBS, before_start, before_end)
    after = tally(http_app, JOBS, after_start, after_end)
    outage_start = before_end + 1000
    outage = tally(http_app, JOBS, outage_start, after_start - 1000)
    late = lateness(http_app, JOBS)
    every = tally(http_app, JOBS, before_start, after_end)
    unclaimed = unclaimed_runs(read_stream(nats_server.url), http_app.requests)
    lost_by_job = {job: sum(1 for j, _ in outage.missing if j == job) for job in JOBS}
    figures.report(
        "nats-restart",
        outage_s=round(up_at - down_at, 1),
        slots=every.slots,
        runs=every.runs,
        doubles=len(every.doubles),
        lost=outage.misses,
        skipped=skipped,
        claim_errors=int(errors),
        reconnects=int(reconnects),
        resumed_after_s=round(resumed_after, 2),
        max_start_delay_s=round(max(late), 3),
    )
    assert codes == [0, 0, 0]
    assert not every.doubles, f"slots ran twice: {every.doubles}"
    # Before the fault and after recovery nothing is missed.
    assert not before.missing and not after.missing, (before.missing, after.missing)
    # The outage cost slots, and each one lost is counted by some sidecar.
    assert outage.misses >= len(JOBS)
    for job, lost in lost_by_job.items():
        assert per_job_counted[job] >= lost, (job, lost, per_job_counted[job])
    # Never run late: a slot starts within max_late of its time or not at all.
    assert max(late) <= MAX_LATE + MARGIN, sorted(late)[-5:]
    assert reconnects >= 3
    assert not unclaimed, unclaimed[:20]
    assert math.isfinite(resumed_after) and resumed_after < 10
