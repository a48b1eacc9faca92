"""Requests per slot with and without ``claim.candidates``, as the fleet grows.

    python -m bench.candidates [--sizes 10,30] [--jobs 10] [--seconds 20] [--k 2]

For each fleet size N, twice (candidates off, then ``claim: {candidates: k}``):
N real sidecar processes (the runtime-only venv, ``bench.runtime``) with J
jobs firing every second, on one nats-server. After every sidecar sees the N
instances in its fleet view, a window of whole slots is measured: claim
publishes per slot (a core NATS subscription on ``<prefix>*.claims`` sees every
one, duplicates too), result publishes, stored-claim reads, state-bucket
writes (leases and presence), the server's CPU per slot, each sidecar's CPU
per slot, the start delay (request arrival at the app minus the slot time),
doubles and misses. Writes ``bench/results/candidates.json``. The larger
scale curves are ``bench.scale``'s; this one answers only "does the claim
cost stop growing with N".
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import runtime
from bench.common import (
    SubjectCounter,
    cpu_seconds,
    machine,
    nats_server,
    summary_ms,
    workdir,
    write_result,
)
from bench.fleet import App, sleep_until
from bench.wire import PREFIX, STREAM
from tests.support import NatsServer, Sidecar, wait_for

STATE = f"{STREAM}_STATE"


class Wire(SubjectCounter):
    """Counts, on the server's side, what the sidecars publish and request, per kind."""

    SUBJECTS = (
        f"{PREFIX}*.claims",
        f"{PREFIX}*.results",
        "$JS.API.>",
        f"$KV.{STATE}.>",
    )

    def kind(self, subject: str) -> str | None:
        if subject.startswith("$JS.API"):
            return "api"
        if subject.startswith("$KV."):
            return "kv_" + subject.split(".")[2]
        return subject.rsplit(".", 1)[1]


def config(app: App, url: str, label: str, jobs: int, k: int) -> dict[str, Any]:
    claim = {"claim": {"candidates": k, "fallback": "1s"}} if k else {}
    return {
        "nats": {"servers": [url], "history_size": 1000},
        "target": {"url": app.url, "timeout": "10s"},
        "jobs": [
            {
                "name": f"{label}-{j:03d}",
                "schedule": "* * * * * *",
                "jitter": "100ms",
                "max_late": "5s",
                "request": {"path": f"/{label}/{j:03d}"},
                **claim,
            }
            for j in range(jobs)
        ],
    }


def ready(work: Path, proc: Sidecar, cfg: dict[str, Any], tries: int = 3) -> Sidecar:
    """Wait until `proc` is ready; one that lost its metrics port to another process
    (free_port's race, with a hundred starting at once) is started again on another."""
    for attempt in range(tries):
        try:
            return proc.wait_ready(120)
        except AssertionError:
            if proc.proc is None or proc.proc.poll() is None or "already in use" not in proc.log():
                raise
        proc = runtime.RuntimeSidecar(work, f"{proc.name}r{attempt}", cfg, {})
        proc.start()
    return proc.wait_ready(120)


