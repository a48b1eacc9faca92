"""/metrics at many jobs: bytes, series, series per job, one scrape (issue 49).

``python -m bench.metrics_size [--jobs 1000,10000]``. One real sidecar on a
real nats-server with N jobs that all wait for a yearly slot (none due), as
a tenant fleet's jobs mostly do; per point its time to ready, RSS, and then
five scrapes of ``/metrics`` each after the sidecar's rendering cache has
expired (``bench.scrapes.idle``, timed from the request to the last byte):
the body's bytes, its series (sample lines), the series with a ``job`` label
per job, and the scrapes' median and max. (Scrapes while 100,000 jobs of
the state bucket are taken up: bench/jobs_scale.py.) Writes
``bench/results/metrics_size.json``.

Run from another checkout (``PYTHONPATH`` at its root) it measures that
code: how docs/METRICS.md compares 0.1.0 with now.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import nats_server, workdir, write_result
from bench.scrapes import idle, summary
from tests.support import Sidecar


def config(url: str, jobs: int) -> dict[str, Any]:
    return {
        "nats": {"servers": [url]},
        "target": {"url": "http://127.0.0.1:9"},  # never asked: nothing is due
        "jobs": [
            # One day of the year, a minute each: none due in the run.
            {"name": f"tenant-{i:06d}", "schedule": f"{i % 60} {i % 24} 1 1 *"}
            for i in range(jobs)
        ],
    }


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def point(jobs: int) -> dict[str, Any]:
    with workdir("metrics") as work, nats_server(work) as server:
        proc = Sidecar(work, "a", config(server.url, jobs), {})
        started = time.monotonic()
        proc.start()
        try:
            proc.wait_ready(timeout=300)
            ready = time.monotonic() - started
            times, body = idle(proc.base_url + "/metrics")
            assert proc.proc is not None
            lines = [ln for ln in body.decode().splitlines() if ln and not ln.startswith("#")]
            per_job = [ln for ln in lines if 'job="' in ln]
            return {
                "jobs": jobs,
                "ready_s": round(ready, 2),
                "rss_mib": round(rss_kib(proc.proc.pid) / 1024, 1),
                "metrics_bytes": len(body),
                "series": len(lines),
                "series_per_job": round(len(per_job) / jobs, 3),
                "scrape_s": round(max(times), 4),
                "scrape_median_s": summary(times)["median_s"],
            }
        finally:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="1000,10000", help="comma-separated job counts")
    args = parser.parse_args()
    points = [point(int(n)) for n in args.jobs.split(",")]
    for p in points:
        print(
            f"{p['jobs']:>7} jobs: /metrics {p['metrics_bytes']:>10,} B, "
            f"{p['series']:>8,} series ({p['series_per_job']} per job), "
            f"scrape median {p['scrape_median_s'] * 1000:.1f} ms, "
            f"max {p['scrape_s'] * 1000:.1f} ms, ready {p['ready_s']} s, "
            f"RSS {p['rss_mib']} MiB"
        )
    print(write_result("metrics_size", {"points": points}))


if __name__ == "__main__":
    main()
