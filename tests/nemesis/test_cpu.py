"""The starvation evidence is measured, not assumed: the sampler on real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.nemesis.cpu import CpuWatch, runqueue_wait, stalled, waited
from tests.support import wait_for


def test_run_queue_wait_is_read_from_the_kernel() -> None:
    first = runqueue_wait(os.getpid())
    assert first is not None
    sum(range(2_000_000))  # some CPU time, maybe some waiting
    second = runqueue_wait(os.getpid())
    assert second is not None and second >= first
    assert runqueue_wait(2**22 + 12345) is None  # no such process


def test_the_watch_records_waits_of_processes_that_compete_for_the_cpu(tmp_path: Path) -> None:
    """More busy processes than cores: each waits on the run queue, and it says so."""
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range((os.cpu_count() or 1) + 2)
    ]
    path = tmp_path / "cpu.jsonl"
    watch = CpuWatch(path, lambda: {f"b{i}": p.pid for i, p in enumerate(busy)})
    began = time.time()
    watch.start()
    try:

        def lines() -> list[dict[str, object]]:
            return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

        wait_for(
            lambda: any(x["kind"] == "wait" for x in lines()), 20, what="a run-queue wait recorded"
        )
    finally:
        watch.stop()
        for p in busy:
            p.kill()
            p.wait()
    recorded = lines()
    assert recorded[0]["kind"] == "load"
    total = sum(waited(recorded, f"b{i}", began, time.time()) for i in range(len(busy)))
    assert total > 0
    assert stalled(recorded, began, time.time()) >= 0
