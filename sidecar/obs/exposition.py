"""The ``/metrics`` body: the registry rendered in slices on the loop, reused while fresh.

Rendering 1,000 jobs takes about 100 ms: in one piece that would delay
claims, and in a thread the GIL would hand the loop back only every 5 ms at
each of its system calls, so ``render`` yields every ``RENDER_SLICE``. A
rendering is reused for ``METRICS_REUSE`` times as long as it took, at most
``METRICS_MAX_AGE`` (``MetricsCache``): however many scrape it, rendering
takes about a tenth of the loop's time (less than a third with 1,000 jobs),
and a small sidecar's samples are a few ms old. The admin server
(sidecar/admin/server.py) serves it.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from sidecar.obs.metric_series import Family

METRICS_MAX_AGE = 1.0
METRICS_REUSE = 10.0
RENDER_SLICE = 0.002  # the longest the loop is held by rendering (pages too)


class MetricsCache:
    """The registry's exposition, rendered in slices, reused while it is fresh enough.

    Fresh: younger than `reuse` times its rendering's duration, and than `max_age`.
    Concurrent scrapes share one rendering. The per-job series are written a
    piece at a time (``Family.text``), the rest with prometheus_client's
    ``generate_latest`` one metric at a time; the output is the same.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        max_age: float = METRICS_MAX_AGE,
        reuse: float = METRICS_REUSE,
    ) -> None:
        self.registry = registry
        self.max_age = max_age
        self.reuse = reuse
        self._body: bytes | None = None
        self._fresh_until = 0.0
        self._pending: asyncio.Future[bytes] | None = None

    async def body(self) -> bytes:
        if self._body is not None and time.monotonic() < self._fresh_until:
            return self._body
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._render())
        # Shielded: a scrape that gives up does not cancel the others' rendering.
        return await asyncio.shield(self._pending)

    async def _render(self) -> bytes:
        try:
            started = time.monotonic()
            body = await render(self.registry)
            took = time.monotonic() - started
            self._body = body
            self._fresh_until = started + min(self.max_age, self.reuse * took)
            return body
        finally:
            self._pending = None


class _One(Collector):
    """One collected metric, for generate_latest."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


async def render(registry: CollectorRegistry) -> bytes:
    """generate_latest(registry), yielding to the loop every RENDER_SLICE seconds."""
    parts: list[str] = []
    since = time.perf_counter()
    for metric in registry.collect():
        pieces = metric.text() if isinstance(metric, Family) else [generate_latest(_One(metric))]
        for piece in pieces:
            parts.append(piece if isinstance(piece, str) else piece.decode())
            if time.perf_counter() - since > RENDER_SLICE:
                await asyncio.sleep(0)
                since = time.perf_counter()
    return "".join(parts).encode()
