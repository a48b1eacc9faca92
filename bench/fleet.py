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
request, and the JetStream requests per slot (claim publishes, stored-claim
reads and result publishes, counted by a core NATS subscription). The
sidecars run from the runtime-only venv (``bench.runtime``). Baselines, in the
same venv: the raw client (``bench.raw_publish``: nats-py publishing
claim-sized messages with msg ids, J at a time, flat out) on the same server,
its publishes per second and CPU seconds per publish; and during the idle run
``bench.raw_trigger`` (a timer, one raw publish, one raw POST, half a second
after each slot): the time from its wake-up to the POST's first bytes at the
app.
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

from bench import runtime
from bench.app import fetch_instances, fetch_records
from bench.common import (
    SubjectCounter,
    cpu_seconds,
    machine,
    nats_server,
    ratio,
    summary_ms,
    workdir,
    write_result,
)
from bench.wire import PREFIX, STREAM
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

    def instances(self) -> dict[str, int]:
        """The triggers so far by the sidecar that sent them."""
        return fetch_instances(self.port)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def fleet_config(
    urls: list[str], app: App, label: str, jobs: int, replicas: int | None = None
) -> dict[str, Any]:
    return {
        "nats": {
            "servers": urls,
            "history_size": 1000,
            **({"replicas": replicas} if replicas else {}),
        },
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


class RequestCounter(SubjectCounter):
    """Counts, on the server's side, the JetStream requests the sidecars make for slots.

    Every claim publish (a duplicate too), every read of a stored claim and
    every result publish of this run's jobs (``bench.common.SubjectCounter``).
    """

    SUBJECTS = (
        f"{PREFIX}*.claims",
        f"{PREFIX}*.results",
        f"$JS.API.STREAM.MSG.GET.{STREAM}",
        f"$JS.API.DIRECT.GET.{STREAM}.>",
    )

    def __init__(self, url: str, label: str) -> None:
        self.label = label
        super().__init__(url)

    def kind(self, subject: str) -> str | None:
        if subject.startswith("$JS.API"):
            return "reads"
        if subject.startswith(f"{PREFIX}{self.label}-"):
            return subject.rsplit(".", 1)[1]
        return None


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
    raw_baseline_too: bool = False,
    urls: list[str] | None = None,
    replicas: int | None = None,
    venv: Path | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One fleet; `urls` and `replicas` for a cluster (`server` is then the node to watch);
    `venv` and `env`: another runtime venv and environment for the sidecars (bench.scale)."""
    config = fleet_config(urls or [server.url], app, label, jobs, replicas)
    procs: list[Sidecar] = []
    for i in range(instances):
        proc = runtime.RuntimeSidecar(work, f"{label}-s{i}", config, env or {})
        if venv is not None:
            proc.venv = venv
        procs.append(proc)
    pool = concurrent.futures.ThreadPoolExecutor(max(instances, 1))
    counter = RequestCounter(server.url, label)
    raw: subprocess.Popen[str] | None = None
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready(60)
        pids = [p.proc.pid for p in procs if p.proc]
        # The window: whole slots k+1 .. k+seconds; counters read 0.3 s after a
        # slot, CPU 0.6 s after it, when the slot's work is done.
        k = math.floor(time.time() + warmup)
        if raw_baseline_too:
            raw = subprocess.Popen(
                [
                    runtime.python(),
                    "-m",
                    "bench.raw_trigger",
                    server.url,
                    app.url,
                    str(k + seconds + 1 - time.time()),
                ],
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env=sidecar_env(),
            )
        sleep_until(k + 0.3)
        claims0 = sum(pool.map(claim_counts, procs))
        sleep_until(k + 0.6)
        cpu0 = [cpu_seconds(pid) for pid in pids]
        srv0 = cpu_seconds(server.proc.pid) if server.proc else 0.0
        counter.counting = True  # slots k+1 .. k+seconds: their claims, reads and results
        sleep_until(k + seconds + 0.6)
        cpu1 = [cpu_seconds(pid) for pid in pids]
        srv1 = cpu_seconds(server.proc.pid) if server.proc else 0.0
        counter.counting = False
        claims1 = sum(pool.map(claim_counts, procs))
        sleep_until(k + seconds + 2)  # let the last slot's requests arrive
        raw_marks: dict[str, dict[str, float]] = (
            json.loads(raw.communicate(timeout=60)[0]) if raw else {}
        )
    finally:
        counter.close()
        if raw is not None and raw.poll() is None:
            raw.kill()
        for p in procs:
            with contextlib.suppress(Exception):
                p.terminate(30)
            p.kill()
        pool.shutdown()
    first, last = (k + 1) * 1000, (k + seconds) * 1000
    delays: list[float] = []
    seen: dict[tuple[str, int], int] = {}
    raw_work: list[float] = []
    raw_from_scheduled: list[float] = []
    for path, slot, at in app.records():
        if path.startswith(f"/{label}/") and first <= slot <= last:
            seen[(path, slot)] = seen.get((path, slot), 0) + 1
            delays.append(at - slot / 1000)
        elif path == "/raw" and str(slot) in raw_marks and first <= slot <= last:
            raw_work.append(at - raw_marks[str(slot)]["wake"])
            raw_from_scheduled.append(at - raw_marks[str(slot)]["scheduled"])
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
        "js_requests": dict(counter.counts),
        "js_requests_per_slot": sum(counter.counts.values()) / expected,
        **(
            {
                "raw_publish_and_post": summary_ms(raw_work),
                "raw_from_scheduled": summary_ms(raw_from_scheduled),
            }
            if raw_baseline_too
            else {}
        ),
    }


def raw_baseline(server: NatsServer, concurrency: int, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [runtime.python(), "-m", "bench.raw_publish", server.url, str(concurrency), str(seconds)],
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
    runtime.ensure()
    app = App()
    try:
        with workdir("fleet") as work, nats_server(work) as server:
            if args.idle_seconds:
                idle = run_fleet(
                    work, server, app, "idle", 3, 1, args.idle_seconds, raw_baseline_too=True
                )
                result["idle"] = idle
                print(
                    f"idle 3x1: start delay {fmt(idle['start_delay'])}; raw publish + POST "
                    f"{fmt(idle['raw_publish_and_post'])}; "
                    f"{idle['js_requests_per_slot']:.2f} JetStream requests per slot",
                    flush=True,
                )
            for n in [int(n) for n in args.fleets.split(",") if n]:
                run = run_fleet(work, server, app, f"f{n}", n, 100, args.fleet_seconds)
                result[f"fleet_{n}x100"] = run
                print(
                    f"fleet {n}x100: {run['slots_per_second']:.1f} slots/s, "
                    f"{run['claims_per_second']:.0f} claims/s, "
                    f"{run['cpu_ms_per_slot_per_instance']:.3f} CPU ms/slot/instance, "
                    f"doubles {run['doubles']}, start delay {fmt(run['start_delay'])}, "
                    f"{run['js_requests_per_slot']:.2f} JetStream requests per slot",
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
