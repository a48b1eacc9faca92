"""Jobs scale (issue 49): one sidecar with 1,000, 10,000 and 100,000 jobs of the state
bucket (the way a platform team holds per-tenant schedules), none due.

``python -m bench.jobs_scale [1000,10000,100000]`` (part of ``make bench.scale``'s
family, not of ``make test``). Real processes: a nats-server, and a sidecar of
the runtime-only venv (``bench.runtime``). The jobs are written into the state
bucket before the sidecar starts (``job.<name>`` keys, each with its own
schedule and zone, none due for hours), then per size:

- **time to ready** (exec to the first 200 of ``/readyz``) and **time to take up**
  (exec to the sidecar's presence saying it runs every job of the bucket);
- **RSS** once taken up and settled (3 s), against the floor (a Python that only
  imports the mission's dependencies: ``bench.footprint.floor``), and the
  marginal RSS per job between sizes;
- **idle CPU** over IDLE_SECONDS (schedstat nanoseconds, a share of one core)
  and wake-ups per second, with no job due;
- **/metrics**: its size, and scrapes timed from the request to the last byte
  as Prometheus times them (``bench.scrapes``): one every 1.2 s from ready
  until every job is taken up (the loop is busy judging the keys then), and
  five once idle; the median and the max of each.

Writes ``bench/results/jobs_scale.json`` and prints a table. With
``JOBS_PROFILE=FILE`` the sidecar of each size runs under cProfile, is stopped
as soon as it is ready and writes its profile to FILE.<jobs> (where the time to
ready goes); nothing else is measured then.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import nats

from bench import runtime
from bench.common import cpu_precise, machine, nats_server, rss_mib, wakeups, workdir, write_result
from bench.footprint import ZONES, floor
from bench.scrapes import CACHE_AGE, Scraper, idle, summary
from sidecar.config.load import parse_config
from sidecar.store.state import ensure_bucket, state_spec
from tests.support import NatsServer, taken_up

SIZES = (1_000, 10_000, 100_000)
IDLE_SECONDS = 20.0


def schedule(i: int) -> str:
    """Daily, weekly or monthly, spread over the hours: none due in the window."""
    hour = (time.gmtime().tm_hour + 3 + i % 12) % 24  # hours away
    kind = i % 3
    if kind == 0:
        return f"{i % 60} {hour} * * *"
    if kind == 1:
        return f"{i % 60} {hour} * * {i % 7}"
    return f"{i % 60} {hour} {1 + i % 28} * *"


def config(server: NatsServer, jobs: int) -> dict[str, Any]:
    return {
        "instance_id": "scale-1",
        "nats": {"servers": [server.url]},
        "target": {"url": "http://127.0.0.1:9"},  # never called while measured
        "bucket_jobs": {"max_jobs": max(jobs, 1)},
        "jobs": [{"name": "keep", "schedule": "0 0 1 1 *"}],
    }


async def fill(server: NatsServer, cfg: dict[str, Any], jobs: int) -> float:
    """The bucket made as a sidecar makes it, emptied, then `jobs` job keys written,
    none due for hours."""
    return await fill_with(server, cfg, jobs, None)


async def fill_with(
    server: NatsServer, cfg: dict[str, Any], jobs: int, same: dict[str, Any] | None
) -> float:
    """As ``fill``; `same`: settings every job has (bench/burst.py: one instant)."""
    parsed = parse_config(cfg, {})
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        spec = state_spec(parsed)
        with contextlib.suppress(Exception):  # not there yet
            await js.delete_key_value(spec.bucket)
        kv = (await ensure_bucket(js, spec)).kv
        began = time.monotonic()
        items = [
            (
                f"job.tenant-{i:06d}",
                json.dumps(
                    {
                        "name": f"tenant-{i:06d}",
                        "id": f"t/{i}",
                        "schedule": schedule(i),
                        "timezone": ZONES[i % len(ZONES)],
                        "request": {"path": f"/tenants/{i}/sync"},
                        **(same or {}),
                    }
                ).encode(),
            )
            for i in range(jobs)
        ]
        for at in range(0, len(items), 500):
            await asyncio.gather(*(kv.put(k, v) for k, v in items[at : at + 500]))
        return time.monotonic() - began
    finally:
        await nc.close()


def measure(work: Path, server: NatsServer, jobs: int) -> dict[str, Any]:
    cfg = config(server, jobs)
    filled = asyncio.run(fill(server, cfg, jobs))
    proc = runtime.RuntimeSidecar(work, f"js{jobs}", cfg, {})
    profile = os.environ.get("JOBS_PROFILE")
    if profile:
        proc.profile = Path(f"{profile}.{jobs}").resolve()
    t0 = time.perf_counter()
    proc.start()
    try:
        while not proc.ready():
            assert proc.proc and proc.proc.poll() is None, proc.log()[-2000:]
            assert time.perf_counter() - t0 < 300, "not ready within 300 s"
            time.sleep(0.01)
        ready = time.perf_counter() - t0
        if profile:  # the profile of the start only (module doc)
            return {"jobs": jobs, "fill_s": filled, "ready_s": ready}
        bucket = state_spec(parse_config(cfg, {})).bucket
        url = proc.base_url + "/metrics"
        # Scraped as Prometheus would meanwhile, each scrape past the render cache.
        with Scraper(url, every=CACHE_AGE) as during:
            while asyncio.run(taken_up(server, bucket)) < jobs:
                assert proc.proc and proc.proc.poll() is None, proc.log()[-2000:]
                assert time.perf_counter() - t0 < 600, "not taken up within 600 s"
                time.sleep(0.2)
            up = time.perf_counter() - t0
        time.sleep(3)
        assert proc.proc is not None
        pid = proc.proc.pid
        rss = rss_mib(pid)
        cpu0, wake0, at0 = cpu_precise(pid), wakeups(pid), time.monotonic()
        time.sleep(IDLE_SECONDS)
        cpu1, wake1, at1 = cpu_precise(pid), wakeups(pid), time.monotonic()
        idle_times, body = idle(url)
    finally:
        proc.terminate(60)
    return {
        "jobs": jobs,
        "fill_s": filled,
        "ready_s": ready,
        "taken_up_s": up,
        "rss_mib": rss["VmRSS"],
        "hwm_mib": rss["VmHWM"],
        "idle_cpu_share": (cpu1 - cpu0) / (at1 - at0),
        "wakeups_per_s": (wake1 - wake0) / (at1 - at0),
        "metrics_bytes": len(body),
        "scrape_takeup": {**summary(during.times), "failed": during.failed},
        "scrape_idle": summary(idle_times),
        "scrape_s": max(idle_times),  # the slowest idle scrape (before: the only one)
    }


def scrapes(got: dict[str, Any]) -> str:
    """``median 12 ms, max 40 ms (n=9)`` of a ``bench.scrapes.summary``."""
    if not got["n"]:
        return "none"
    failed = f", {got['failed']} failed" if got.get("failed") else ""
    return (
        f"median {1000 * got['median_s']:.0f} ms, max {1000 * got['max_s']:.0f} ms "
        f"(n={got['n']}{failed})"
    )


def plot(result: dict[str, Any], out: Path) -> None:
    """The curves of docs/PERFORMANCE.md ("100,000 jobs"): RSS above the floor and
    the time to take every job up, against the jobs (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    jobs = [p["jobs"] for p in points]
    fig, (rss, up) = plt.subplots(1, 2, figsize=(10, 4))
    rss.plot(jobs, [p["rss_mib"] for p in points], marker="o", label="sidecar")
    rss.axhline(result["floor"]["rss_mib"], color="grey", linestyle="--", label="floor")
    rss.set(xscale="log", xlabel="jobs (state bucket)", ylabel="RSS (MiB)", title="Memory")
    rss.legend()
    up.plot(jobs, [p["ready_s"] for p in points], marker="o", label="ready")
    up.plot(jobs, [p["taken_up_s"] for p in points], marker="o", label="every job taken up")
    up.set(xscale="log", xlabel="jobs (state bucket)", ylabel="seconds from exec", title="Start")
    up.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main() -> None:
    if sys.argv[1:2] == ["--plot"]:  # from the last run's results, into docs/
        data = json.loads((Path(__file__).parent / "results" / "jobs_scale.json").read_text())
        plot(data, Path(__file__).parent.parent / "docs" / "jobs-scale.png")
        return
    sizes = [int(s) for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else list(SIZES)
    runtime.ensure()
    result: dict[str, Any] = {"idle_seconds": IDLE_SECONDS}
    with workdir("jobs-scale") as work, nats_server(work) as server:
        base = floor()
        result["floor"] = base
        points = []
        for n in sizes:
            point = measure(work, server, n)
            if "rss_mib" not in point:  # JOBS_PROFILE: the time to ready only
                print(f"{n:7d} jobs: ready {point['ready_s']:.2f} s (profiled)", flush=True)
                continue
            point["rss_ratio_vs_floor"] = point["rss_mib"] / base["rss_mib"]
            points.append(point)
            print(
                f"{n:7d} jobs: ready {point['ready_s']:.2f} s, all taken up "
                f"{point['taken_up_s']:.2f} s, RSS {point['rss_mib']:.1f} MiB "
                f"({point['rss_ratio_vs_floor']:.2f}x the floor {base['rss_mib']:.1f}), idle CPU "
                f"{100 * point['idle_cpu_share']:.2f} % of a core, "
                f"{point['wakeups_per_s']:.1f} wake-ups/s, /metrics {point['metrics_bytes']} B, "
                f"scrape during take-up {scrapes(point['scrape_takeup'])}, "
                f"idle {scrapes(point['scrape_idle'])}",
                flush=True,
            )
        for a, b in itertools.pairwise(points):
            kib = (b["rss_mib"] - a["rss_mib"]) * 1024 / (b["jobs"] - a["jobs"])
            b["marginal_kib_per_job"] = kib
            print(f"marginal RSS {a['jobs']} -> {b['jobs']} jobs: {kib:.2f} KiB a job", flush=True)
        result["points"] = points
    result["machine"] = machine()
    write_result("jobs_scale", result)


if __name__ == "__main__":
    main()
