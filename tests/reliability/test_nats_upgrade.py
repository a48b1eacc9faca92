"""A rolling upgrade of a 3-node R3 NATS cluster from the oldest supported server to the newest.

The cluster starts on the oldest supported nats-server (tests/store/test_nats_versions.py's
OLDEST) with the stream and the state bucket at replicas 3; three sidecars
claim five per-second jobs. One node at a time is stopped (SIGTERM, as a
package upgrade or a pod replacement does), started again on the newest
server with its store, and the cluster is left to become healthy before the
next. No slot may run twice; a slot may be missed only while a node is
down or the cluster is re-electing (from the stop to healthy again, plus the
jobs' max_late), and every missed one is counted by a sidecar.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.reliability.conftest import Figures
from tests.reliability.helpers import (
    config,
    every_second,
    metric_sum,
    next_second_ms,
    tally,
    unclaimed_runs,
    wait_all_ran,
)
from tests.store.test_nats_versions import NEWEST, OLDEST, nats_server_of
from tests.support import NatsCluster, RecordingApp, read_stream, sidecars

JOBS = ["a", "b", "c", "d", "e"]
MAX_LATE = 5.0


def test_rolling_upgrade_of_an_r3_cluster_runs_no_slot_twice(
    tmp_path: Path, http_app: RecordingApp, figures: Figures
) -> None:
    old, new = nats_server_of(OLDEST), nats_server_of(NEWEST)
    cluster = NatsCluster(tmp_path / "cluster", binary=old)
    cluster.start()
    windows: list[tuple[float, float]] = []  # (stopped, healthy again) per node
    try:
        cfg = config(
            cluster.urls,
            http_app,
            [every_second(name, max_late=f"{MAX_LATE:g}s") for name in JOBS],
            replicas=3,
            lease_ttl="3s",
        )
        with sidecars(tmp_path, [(f"s{i}", cfg, {}) for i in range(3)]) as running:
            first = next_second_ms() + 1000
            assert wait_all_ran(http_app, JOBS, first, first + 2000, timeout=20)
            for node in cluster.nodes:
                stopped = time.time()
                node.stop()
                node.binary = new
                node.start(30)
                cluster.wait_healthy(60)
                windows.append((stopped, time.time()))
                quiet = next_second_ms() + 1000
                assert wait_all_ran(http_app, JOBS, quiet, quiet + 2000, timeout=20), node.name
            versions = {n.name: cluster.monitor(n, "/varz").get("version") for n in cluster.nodes}
            last = next_second_ms() + 1000
            assert wait_all_ran(http_app, JOBS, last, last + 1000, timeout=20)
            counted = metric_sum(running, "anarchon_claims_skipped_total") + metric_sum(
                running, "anarchon_claim_errors_total"
            )
            codes = [p.terminate() for p in running]
        stored = read_stream(cluster.urls[0])
    finally:
        cluster.stop()
    every = tally(http_app, JOBS, first, last + 1000)
    outside = [
        (job, slot)
        for job, slot in every.missing
        if not any(a - 1 <= slot / 1000 <= b + MAX_LATE for a, b in windows)
    ]
    figures.report(
        "nats-rolling-upgrade",
        nats_from=OLDEST,
        nats_to=NEWEST,
        replicas=3,
        slots=every.slots,
        runs=every.runs,
        doubles=len(every.doubles),
        missed=every.misses,
        missed_outside_restarts=len(outside),
        skipped_or_errors_counted=int(counted),
        node_restart_s=max(round(b - a, 1) for a, b in windows),
    )
    assert versions == {n.name: NEWEST for n in cluster.nodes}, versions
    assert codes == [0, 0, 0]
    assert not every.doubles, f"slots ran twice: {every.doubles}"
    assert not outside, outside
    assert counted >= every.misses
    assert not unclaimed_runs(stored, http_app.requests)
