"""Capacity: replicas x jobs per second one NATS setup holds before start delay p99 > 100 ms.

``python -m bench.capacity [--seconds 10] [--replicas 2,3,5] [--jobs 25,50,100,200]``.
For a single nats-server and then a 3-node cluster with an R3 stream (all on
loopback), and for each number of replicas: fleets of growing size (every
job fires every second at jitter 0, so all are due at the same instant, the
worst case; ``bench.fleet.run_fleet``), until the start delay p99 of the
window passes 100 ms or a slot is missed or doubled; the last size that held
is the capacity. Sidecars run from the runtime-only venv. On a small machine
the sidecars' own CPU is the limit long before nats-server's: the table says
what this machine holds, and the same command on a bigger one (or sidecars
spread over machines, pointing at the same servers) extends it.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench import runtime
from bench.common import machine, nats_server, workdir, write_result
from bench.fleet import App, run_fleet
from tests.support import NatsCluster

LIMIT_MS = 100.0


def ramp(run: Any, replicas: list[int], jobs: list[int]) -> list[dict[str, Any]]:
    """For each replica count, fleets of growing size until one does not hold."""
    rows = []
    for n in replicas:
        for j in jobs:
            r = run(n, j)
            held = (
                r["start_delay"].get("p99_ms", float("inf")) <= LIMIT_MS
                and r["doubles"] == 0
                and r["slots"] == r["slots_expected"]
            )
            rows.append(
                {
                    "replicas": n,
                    "jobs_per_second": j,
                    "held": held,
                    "p50_ms": r["start_delay"].get("p50_ms"),
                    "p99_ms": r["start_delay"].get("p99_ms"),
                    "slots": r["slots"],
                    "slots_expected": r["slots_expected"],
                    "doubles": r["doubles"],
                    "cpu_ms_per_slot_per_instance": r["cpu_ms_per_slot_per_instance"],
                    "js_requests_per_slot": r["js_requests_per_slot"],
                }
            )
            print(
                f"  {n} x {j}/s: p50 {r['start_delay'].get('p50_ms', 0):.0f} ms, "
                f"p99 {r['start_delay'].get('p99_ms', 0):.0f} ms, "
                f"{r['slots']}/{r['slots_expected']} slots, {r['doubles']} doubles"
                f" -> {'holds' if held else 'does not hold'}",
                flush=True,
            )
            if not held:
                break
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--replicas", default="2,3,5")
    parser.add_argument("--jobs", default="25,50,100,200")
    args = parser.parse_args()
    replicas = [int(n) for n in args.replicas.split(",")]
    jobs = [int(n) for n in args.jobs.split(",")]
    runtime.ensure()
    result: dict[str, Any] = {"limit_ms": LIMIT_MS, "window_seconds": args.seconds}
    app = App()
    try:
        print("single nats-server, R1 stream", flush=True)
        with workdir("capacity-r1") as work, nats_server(work) as server:

            def single(n: int, j: int) -> dict[str, Any]:
                return run_fleet(work, server, app, f"c1n{n}j{j}", n, j, args.seconds)

            result["single"] = ramp(single, replicas, jobs)
        print("3-node cluster, R3 stream", flush=True)
        with workdir("capacity-r3") as work:
            cluster = NatsCluster(work)
            cluster.start()
            try:

                def r3(n: int, j: int) -> dict[str, Any]:
                    return run_fleet(
                        work,
                        cluster.nodes[0],
                        app,
                        f"c3n{n}j{j}",
                        n,
                        j,
                        args.seconds,
                        urls=cluster.urls,
                        replicas=3,
                    )

                result["r3"] = ramp(r3, replicas, jobs)
            finally:
                cluster.stop()
    finally:
        app.stop()
    result["machine"] = machine()
    write_result("capacity", result)


if __name__ == "__main__":
    main()
