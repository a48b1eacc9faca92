"""Soak: one sidecar, 100 jobs every second, 10 minutes; memory and descriptors stay flat.

RSS (VmRSS) and open file descriptors of the sidecar process are sampled every
few seconds; after a warm-up, the last minutes are compared with the first
ones. Slow: `make reliability` only. `RELIABILITY_SOAK_MINUTES` shortens it
for a trial run (the recorded figures say how long it ran).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.conftest import Figures
from tests.reliability.helpers import config, every_second, next_second_ms, tally
from tests.support import NatsServer, RecordingApp, sidecars

JOBS = 100
MINUTES = float(os.environ.get("RELIABILITY_SOAK_MINUTES", "10"))
WARM_UP = 0.2  # the first fifth of the run is warm-up
COMPARE = 0.2  # each compared window is a fifth of the run
SAMPLE_EVERY = 5.0
RSS_GROWTH_MIB = 8.0
FD_GROWTH = 3


def sampling_clock(began: float, period: float) -> Iterator[None]:
    """Yields at each multiple of `period` seconds after `began` (monotonic)."""
    n = 0
    while True:
        n += 1
        delay = began + n * period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.slow
@pytest.mark.timeout(int(MINUTES * 60) + 300)
def test_soak_memory_and_descriptors_stay_flat(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    names = [f"j{i:03d}" for i in range(JOBS)]
    cfg = config([nats_server.url], http_app, [every_second(name) for name in names])
    seconds = MINUTES * 60
    samples: list[tuple[float, int, int]] = []  # (elapsed, rss KiB, fds)
    with sidecars(tmp_path, [("soak", cfg, {})]) as (proc,):
        assert proc.proc is not None
        pid = proc.proc.pid
        start_ms = next_second_ms() + 1000
        began = time.monotonic()
        tick = sampling_clock(began, SAMPLE_EVERY)
        while (elapsed := time.monotonic() - began) < seconds:
            assert proc.proc.poll() is None, proc.log()[-3000:]
            samples.append((elapsed, rss_kib(pid), open_fds(pid)))
            next(tick)
        end_ms = next_second_ms() - 4000  # slots whose runs have surely finished
        skipped = proc.metric("anarchon_claims_skipped_total", {"reason": "late"})
        code = proc.terminate()
    warm = [s for s in samples if WARM_UP * seconds <= s[0] < (WARM_UP + COMPARE) * seconds]
    last = [s for s in samples if s[0] >= (1 - COMPARE) * seconds]
    rss_warm = statistics.median(s[1] for s in warm) / 1024
    rss_last = statistics.median(s[1] for s in last) / 1024
    fds_warm = max(s[2] for s in warm)
    fds_last = max(s[2] for s in last)
    result = tally(http_app, names, start_ms, end_ms)
    figures.report(
        "soak",
        jobs=JOBS,
        minutes=MINUTES,
        slots=result.slots,
        runs=result.runs,
        doubles=len(result.doubles),
        misses=result.misses,
        rss_warm_mib=round(rss_warm, 1),
        rss_last_mib=round(rss_last, 1),
        rss_growth_mib=round(rss_last - rss_warm, 1),
        rss_max_mib=round(max(s[1] for s in samples) / 1024, 1),
        fds_warm=fds_warm,
        fds_last=fds_last,
        samples=len(samples),
    )
    assert code == 0
    assert not result.doubles and not result.missing, (result.doubles, result.missing[:20])
    assert not skipped
    assert rss_last - rss_warm <= RSS_GROWTH_MIB, samples
    assert fds_last - fds_warm <= FD_GROWTH, samples
