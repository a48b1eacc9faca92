"""Footprint: RSS and time to ready of a sidecar with 10, 100 and 1,000 jobs.

Everything runs in the runtime-only environment (``bench.runtime``: a venv
with ``pip install .`` and nothing else). The floor is a bare Python process
there that only imports nats-py, PyYAML, click and prometheus-client: its RSS
once imported, and its time from exec to "imported". A sidecar's time to ready
runs from exec to the first 200 of ``/readyz`` (connected, stream in place);
its RSS is read 2 s later, with VmHWM (peak) beside it. The jobs have
different schedules and time zones (hourly, every n minutes, daily, weekly),
as a real config of that size would, so nothing is shared between them.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import runtime
from bench.common import machine, nats_server, rss_mib, workdir, write_result
from tests.support import NatsServer

# The floor of issue 14: what any Python client of NATS with this CLI and config needs.
DEPENDENCIES = ("nats", "prometheus_client", "click", "yaml")
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Sydney")
SIZES = (10, 100, 1000)
REPEATS = 3


def schedule(i: int) -> str:
    kind = i % 4
    if kind == 0:
        return f"{i % 60} * * * *"
    if kind == 1:
        return f"{(i // 4) % 60}/{5 + i % 11} * * * *"
    if kind == 2:
        return f"{(i // 4) % 60} {i % 24} * * *"
    return f"{(i // 4) % 60} {i % 24} * * {i % 7}"


def config(server: NatsServer, jobs: int) -> dict[str, Any]:
    return {
        "nats": {"servers": [server.url]},
        "target": {"url": "http://127.0.0.1:9"},  # never called while measured
        "jobs": [
            {
                "name": f"job-{i:04d}",
                "schedule": schedule(i),
                "timezone": ZONES[i % len(ZONES)],
                "request": {"path": f"/jobs/{i}"},
            }
            for i in range(jobs)
        ],
    }


def floor(venv: Path | None = None) -> dict[str, float]:
    """RSS and import time of a Python that imports the dependencies and idles."""
    code = (
        f"import {', '.join(DEPENDENCIES)}, sys\nprint('imported', flush=True)\nsys.stdin.read()\n"
    )
    python = str(venv / "bin" / "python") if venv else runtime.python()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=runtime.env(),
        cwd=runtime.VENV,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "imported"
    elapsed = time.perf_counter() - t0
    time.sleep(2)
    rss = rss_mib(proc.pid)
    proc.stdin.close()
    proc.wait(10)
    return {"seconds": elapsed, "rss_mib": rss["VmRSS"], "hwm_mib": rss["VmHWM"]}


def sidecar(
    work: Path,
    server: NatsServer,
    jobs: int,
    rep: int | str,
    name: str = "fp",
    venv: Path | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, float]:
    """Time to ready and RSS (2 s after ready) of a sidecar with `jobs` jobs."""
    proc = runtime.RuntimeSidecar(work, f"{name}{jobs}-{rep}", config(server, jobs), env or {})
    if venv is not None:
        proc.venv = venv
    t0 = time.perf_counter()
    proc.start()
    try:
        while not proc.ready():
            assert proc.proc and proc.proc.poll() is None, proc.log()
            assert time.perf_counter() - t0 < 60, "not ready within 60 s"
            time.sleep(0.005)
        elapsed = time.perf_counter() - t0
        time.sleep(2)
        assert proc.proc is not None
        rss = rss_mib(proc.proc.pid)
    finally:
        proc.terminate(30)
    return {"seconds": elapsed, "rss_mib": rss["VmRSS"], "hwm_mib": rss["VmHWM"]}


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    sizes = [int(s) for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else list(SIZES)
    result: dict[str, Any] = {"repeats": REPEATS}
    floors: list[dict[str, float]] = []
    runs: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
    runtime.ensure()
    with workdir("footprint") as work, nats_server(work) as server:
        for rep in range(REPEATS):  # interleaved: floor, then each size
            floors.append(floor())
            for n in sizes:
                runs[n].append(sidecar(work, server, n, rep))
    base = median_of(floors)
    result["floor"] = base
    for n in sizes:
        m = median_of(runs[n])
        m["rss_above_floor_mib"] = m["rss_mib"] - base["rss_mib"]
        m["ready_ratio_vs_import"] = m["seconds"] / base["seconds"]
        result[f"jobs_{n}"] = m
        print(
            f"{n:5d} jobs: ready in {m['seconds']:.3f} s (imports alone {base['seconds']:.3f} s), "
            f"RSS {m['rss_mib']:.1f} MiB = floor {base['rss_mib']:.1f} + "
            f"{m['rss_above_floor_mib']:.1f} MiB (peak {m['hwm_mib']:.1f})",
            flush=True,
        )
    result["machine"] = machine()
    result["runtime_packages"] = runtime.packages()
    write_result("footprint", result)


if __name__ == "__main__":
    main()
