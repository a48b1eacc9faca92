"""Where a sidecar's memory goes: tracemalloc with 1,000 jobs against 10.

``python -m bench.memory [JOBS] [SOURCE...]`` runs a real sidecar in the
runtime-only venv with ``bench.footprint``'s config of 10 jobs and of JOBS
jobs (default 1,000), traced from its first import (``bench.memory_child``),
takes a snapshot 2 s after ready, and prints what grew with the jobs: by line
where it was allocated, and by the first frame in ``sidecar/`` (the sidecar's
code that asked for it, whatever library did the allocating). Bytes per job
are (large - small) / (JOBS - 10).

SOURCE: other checkouts' ``sidecar`` packages (a directory holding
``sidecar/``) measured in the same run, interleaved, for a before/after
comparison; the default is this checkout.
"""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import footprint, runtime
from bench.common import nats_server, workdir, write_result
from tests.support import ROOT, NatsServer, free_port, sidecar_env, write_config

SMALL = 10
TOP = 25


def snapshot(
    work: Path, server: NatsServer, jobs: int, source: Path, tag: str
) -> tuple[tracemalloc.Snapshot, int, int]:
    port = free_port()
    cfg = footprint.config(server, jobs)
    cfg["instance_id"] = f"mem{tag}{jobs}"
    cfg["metrics"] = {"listen": f"127.0.0.1:{port}"}
    path = write_config(work / f"mem-{tag}-{jobs}.yaml", cfg)
    out = work / f"mem-{tag}-{jobs}.snap"
    proc = subprocess.run(
        [
            runtime.python(),
            str(ROOT / "bench" / "memory_child.py"),
            str(path),
            f"http://127.0.0.1:{port}/readyz",
            str(out),
        ],
        env=sidecar_env({"PYTHONPATH": str(source)}),
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if not Path(str(out) + ".rss").exists():
        raise RuntimeError(f"no snapshot (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rss, traced = (int(x) for x in Path(str(out) + ".rss").read_text().split())
    return tracemalloc.Snapshot.load(str(out)), rss, traced


def by_sidecar_frame(snap: tracemalloc.Snapshot) -> dict[str, int]:
    """Bytes by the innermost frame in the sidecar's own code (else the innermost frame)."""
    sizes: dict[str, int] = defaultdict(int)
    for trace in snap.traces:
        frames = list(reversed(trace.traceback))  # a Traceback is oldest first
        key = None
        for frame in frames:
            if "/sidecar/" in frame.filename:
                key = f"{frame.filename.rsplit('/sidecar/', 1)[1]}:{frame.lineno}"
                break
        if key is None:
            frame = frames[0]
            key = f"(lib) {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
        sizes[key] += trace.size
    return sizes


def diff(small: dict[str, int], large: dict[str, int]) -> list[tuple[str, int]]:
    keys = set(small) | set(large)
    return sorted(((k, large.get(k, 0) - small.get(k, 0)) for k in keys), key=lambda kv: -kv[1])


def by_line(snap: tracemalloc.Snapshot) -> dict[str, int]:
    return {
        f"{s.traceback[0].filename.rsplit('/', 2)[-2:][-1]}:{s.traceback[0].lineno}": s.size
        for s in snap.statistics("lineno")
    }


def by_file(snap: tracemalloc.Snapshot) -> dict[str, int]:
    return {
        "/".join(s.traceback[0].filename.rsplit("/", 2)[-2:]): s.size
        for s in snap.statistics("filename")
    }


def report(
    tag: str, jobs: int, small: Any, large: Any, *, small_jobs: int = SMALL
) -> dict[str, Any]:
    """What grew from `small_jobs` jobs (snapshot `small`) to `jobs` (`large`), a job."""
    (s_snap, s_rss, s_traced), (l_snap, l_rss, l_traced) = small, large
    per_job = (l_traced - s_traced) / (jobs - small_jobs)
    print(
        f"\n== {tag}: traced {s_traced / 2**20:.2f} MiB ({small_jobs} jobs) -> "
        f"{l_traced / 2**20:.2f} MiB ({jobs} jobs): {per_job:.0f} B a job; "
        f"RSS (with tracemalloc's own) {s_rss / 1024:.1f} -> {l_rss / 1024:.1f} MiB"
    )
    out: dict[str, Any] = {"traced_small": s_traced, "traced_large": l_traced, "per_job": per_job}
    for name, fn in (("by file", by_file), ("by sidecar frame", by_sidecar_frame)):
        rows = diff(fn(s_snap), fn(l_snap))[:TOP]
        print(f"-- grew {name} (bytes a job)")
        for key, size in rows:
            print(f"{size / (jobs - small_jobs):9.0f}  {size / 2**20:7.2f} MiB  {key}")
        out[name] = rows
    return out


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    sources = [Path(p).resolve() for p in sys.argv[2:]] or [ROOT]
    runtime.ensure()
    result: dict[str, Any] = {"jobs": jobs}
    with workdir("memory") as work, nats_server(work) as server:
        snaps: dict[str, list[Any]] = {}
        for i, source in enumerate(sources):
            tag = f"s{i}"
            snaps[tag] = [snapshot(work, server, n, source, tag) for n in (SMALL, jobs)]
        for i, source in enumerate(sources):
            tag = f"s{i}"
            result[str(source)] = report(f"{tag} {source}", jobs, *snaps[tag])
    write_result("memory", result)


if __name__ == "__main__":
    main()
