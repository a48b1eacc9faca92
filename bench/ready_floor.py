"""Time to ready with 1,000 jobs: the sidecar against the least any sidecar of its design does.

The floor program (``FLOOR``), run from the same runtime venv as the
sidecar and timed the same way (exec to the first 200 of ``/readyz``), does
only what cannot be left out: it loads the sidecar's code (its dependencies
and its own modules: the same imports as ``run``), reads the same config file
(libyaml, the sidecar's fastest loader), finds each job's next slot with
cronsim (no timezone rules, no other check), connects to NATS, asks for the
stream once, and answers ``/readyz`` from a bare asyncio server. What the
sidecar does beyond that (every key's checks, the config's objects, the metric
series, the fleet's presence and view, a task per job) is the difference.
Rounds alternate between the two; a third series is the dependencies' imports
alone (``bench.footprint``'s floor).

    python -m bench.ready_floor [ROUNDS]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench import footprint, runtime
from bench.common import machine, nats_server, workdir, write_result
from tests.support import free_port, sidecar_env, write_config

JOBS = 1000


# The floor program: what a ready sidecar of this design cannot skip. argv: config, port.
FLOOR = """
import asyncio, sys
from datetime import datetime

import nats
from cronsim import CronSim

import sidecar.cli.main, sidecar.cli.daemon  # loading the code is part of the floor
from sidecar.config.yamlfile import read_yaml

data = read_yaml(sys.argv[1])
now = datetime.now().replace(microsecond=0)
slots = [next(CronSim(job["schedule"], now)) for job in data["jobs"]]


async def answer(reader, writer):
    await reader.readuntil(b"\\r\\n\\r\\n")
    writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 6\\r\\n\\r\\nready\\n")
    await writer.drain()
    writer.close()


async def main():
    nc = await nats.connect(data["nats"]["servers"][0])
    try:
        await nc.jetstream().stream_info("CRON")  # one round trip, found or not
    except nats.js.errors.NotFoundError:
        pass
    server = await asyncio.start_server(answer, "127.0.0.1", int(sys.argv[2]))
    async with server:
        await asyncio.sleep(3600)


asyncio.run(main())
"""


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def timed(cmd: list[str], port: int, cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=sidecar_env(), cwd=cwd
    )
    try:
        while not ready(port):
            assert proc.poll() is None, f"{cmd[:3]} exited {proc.returncode}"
            assert time.perf_counter() - t0 < 60, "not ready within 60 s"
            time.sleep(0.005)
        return time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    venv = runtime.ensure()
    python = str(venv / "bin" / "python")
    times: dict[str, list[float]] = {"imports": [], "floor": [], "sidecar": []}
    with workdir("ready_floor") as work, nats_server(work) as server:
        for r in range(rounds):
            times["imports"].append(footprint.floor()["seconds"])
            port = free_port()
            cfg = {**footprint.config(server, JOBS), "metrics": {"listen": f"127.0.0.1:{port}"}}
            cfg["instance_id"] = f"rf{r}"
            path = write_config(work / "c.yaml", cfg)
            floor_cmd = [python, "-c", FLOOR, str(path), str(port)]
            sidecar_cmd = [str(venv / "bin" / "anarchon-sidecar"), "run", "-c", str(path)]
            order = [("floor", floor_cmd), ("sidecar", sidecar_cmd)]
            for name, cmd in order if r % 2 == 0 else order[::-1]:  # neither always first
                times[name].append(timed(cmd, port, work))
    result = {
        "rounds": rounds,
        "jobs": JOBS,
        "machine": machine(),
        **{f"{k}_s": statistics.median(v) for k, v in times.items()},
        **{f"{k}_min_s": min(v) for k, v in times.items()},
        "runs_s": times,
        "sidecar_over_floor_s": statistics.median(
            s - f for s, f in zip(times["sidecar"], times["floor"], strict=True)
        ),
    }
    write_result("ready_floor", result)
    print(
        f"time to ready, {JOBS} jobs, median of {rounds} (min): dependencies' imports "
        f"{result['imports_s']:.3f} s ({result['imports_min_s']:.3f}), the design's floor "
        f"{result['floor_s']:.3f} s ({result['floor_min_s']:.3f}), the sidecar "
        f"{result['sidecar_s']:.3f} s ({result['sidecar_min_s']:.3f}); the sidecar over "
        f"the floor {result['sidecar_over_floor_s'] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