def run(
    work: Path, server: NatsServer, app: App, n: int, jobs: int, k: int, seconds: int
) -> dict[str, Any]:
    label = f"n{n}k{k}"
    cfg = config(app, server.url, label, jobs, k)
    procs: list[Sidecar] = [
        runtime.RuntimeSidecar(work, f"{label}-s{i}", cfg, {}) for i in range(n)
    ]
    wire = Wire(server.url)
    started = time.monotonic()
    try:
        for p in procs:
            p.start()
        for i, p in enumerate(procs):
            procs[i] = ready(work, p, cfg)
        wait_for(
            lambda: all(p.metric("anarchon_fleet_instances") == n for p in procs),
            60,
            interval=0.5,
            what=f"every sidecar to see {n} instances",
        )
        ready_s = time.monotonic() - started
        pids = [p.proc.pid for p in procs if p.proc]
        first = math.floor(time.time() + 2) + 1
        # Slots first .. first+seconds-1; the fallbacks of the last are over 1.2 s later.
        sleep_until(first - 0.4)
        cpu0 = [cpu_seconds(pid) for pid in pids]
        srv0 = cpu_seconds(server.proc.pid) if server.proc else 0.0
        wire.counting = True
        sleep_until(first + seconds - 0.4)
        cpu1 = [cpu_seconds(pid) for pid in pids]
        srv1 = cpu_seconds(server.proc.pid) if server.proc else 0.0
        wire.counting = False
        sleep_until(first + seconds + 2.5)
    finally:
        wire.close()
        for p in procs:
            with contextlib.suppress(Exception):
                p.terminate(30)
            p.kill()
    # Whole-bucket re-reads by the watchdog (a stalled watch, or one it took for stalled).
    rereads = sum(p.log().count("state bucket watch fell behind") for p in procs)
    lo, hi = first * 1000, (first + seconds - 1) * 1000
    seen: Counter[tuple[str, int]] = Counter()
    delays: list[float] = []
    for path, slot, at in app.records():
        if path.startswith(f"/{label}/") and lo <= slot <= hi:
            seen[(path, slot)] += 1
            delays.append(at - slot / 1000)
    expected = jobs * seconds
    counts = dict(wire.counts)
    cpu = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    return {
        "instances": n,
        "jobs": jobs,
        "candidates": k,
        "window_seconds": seconds,
        "slots_expected": expected,
        "slots_run": len(seen),
        "misses": expected - len(seen),
        "doubles": sum(c - 1 for c in seen.values()),
        "counts": counts,
        "claims_per_slot": counts.get("claims", 0) / expected,
        "jetstream_requests_per_slot": (
            counts.get("claims", 0) + counts.get("results", 0) + counts.get("api", 0)
        )
        / expected,
        "kv_writes_per_slot": sum(v for key, v in counts.items() if key.startswith("kv_"))
        / expected,
        "server_cpu_ms_per_slot": 1000 * (srv1 - srv0) / expected,
        "sidecar_cpu_ms_per_slot_per_instance": 1000 * sum(cpu) / len(cpu) / expected,
        "start_delay": summary_ms(delays),
        "ready_seconds": round(ready_s, 1),
        "watch_rereads": rereads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="10,30", help="fleet sizes N")
    parser.add_argument("--jobs", type=int, default=10, help="jobs per sidecar, every second")
    parser.add_argument("--seconds", type=int, default=20, help="measured slots per job")
    parser.add_argument("--k", type=int, default=2, help="claim.candidates")
    args = parser.parse_args()
    runtime.ensure()
    app = App()
    runs: list[dict[str, Any]] = []
    try:
        with workdir("candidates") as work, nats_server(work) as server:
            for n in [int(s) for s in args.sizes.split(",") if s]:
                for k in (0, args.k):
                    r = run(work, server, app, n, args.jobs, k, args.seconds)
                    runs.append(r)
                    d = r["start_delay"]
                    print(
                        f"N={n:3d} candidates={k}: {r['claims_per_slot']:.2f} claims/slot, "
                        f"{r['jetstream_requests_per_slot']:.2f} JetStream requests/slot, "
                        f"{r['kv_writes_per_slot']:.2f} KV writes/slot, server "
                        f"{r['server_cpu_ms_per_slot']:.2f} CPU ms/slot, sidecar "
                        f"{r['sidecar_cpu_ms_per_slot_per_instance']:.3f} CPU ms/slot/instance, "
                        f"start delay p50 {d.get('p50_ms', 0):.1f} p99 {d.get('p99_ms', 0):.1f} "
                        f"ms, doubles {r['doubles']}, misses {r['misses']}, "
                        f"watch re-reads {r['watch_rereads']}",
                        flush=True,
                    )
                    # After each run: a fleet too large for the machine keeps the others.
                    write_result("candidates", {"runs": runs, "machine": machine()})
    finally:
        app.stop()


if __name__ == "__main__":
    main()
