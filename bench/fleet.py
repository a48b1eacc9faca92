"""Fleet throughput and trigger start delay: real sidecar processes, a real app.

N sidecars x J jobs that fire every second (six-field cron ``* * * * * *``)
with ``jitter: 0``, so the drawn jitter is zero and the start delay is simply
the request's arrival at the app minus the slot time (both wall clock, same
machine). Runs, one after the other on one nats-server:
- idle: 3 sidecars x 1 job;
- fleet: 3 x 100 and 10 x 100.
Each run measures over a window of whole slots after a warm-up: slots run per
second (distinct job/slot pairs that reached the app), claims per second
(every instance's won + lost counters), doubles and misses, CPU seconds per
slot per instance (utime + stime from /proc), and the start delay of every
request. The baseline is the raw client (``bench.raw_publish``: nats-py
publishing claim-sized messages with msg ids, J at a time, flat out) on the
same server: its publishes per second and CPU seconds per publish.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.app import fetch_records
from bench.common import (
    cpu_seconds,
    machine,
    nats_server,
    ratio,
    summary_ms,
    workdir,
    write_result,
)
from tests.support import ROOT, NatsServer, Sidecar, free_port, port_open, sidecar_env, wait_for


class App:
    """bench.app in a process of its own."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.app", str(self.port)], cwd=ROOT, env=sidecar_env()
        )
        wait_for(lambda: port_open(self.port), 10, what="bench app")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def records(self) -> list[tuple[str, int, float]]:
        return fetch_records(self.port)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def fleet_config(server: NatsServer, app: App, label: str, jobs: int) -> dict[str, Any]:
    return {
        "nats": {"servers": [server.url], "history_size": 1000},
        "target": {"url": app.url, "timeout": "10s"},
        "jobs": [
            {
                "name": f"{label}-{k:03d}",
                "schedule": "* * * * * *",
                "jitter": 0,
                "max_late": "5s",
                "request": {"path": f"/{label}/{k:03d}"},
            }
            for k in range(jobs)
        ],
    }


def sleep_until(wall: float) -> None:
    while (delay := wall - time.time()) > 0:
        time.sleep(min(delay, 0.5))


def claim_counts(sidecar: Sidecar) -> float:
    """Won + lost claims of one sidecar, all jobs, from its /metrics."""
    with urllib.request.urlopen(sidecar.base_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("anarchon_claims_won_total{", "anarchon_claims_lost_total{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_fleet(
    work: Path,
    server: NatsServer,
    app: App,
    label: str,
    instances: int,
    jobs: int,
    seconds: int,
    warmup: float = 3.0,
) -> dict[str, Any]:
    config = fleet_config(server, app, label, jobs)
    procs = [Sidecar(work, f"{label}-s{i}", config, {}) for i in range(instances)]
    pool = concurrent.futures.ThreadPoolExecutor(max(instances, 1))
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready(60)
        pids = [p.proc.pid for p in procs if p.proc]
        # The window: whole slots k+1 .. k+seconds; counters read 0.3 s after a
        # slot, CPU 0.6 s after it, when the slot's work is done.
        k = math.floor(time.time() + warmup)
        sleep_until(k + 0.3)
        claims0 = sum(pool.map(claim_counts, procs))
        sleep_until(k + 0.6)
        cpu0 = [cpu_seconds(pid) for pid in pids]
        srv0 = cpu_seconds(server.proc.pid) if server.proc else 0.0
        sleep_until(k + seconds + 0.6)
        cpu1 = [cpu_seconds(pid) for pid in pids]
        srv1 = cpu_seconds(server.proc.pid) if server.proc else 0.0
        claims1 = sum(pool.map(claim_counts, procs))
        sleep_until(k + seconds + 2)  # let the last slot's requests arrive
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.terminate(30)
            p.kill()
        pool.shutdown()
    first, last = (k + 1) * 1000, (k + seconds) * 1000
    delays: list[float] = []
    seen: dict[tuple[str, int], int] = {}
    for path, slot, at in app.records():
        if path.startswith(f"/{label}/") and first <= slot <= last:
            seen[(path, slot)] = seen.get((path, slot), 0) + 1
            delays.append(at - slot / 1000)
    slots = len(seen)
    cpu = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    expected = jobs * seconds
    return {
        "instances": instances,
        "jobs": jobs,
        "window_seconds": seconds,
        "slots": slots,
        "slots_expected": expected,
        "doubles": sum(n - 1 for n in seen.values()),
        "slots_per_second": slots / seconds,
        "claims_per_second": (claims1 - claims0) / seconds,
        "cpu_seconds_per_instance": cpu,
        "cpu_ms_per_slot_per_instance": 1000 * sum(cpu) / len(cpu) / expected,
        "cpu_ms_per_slot_per_instance_max": 1000 * max(cpu) / expected,
        "nats_server_cpu_ms_per_slot": 1000 * (srv1 - srv0) / expected,
        "start_delay": summary_ms(delays),
        "start_delays_ms": sorted(round(d * 1000, 3) for d in delays),
    }


def raw_baseline(server: NatsServer, concurrency: int, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.raw_publish", server.url, str(concurrency), str(seconds)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=sidecar_env(),
        timeout=seconds + 60,
    )
    raw: dict[str, Any] = json.loads(out.stdout)
    raw["concurrency"] = concurrency
    raw["publishes_per_second"] = raw["publishes"] / raw["seconds"]
    raw["cpu_ms_per_publish"] = 1000 * raw["cpu_seconds"] / raw["publishes"]
    return raw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--idle-seconds", type=int, default=90)
    parser.add_argument("--fleet-seconds", type=int, default=30)
    parser.add_argument("--fleets", default="3,10", help="instances of each 100-job fleet run")
    parser.add_argument("--raw-seconds", type=float, default=5.0)
    args = parser.parse_args()
    result: dict[str, Any] = {}
    app = App()
    try:
        with workdir("fleet") as work, nats_server(work) as server:
            if args.idle_seconds:
                idle = run_fleet(work, server, app, "idle", 3, 1, args.idle_seconds)
                result["idle"] = idle
                print(f"idle 3x1: start delay {fmt(idle['start_delay'])}", flush=True)
            for n in [int(n) for n in args.fleets.split(",") if n]:
                run = run_fleet(work, server, app, f"f{n}", n, 100, args.fleet_seconds)
                result[f"fleet_{n}x100"] = run
                print(
                    f"fleet {n}x100: {run['slots_per_second']:.1f} slots/s, "
                    f"{run['claims_per_second']:.0f} claims/s, "
                    f"{run['cpu_ms_per_slot_per_instance']:.3f} CPU ms/slot/instance, "
                    f"doubles {run['doubles']}, start delay {fmt(run['start_delay'])}",
                    flush=True,
                )
            raw = raw_baseline(server, 100, args.raw_seconds)
    finally:
        app.stop()
    result["raw"] = raw
    for key, run in result.items():
        if key.startswith("fleet_"):
            run["cpu_ratio_vs_raw_publish"] = ratio(
                run["cpu_ms_per_slot_per_instance"], raw["cpu_ms_per_publish"]
            )
    result["machine"] = machine()
    write_result("fleet", result)
    print(
        f"raw client: {raw['publishes_per_second']:.0f} publishes/s, "
        f"{raw['cpu_ms_per_publish']:.3f} CPU ms/publish"
    )


def fmt(s: dict[str, float]) -> str:
    if not s.get("n"):
        return "no samples"
    return (
        f"p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms, max {s['max_ms']:.1f} ms (n={s['n']})"
    )


if __name__ == "__main__":
    main()
