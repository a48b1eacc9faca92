"""What a job of the state bucket keeps: tracemalloc with 1,000 bucket jobs against 5,000.

``python -m bench.bucket_memory [SMALL,LARGE] [SOURCE...]`` fills the state
bucket with SMALL then LARGE ``job.<name>`` keys as ``bench.jobs_scale`` does
(none due), runs a real sidecar of the runtime-only venv traced from its first
import (``bench.memory_child``), waits until its presence says it runs every
job of the bucket, then 2 s, and prints what grew with the jobs (by file and by
the first frame in ``sidecar/``, as ``bench.memory``). Bytes a job are
(large - small) / (LARGE - SMALL): the marginal cost, without the start's.
Less noisy than ``bench.jobs_scale``'s RSS on a shared machine, and quicker
(issue 49, docs/PERFORMANCE.md).

SOURCE: other checkouts' ``sidecar`` packages (a directory holding
``sidecar/``), measured in the same run, for a before/after comparison; the
default is this checkout.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench import runtime
from bench.common import nats_server, workdir, write_result
from bench.jobs_scale import config as scale_config
from bench.jobs_scale import fill, taken_up
from bench.memory import report
from sidecar.config.load import parse_config
from sidecar.store.state import state_spec
from tests.support import ROOT, NatsServer, free_port, sidecar_env, write_config

SIZES = (1_000, 5_000)


def snapshot(
    work: Path, server: NatsServer, jobs: int, source: Path, tag: str
) -> tuple[tracemalloc.Snapshot, int, int]:
    cfg = scale_config(server, jobs)
    asyncio.run(fill(server, cfg, jobs))
    instance = f"bm{tag}{jobs}"
    port = free_port()
    cfg["instance_id"] = instance
    cfg["metrics"] = {"listen": f"127.0.0.1:{port}"}
    path = write_config(work / f"bm-{tag}-{jobs}.yaml", cfg)
    out, go = work / f"bm-{tag}-{jobs}.snap", work / f"bm-{tag}-{jobs}.go"
    log = work / f"bm-{tag}-{jobs}.log"  # a file: a pipe not read would fill and stop it
    with log.open("w") as err:
        proc = subprocess.Popen(
            [
                runtime.python(),
                str(ROOT / "bench" / "memory_child.py"),
                str(path),
                f"http://127.0.0.1:{port}/readyz",
                str(out),
                str(go),
            ],
            env=sidecar_env({"PYTHONPATH": str(source), "MEMORY_SLICE": "0.5"}),
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    bucket = state_spec(parse_config(cfg, {})).bucket
    deadline = time.monotonic() + 600
    while asyncio.run(taken_up(server, bucket, instance)) < jobs:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"not taken up (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    go.touch()
    proc.wait(timeout=300)
    rss_file = Path(str(out) + ".rss")
    if not rss_file.exists():
        raise RuntimeError(f"no snapshot (exit {proc.returncode}):\n{log.read_text()[-3000:]}")
    rss, traced = (int(x) for x in rss_file.read_text().split())
    return tracemalloc.Snapshot.load(str(out)), rss, traced


def main() -> None:
    small, large = (int(s) for s in sys.argv[1].split(",")) if len(sys.argv) > 1 else SIZES
    sources = [Path(p).resolve() for p in sys.argv[2:]] or [ROOT]
    runtime.ensure()
    result: dict[str, Any] = {"small": small, "large": large}
    with workdir("bucket-memory") as work, nats_server(work) as server:
        snaps = {
            f"s{i}": [snapshot(work, server, n, source, f"s{i}") for n in (small, large)]
            for i, source in enumerate(sources)
        }
        for i, source in enumerate(sources):
            tag = f"s{i}"
            result[str(source)] = report(f"{tag} {source}", large, *snaps[tag], small_jobs=small)
    write_result("bucket_memory", result)


if __name__ == "__main__":
    main()
