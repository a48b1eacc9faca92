"""The admin port flooded while a job runs every second: the job stays on time.

A sidecar with 1,000 jobs (a 4 MB ``/metrics`` that takes a few hundred ms to
render) and one job every second at jitter 0. Another process holds idle
connections, asks for ``/metrics`` without reading the answer, and scrapes it
in tight loops, all at once, beyond the server's connection limit. The start
delay (slot time to the request's arrival at the app) during the flood stays
small, the connections do not pile up, and memory does not grow with them.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.reliability.conftest import Figures
from tests.reliability.helpers import config, every_second, slot_of
from tests.support import ROOT, NatsServer, RecordingApp, sidecars

N_JOBS = 1000
FLOOD_S = 15.0
IDLE, SLOW, FAST = 40, 20, 4


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _delays(app: RecordingApp, since: float, until: float) -> list[float]:
    return sorted(
        r.at - slot_of(r) / 1000
        for r in app.requests_for("/jobs/tick")
        if since <= slot_of(r) / 1000 <= until
    )


def test_flooded_admin_port_does_not_delay_the_jobs(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    # Daily, half a day from now (UTC): none comes due while the admin port is flooded.
    hour = (time.gmtime().tm_hour + 12) % 24
    jobs: list[dict[str, Any]] = [
        {"name": f"daily-{i:04d}", "schedule": f"0 {hour} * * *", "timezone": "UTC"}
        for i in range(N_JOBS - 1)
    ]
    jobs.append(every_second("tick", jitter="0s"))
    cfg = config([nats_server.url], http_app, jobs)
    with sidecars(tmp_path, [("s1", cfg, {})]) as (proc,):
        assert proc.proc is not None
        pid = proc.proc.pid
        status, body = proc.get("/metrics")
        # Issue 49: idle jobs have no series, so the body is small now; the flood's
        # many connections and slow readers are what the admin port is held to.
        assert status == 200 and "anarchon_build_info" in body
        quiet_from = time.time()
        time.sleep(5)
        rss_before = _status_kib(pid, "VmRSS")
        flood_from = time.time()
        flood = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.reliability.admin_flood",
                str(proc.metrics_port),
                str(FLOOD_S),
                str(IDLE),
                str(SLOW),
                str(FAST),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=FLOOD_S + 60,
        )
        flood_to = time.time()
        assert flood.returncode == 0, flood.stderr[-2000:]
        counts = json.loads(flood.stdout.strip().splitlines()[-1])
        peak_kib = _status_kib(pid, "VmHWM")
        time.sleep(1.5)  # the last slot of the flood reaches the app
        assert proc.get("/healthz") == (200, "ok\n")  # serving again at once
        log = proc.log()
        code = proc.terminate()
    quiet = _delays(http_app, quiet_from + 1, flood_from - 1)
    flooded = _delays(http_app, flood_from + 1, flood_to - 1)
    slots = int(flood_to - 1 - (flood_from + 1))
    figures.report(
        "admin-flood",
        jobs=N_JOBS,
        flood_s=FLOOD_S,
        idle=IDLE,
        slow=SLOW,
        fast=FAST,
        scrapes=counts["scrapes"],
        closed_by_server=counts["closed_by_server"],
        quiet_p50_ms=round(statistics.median(quiet) * 1000, 1),
        flood_p50_ms=round(statistics.median(flooded) * 1000, 1),
        flood_max_ms=round(max(flooded) * 1000, 1),
        flood_runs=len(flooded),
        rss_before_mib=round(rss_before / 1024, 1),
        peak_rss_mib=round(peak_kib / 1024, 1),
    )
    assert code == 0
    # Every slot of the flood ran, and on time.
    assert len(flooded) >= slots - 1, (len(flooded), slots)
    assert statistics.median(flooded) < 0.05, flooded
    assert max(flooded) < 0.25, flooded
    # The flood did happen, and beyond the limit; the scrapers were not locked out
    # by the idle connections (each scrape displaces the oldest of them).
    assert counts["scrapes"] >= FLOOD_S and counts["closed_by_server"] >= IDLE, counts
    assert log.count("connections open, the limit") <= 1 + int(FLOOD_S // 60)
    # Slow readers hold a piece of the body each, not a copy of it.
    assert peak_kib - rss_before < 64 * 1024, (rss_before, peak_kib)
