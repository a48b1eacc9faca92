"""The fleet page under load: 1,000 jobs, 10 viewers, and what the claims feel of it.

One sidecar (runtime-only venv) with 1,000 jobs: 980 with the varied hourly,
daily and weekly schedules of ``bench.footprint``, and ``BUSY`` that run every
second at jitter 0, whose trigger start delays are measured (slot time to the
request's arrival at ``bench.app``, in a process of its own). Phases
alternate, each ``PHASE`` seconds, without viewers and with ``VIEWERS``
viewers that do what a browser with the page open does: load ``/``, follow
``/api/v1/events`` and fetch the rows that changed (``/fragment/jobs``),
plus a full reload of ``/`` every ``RELOAD_EVERY`` seconds (more than a
person does). Start delay and RSS with
viewers are compared with the phases without, in the same run; the time and
size of a full page of 1,000 jobs are recorded too.

    .venv/bin/python -m bench.page
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from typing import Any

import aiohttp

from bench import runtime
from bench.common import machine, nats_server, rss_mib, summary_ms, workdir, write_result
from bench.fleet import App
from bench.footprint import ZONES, schedule

JOBS = 1000
BUSY = 20
VIEWERS = 10
PHASE = 15.0
ROUNDS = 4  # interleaved: load from elsewhere falls on both kinds of phase
RELOAD_EVERY = 10.0


def page_config(server_url: str, app_url: str) -> dict[str, Any]:
    jobs: list[dict[str, Any]] = [
        {
            "name": f"busy-{i:02d}",
            "schedule": "* * * * * *",
            "jitter": 0,
            "max_late": "5s",
            "request": {"path": f"/busy/{i}"},
        }
        for i in range(BUSY)
    ]
    jobs += [
        {
            "name": f"job-{i:04d}",
            "schedule": schedule(i),
            "timezone": ZONES[i % len(ZONES)],
            "request": {"path": f"/jobs/{i}"},
        }
        for i in range(JOBS - BUSY)
    ]
    return {"nats": {"servers": [server_url]}, "target": {"url": app_url}, "jobs": jobs}


class Viewers:
    """VIEWERS simulated browsers on the page; counts what they asked and got."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.page_loads: list[float] = []
        self.page_bytes = 0
        self.fragments = 0
        self.events = 0
        self.errors: list[str] = []

    async def load(self, http: aiohttp.ClientSession) -> None:
        t0 = time.perf_counter()
        async with http.get(self.base + "/") as resp:
            body = await resp.read()
            if resp.status != 200:
                self.errors.append(f"/ {resp.status}")
        self.page_loads.append(time.perf_counter() - t0)
        self.page_bytes = len(body)

    async def one(self, http: aiohttp.ClientSession) -> None:
        await self.load(http)
        reload_at = time.monotonic() + RELOAD_EVERY
        async with http.get(self.base + "/api/v1/events") as resp:
            event = ""
            async for line in resp.content:
                text = line.decode().rstrip("\n")
                if text.startswith("event: "):
                    event = text[7:]
                elif text.startswith("data: ") and event == "change":
                    self.events += 1
                    names = json.loads(text[6:]).get("jobs") or []
                    if names:
                        url = f"{self.base}/fragment/jobs?names={','.join(names)}"
                        async with http.get(url) as frag:
                            await frag.read()
                            self.fragments += 1
                            if frag.status != 200:
                                self.errors.append(f"fragment {frag.status}")
                if time.monotonic() > reload_at:
                    await self.load(http)
                    reload_at = time.monotonic() + RELOAD_EVERY

    async def run(self, seconds: float) -> None:
        async with aiohttp.ClientSession() as http:
            tasks = [asyncio.create_task(self.one(http)) for _ in range(VIEWERS)]
            await asyncio.sleep(seconds)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await task


def delays(app: App, since: float) -> list[float]:
    """Start delays of the busy jobs' triggers that arrived after `since` (the app forgets)."""
    return [
        max(0.0, at - slot / 1000)
        for path, slot, at in app.records()
        if path.startswith("/busy/") and at >= since
    ]


def main() -> None:
    runtime.ensure()
    result: dict[str, Any] = {"jobs": JOBS, "busy_jobs_every_second": BUSY, "viewers": VIEWERS}
    app = App()  # a process of its own: the viewers here never delay its clock
    phases: dict[str, list[float]] = {"without": [], "with": []}
    rss: dict[str, list[float]] = {"without": [], "with": []}
    try:
        with workdir("page") as work, nats_server(work) as server:
            sc = runtime.RuntimeSidecar(work, "page", page_config(server.url, app.url), {})
            sc.start()
            try:
                sc.wait_ready(60)
                assert sc.proc is not None
                time.sleep(5)  # past start-up
                viewers = Viewers(sc.base_url)
                for _ in range(ROUNDS):
                    app.records()  # forget what came before
                    t0 = time.time()
                    time.sleep(PHASE)
                    phases["without"] += delays(app, t0 + 1)
                    rss["without"].append(rss_mib(sc.proc.pid)["VmRSS"])
                    t0 = time.time()
                    asyncio.run(viewers.run(PHASE))
                    phases["with"] += delays(app, t0 + 1)
                    rss["with"].append(rss_mib(sc.proc.pid)["VmRSS"])
                result["peak_rss_mib"] = rss_mib(sc.proc.pid)["VmHWM"]
            finally:
                sc.terminate(30)
    finally:
        app.stop()
    for name in ("without", "with"):
        result[f"start_delay_{name}_viewers"] = summary_ms(phases[name])
        result[f"rss_{name}_viewers_mib"] = max(rss[name])
    result["page_load_ms"] = summary_ms(viewers.page_loads)
    result["page_bytes"] = viewers.page_bytes
    result["fragments_fetched"] = viewers.fragments
    result["events_received"] = viewers.events
    result["viewer_errors"] = viewers.errors[:10]
    result["machine"] = machine()
    result["load_average_after"] = os.getloadavg()
    write_result("page", result)
    w, v = result["start_delay_without_viewers"], result["start_delay_with_viewers"]
    print(
        f"start delay p50/p99 without viewers {w['p50_ms']:.1f}/{w['p99_ms']:.1f} ms "
        f"(n={w['n']}), with {VIEWERS} viewers {v['p50_ms']:.1f}/{v['p99_ms']:.1f} ms "
        f"(n={v['n']}); RSS {result['rss_without_viewers_mib']:.1f} -> "
        f"{result['rss_with_viewers_mib']:.1f} MiB (peak {result['peak_rss_mib']:.1f}); "
        f"page of {JOBS} jobs {result['page_bytes'] / 1024:.0f} KiB in "
        f"{result['page_load_ms']['p50_ms']:.0f} ms p50 "
        f"({result['page_load_ms']['max_ms']:.0f} max, n={result['page_load_ms']['n']}); "
        f"{viewers.events} events, {viewers.fragments} row fetches; errors {viewers.errors[:3]}; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    if viewers.errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
