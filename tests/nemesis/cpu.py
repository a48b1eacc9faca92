"""Evidence of CPU starvation during a nemesis run (``cpu.jsonl``).

On a shared 2-core machine a slot can be missed because nothing got the CPU
in time, not because of the sidecar's logic. The checker may put a miss down
to that only with evidence measured in the run itself, two kinds of it,
sampled every ``EVERY`` seconds by a thread of the harness:

- ``stall``: the harness's own sampling thread woke later than it asked, by
  ``late`` seconds (recorded from ``STALL_MIN``): a plain sleeping thread that
  could not be scheduled. It also holds up the apps' thread and the nemesis.
- ``wait``: a sidecar process's main thread (its event loop) spent ``wait``
  seconds of the last ``dt`` runnable but not running: the run-queue wait the
  kernel counts in ``/proc/<pid>/schedstat`` (recorded from ``WAIT_MIN``).

``load`` lines (``/proc/loadavg``, every ``LOAD_EVERY`` seconds) say how
loaded the machine was; they are never evidence by themselves.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

EVERY = 0.25
STALL_MIN = 0.2
WAIT_MIN = 0.05
LOAD_EVERY = 5.0


def runqueue_wait(pid: int) -> float | None:
    """Seconds the process's main thread has waited on a run queue (None: unknown)."""
    try:
        fields = Path(f"/proc/{pid}/schedstat").read_text().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return []


class CpuWatch:
    """Samples stalls and run-queue waits into `path` until stopped."""

    def __init__(self, path: Path, pids: Callable[[], dict[str, int | None]]) -> None:
        self.path = path
        self.pids = pids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="nemesis-cpu")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        last: dict[str, tuple[int, float, float]] = {}  # name -> (pid, at, wait)
        next_load = 0.0
        with self.path.open("a") as out:
            while True:
                asked = time.monotonic() + EVERY
                if self._stop.wait(EVERY):
                    return
                now = time.time()
                late = time.monotonic() - asked
                lines: list[dict[str, Any]] = []
                if late >= STALL_MIN:
                    lines.append({"kind": "stall", "t": now, "late": round(late, 3)})
                for name, pid in self.pids().items():
                    wait = runqueue_wait(pid) if pid else None
                    if pid is None or wait is None:
                        last.pop(name, None)
                        continue
                    before = last.get(name)
                    last[name] = (pid, now, wait)
                    if before is None or before[0] != pid:
                        continue  # a new process: no interval yet
                    waited = wait - before[2]
                    if waited >= WAIT_MIN:
                        dt = round(now - before[1], 3)
                        lines.append(
                            {"kind": "wait", "t": now, "dt": dt, "proc": name, "wait": waited}
                        )
                if now >= next_load:
                    lines.append({"kind": "load", "t": now, "load": loadavg()})
                    next_load = now + LOAD_EVERY
                for line in lines:
                    out.write(json.dumps(line) + "\n")
                out.flush()


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def stalled(cpu: Iterable[dict[str, Any]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] the harness's sampling thread could not run."""
    return sum(overlap(c["t"] - c["late"], c["t"], lo, hi) for c in cpu if c.get("kind") == "stall")


def waited(cpu: Iterable[dict[str, Any]], proc: str, lo: float, hi: float) -> float:
    """Seconds of [lo, hi] sidecar `proc` was runnable but not running (pro rata per sample)."""
    total = 0.0
    for c in cpu:
        if c.get("kind") != "wait" or c.get("proc") != proc:
            continue
        start, dt = c["t"] - c["dt"], max(c["dt"], 1e-6)
        total += c["wait"] * overlap(start, c["t"], lo, hi) / dt
    return total
