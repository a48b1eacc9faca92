"""Scrapes of ``/metrics`` timed as Prometheus sees them (issue 49).

Prometheus scrapes on its own clock, also while a sidecar takes up 100,000
jobs of the state bucket, and times each scrape from its request to the last
byte of the answer (``scrape_duration_seconds``). One scrape once everything
is idle says little about that: ``Scraper`` scrapes every ``every`` seconds
in a thread while the caller waits for something else (the take-up), and
``idle`` scrapes a few times in a row, each past the sidecar's rendering
cache (``sidecar.obs.exposition.METRICS_MAX_AGE``) so that each one renders.
``summary`` gives their number, median and max.
"""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request
from typing import Any

# Past METRICS_MAX_AGE (1 s): every scrape renders the body afresh.
CACHE_AGE = 1.2
IDLE_SCRAPES = 5


def scrape(url: str, timeout: float = 60) -> tuple[float, bytes]:
    """One GET of `url`: seconds from the request to the last byte, and the body."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = bytes(resp.read())
    return time.perf_counter() - started, body


def summary(times: list[float]) -> dict[str, Any]:
    """``{"n", "median_s", "max_s"}`` of scrape times (None without any)."""
    if not times:
        return {"n": 0, "median_s": None, "max_s": None}
    return {
        "n": len(times),
        "median_s": round(statistics.median(times), 4),
        "max_s": round(max(times), 4),
    }


def idle(url: str, count: int = IDLE_SCRAPES) -> tuple[list[float], bytes]:
    """`count` scrapes, each after the rendering cache expired; the times and the last body."""
    times: list[float] = []
    body = b""
    for _ in range(count):
        time.sleep(CACHE_AGE)
        took, body = scrape(url)
        times.append(took)
    return times, body


class Scraper:
    """Scrapes `url` every `every` seconds in a thread until ``stop``.

    A scrape that fails (the connection closed, a timeout) is counted in
    ``failed``: Prometheus would record the target down.
    """

    def __init__(self, url: str, every: float = 0.5) -> None:
        self.url = url
        self.every = every
        self.times: list[float] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                took, _ = scrape(self.url)
                self.times.append(took)
            except OSError:
                self.failed += 1
            self._stop.wait(max(0.0, self.every - (time.monotonic() - began)))
