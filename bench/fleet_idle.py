"""What a large fleet costs when nothing is due: N sidecars x J jobs, idle.

    python -m bench.fleet_idle [--instances 100] [--jobs 1000] [--seconds 30] [SOURCE...]

N real sidecar processes (the runtime venv) with J jobs each that do not
fire in the window (once a year), on one nats-server. Once every sidecar
shows N instances in its fleet view, every sidecar's CPU and wake-ups and
the server's CPU are read over the window. What remains is the fleet's own
traffic: every instance renews its presence (``instance.<id>``, listing its
J jobs) every 5 s, and every sidecar's watch of the state bucket receives
every renewal: N / 5 a second, each as long as the job list.

SOURCE: other checkouts (a directory holding ``sidecar/``) measured the same
way one after the other, for a before/after comparison; the default is this
checkout. Writes ``bench/results/fleet_idle.json``. Not part of ``make
bench`` (a fleet of 100 takes a few minutes to start on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nats

from bench import runtime
from bench.common import machine, nats_server, workdir, write_result
from bench.scale import Snap, start_fleet, stop_all
from bench.wire import STREAM
from tests.support import ROOT, NatsServer, bucket_keys, wait_for

STATE = f"{STREAM}_STATE"


def config(server: NatsServer, jobs: int) -> dict[str, Any]:
    return {
        "nats": {"servers": [server.url]},
        "target": {"url": "http://127.0.0.1:9"},  # never called: nothing is due
        "jobs": [
            {"name": f"idle-{j:05d}", "schedule": f"{j % 60} {j // 60 % 24} 1 1 *"}
            for j in range(jobs)
        ],
    }


def quiet_ports(n: int) -> list[int]:
    """N free ports below the ephemeral range: a hundred sidecars' own connections
    to NATS take ephemeral ports, and one may take a port free_port() found free."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports: list[int] = []
    for port in range(low - 4000, low):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"fewer than {n} free ports below {low}")


def measure(
    work: Path, server: NatsServer, source: Path, tag: str, n: int, jobs: int, seconds: float
) -> dict[str, Any]:
    env = {} if source == ROOT else {"PYTHONPATH": str(source)}
    procs = [
        runtime.RuntimeSidecar(
            work,
            f"{tag}-s{i}",
            {**config(server, jobs), "metrics": {"listen": f"127.0.0.1:{port}"}},
            env,
        )
        for i, port in enumerate(quiet_ports(n))
    ]
    try:
        started = start_fleet(procs, timeout=300)
        # Asked of the bucket, not of each sidecar: a hundred /metrics of 43,000
        # series each would be a load of their own.
        wait_for(lambda: live_instances(server) == n, 120, interval=1.0, what=f"{n} instances")
        time.sleep(10)  # the start's burst is over
        pids = [p.proc.pid for p in procs if p.proc]
        before = Snap.take(pids, server)
        time.sleep(seconds)
        idle = before.to(Snap.take(pids, server))
        # What each sidecar's view showed at the end of the window (once each).
        seen = Counter(_metric(p, "anarchon_fleet_instances") for p in procs)
    finally:
        stop_all(procs)
    shares = [c / idle["seconds"] for c in idle["cpu_seconds"]]
    return {
        "source": str(source),
        "instances": n,
        "jobs": jobs,
        "window_seconds": round(idle["seconds"], 1),
        "sidecar_cpu_percent_mean": 100 * statistics.fmean(shares),
        "sidecar_cpu_percent_max": 100 * max(shares),
        "fleet_cpu_cores": sum(shares),
        "wakeups_per_second_mean": idle["wakeups_per_second_mean"],
        "server_cpu_percent": 100 * idle["server_cpu_share"],
        "server_msgs_per_second": idle["server_msgs"] / idle["seconds"],
        "machine_busy_percent": 100 * idle["machine_busy"],
        "fleet_start_seconds": round(started["fleet_start_s"], 1),
        "instances_seen": {str(k): v for k, v in sorted(seen.items(), key=str)},
    }


def live_instances(server: NatsServer) -> int:
    """The ``instance.*`` keys in the state bucket now."""

    async def count() -> int:
        nc = await nats.connect(server.url)
        try:
            kv = await nc.jetstream().key_value(STATE)
            keys = await bucket_keys(kv)  # not kv.keys(): its end marker can come first
            return sum(1 for key in keys if key.startswith("instance."))
        finally:
            await nc.close()

    return asyncio.run(count())


def _metric(proc: runtime.RuntimeSidecar, name: str) -> float | str:
    try:
        value = proc.metric(name)
    except OSError as exc:  # too slow to answer on a starved machine: say so
        return type(exc).__name__
    return "absent" if value is None else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("sources", nargs="*", type=Path)
    args = parser.parse_args()
    sources = [s.resolve() for s in args.sources] or [ROOT]
    runtime.ensure()
    results = []
    with workdir("fleet-idle") as work, nats_server(work) as server:
        for i, source in enumerate(sources):
            r = measure(work, server, source, f"t{i}", args.instances, args.jobs, args.seconds)
            results.append(r)
            print(
                f"{source}: {r['instances']} x {r['jobs']} jobs idle: sidecar "
                f"{r['sidecar_cpu_percent_mean']:.2f}% of a core (max "
                f"{r['sidecar_cpu_percent_max']:.2f}%), the fleet {r['fleet_cpu_cores']:.2f} "
                f"cores, {r['wakeups_per_second_mean']:.1f} wake-ups/s, server "
                f"{r['server_cpu_percent']:.1f}% ({r['server_msgs_per_second']:.0f} msgs/s), "
                f"machine busy {r['machine_busy_percent']:.0f}%; instances seen "
                f"{r['instances_seen']}",
                flush=True,
            )
            write_result("fleet_idle", {"runs": results, "machine": machine()})


if __name__ == "__main__":
    main()
