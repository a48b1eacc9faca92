"""One failing job among 100,000 (issue 49): the shipped alert fires by name.

``python -m bench.alert_among [JOBS]`` (``make bench.jobs``; default 100,000).
Real processes: a nats-server, a sidecar of the runtime-only venv
(``bench.runtime``), a recording app answering 500 to one job, and a real
Prometheus with the shipped scrape settings and rule file
(deploy/prometheus/). JOBS jobs of the state bucket (per-tenant schedules,
none due: bench/jobs_scale.py) are written before the sidecar starts; the
config file has one more job, ``broken``, due every second, which the app
fails, with ``pause_after: 8``.

Measured: the time from exec to every job taken up, then to
``AnarchonJobAutoPaused{job="broken"}`` firing in Prometheus; that no alert
names another job; the series Prometheus holds for the tenants' jobs (none:
they have said nothing, but the next run of those due within the hour) and
in the whole scrape; one scrape's time as
Prometheus records it (``scrape_duration_seconds``) and /metrics' size.

Writes ``bench/results/alert_among.json``.
"""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.request
from typing import Any

from bench import runtime
from bench.common import machine, nats_server, workdir, write_result
from bench.jobs_scale import config, fill, taken_up
from sidecar.config.load import parse_config
from sidecar.store.state import state_spec
from tests.obs.test_observability import SCRAPE_JOB, prometheus_scraping
from tests.support import RecordingApp

JOBS = 100_000
NEXT_RUN = "anarchon_job_next_run_timestamp_seconds"
BROKEN = {
    "name": "broken",
    "schedule": "* * * * * *",
    "jitter": "0s",
    "max_late": "5s",
    "pause_after": 8,
}


def until(what: str, condition: Any, timeout: float, poll: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(poll)


def run(jobs: int) -> dict[str, Any]:
    runtime.ensure()
    app = RecordingApp()
    app.status["/jobs/broken"] = 500
    app.start()
    try:
        with workdir("alert-among") as work, nats_server(work) as server:
            cfg = config(server, jobs)
            cfg["target"] = {"url": app.url}
            cfg["jobs"] = [*cfg["jobs"], BROKEN]
            asyncio.run(fill(server, cfg, jobs))
            bucket = state_spec(parse_config(cfg, {})).bucket
            proc = runtime.RuntimeSidecar(work, "alert", cfg, {})
            t0 = time.perf_counter()
            proc.start()
            try:
                until("ready", proc.ready, 300, 0.05)
                ready = time.perf_counter() - t0
                target = [proc.base_url.removeprefix("http://")]
                with prometheus_scraping(work / "prometheus", target) as prom:
                    until(
                        "every job taken up",
                        lambda: asyncio.run(taken_up(server, bucket, "scale-1")) >= jobs,
                        600,
                    )
                    up = time.perf_counter() - t0

                    def firing() -> list[dict[str, Any]]:
                        return [
                            a
                            for a in prom.api("/api/v1/alerts")["alerts"]
                            if a["labels"]["alertname"] == "AnarchonJobAutoPaused"
                            and a["state"] == "firing"
                        ]

                    fired = until("AnarchonJobAutoPaused firing", firing, 180)
                    fire = time.perf_counter() - t0
                    named = sorted(
                        {
                            a["labels"].get("job", "")
                            for a in prom.api("/api/v1/alerts")["alerts"]
                            if a["labels"].get("job")
                        }
                    )
                    # A job's next run is written once its next slot is less than an
                    # hour away (docs/METRICS.md); nothing else of a job that said nothing.
                    tenants = prom.query(
                        'count by (__name__) ({__name__=~"anarchon_.+", job=~"tenant-.+"})'
                    )
                    soon = [t for t in tenants if t["metric"]["__name__"] == NEXT_RUN]
                    tenants = [t for t in tenants if t not in soon]
                    series = prom.query(f'scrape_samples_scraped{{job="{SCRAPE_JOB}"}}')
                    duration = prom.query(f'scrape_duration_seconds{{job="{SCRAPE_JOB}"}}')
                    with urllib.request.urlopen(proc.base_url + "/metrics", timeout=60) as resp:
                        size = len(resp.read())
            finally:
                proc.terminate(60)
    finally:
        app.stop()

    def value(result: list[dict[str, Any]]) -> float | None:
        return float(result[0]["value"][1]) if result else None

    assert [a["labels"]["job"] for a in fired] == ["broken"], fired
    assert named == ["broken"], named
    assert tenants == [], tenants
    return {
        "jobs": jobs,
        "ready_s": ready,
        "taken_up_s": up,
        "fired_s_after_exec": fire,
        "fired_s_after_taken_up": fire - up,
        "alerts_naming_a_job": named,
        "tenant_series_in_prometheus": 0,
        "tenant_next_run_series": float(soon[0]["value"][1]) if soon else 0,
        "samples_per_scrape": value(series),
        "scrape_duration_s": value(duration),
        "metrics_body_bytes": size,
    }


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else JOBS
    result = run(jobs)
    result["machine"] = machine()
    write_result("alert_among", result)
    print(
        f"{jobs} jobs + 1 failing: ready {result['ready_s']:.1f} s, taken up "
        f"{result['taken_up_s']:.1f} s, AnarchonJobAutoPaused{{job=broken}} firing "
        f"{result['fired_s_after_taken_up']:.1f} s after; "
        f"alerts name {result['alerts_naming_a_job']}; "
        f"{result['samples_per_scrape']:.0f} samples a scrape "
        f"({result['tenant_next_run_series']:.0f} tenants' next runs within the hour), "
        f"{1000 * (result['scrape_duration_s'] or 0):.0f} ms, "
        f"{(result['metrics_body_bytes'] or 0) / 1000:.0f} kB",
        flush=True,
    )


if __name__ == "__main__":
    main()
