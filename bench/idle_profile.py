"""Where the idle start delay goes: one instrumented sidecar, a raw client beside it.

``python -m bench.idle_profile [SECONDS]``. A nats-server and ``bench.app`` in
processes of their own; in this process a real ``Daemon`` with one job every
second at jitter 0, its steps timestamped (wall clock) by thin wrappers: the
wake-up, the claim's publish and ack, the trigger task's start, the
connection to the app; the app notes the request's first bytes. Half a second
after each slot the raw client (``bench.raw_trigger``, a process of its own)
does the same work with nothing of ours: a timer, one ``js.publish`` with a
msg id, one POST over a fresh connection. Prints the median of each step and
writes ``bench/results/idle_profile.json``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

from nats.js import JetStreamContext

from bench.common import machine, nats_server, summary_ms, workdir, write_result
from bench.fleet import App
from sidecar.cli.daemon import Daemon
from sidecar.config.load import Secrets, parse_config
from sidecar.run import trigger as trigger_module
from sidecar.run.claim import Claimer
from sidecar.run.trigger import Trigger
from tests.support import ROOT, free_port, sidecar_env

STEPS = (
    ("timer", "slot", "wake"),
    ("claim prepared", "wake", "publish"),
    ("publish to ack", "publish", "ack"),
    ("decided", "ack", "claimed"),
    ("run task started", "claimed", "fire"),
    ("request built, connecting", "fire", "connect"),
    ("connected", "connect", "connected"),
    ("sent, first bytes at the app", "connected", "arrival"),
)


def instrument(marks: dict[int, dict[str, float]]) -> None:
    """Wrap the steps of one slot's path; each records time.time() under the slot."""
    current: dict[str, int] = {}

    def mark(slot: int, name: str) -> None:
        marks[slot].setdefault(name, time.time())

    sleep_until = Daemon.sleep_until

    async def timed_sleep(self: Daemon, wall: float) -> bool:
        stopped = await sleep_until(self, wall)
        mark(round(wall * 1000), "wake")
        return stopped

    claim = Claimer.claim

    async def timed_claim(self: Claimer, job: str, slot: int, *args: Any, **kw: Any) -> Any:
        result = await claim(self, job, slot, *args, **kw)
        mark(slot, "claimed")
        return result

    publish = JetStreamContext.publish

    async def timed_publish(self: JetStreamContext, subject: str, *args: Any, **kw: Any) -> Any:
        msg_id = (kw.get("headers") or {}).get("Nats-Msg-Id", "")
        slot = int(msg_id.rsplit(":", 1)[1]) if subject.endswith(".claims") else 0
        if slot:
            mark(slot, "publish")
        ack = await publish(self, subject, *args, **kw)
        if slot:
            mark(slot, "ack")
        return ack

    fire = Trigger.fire

    async def timed_fire(self: Trigger, job: Any, slot: int, *args: Any, **kw: Any) -> Any:
        mark(slot, "fire")
        current["slot"] = slot
        return await fire(self, job, slot, *args, **kw)

    open_connection = asyncio.open_connection

    async def timed_open_connection(*args: Any, **kw: Any) -> Any:
        slot = current.get("slot", 0)
        mark(slot, "connect")
        conn = await open_connection(*args, **kw)
        mark(slot, "connected")
        return conn

    Daemon.sleep_until = timed_sleep  # type: ignore[method-assign]
    Claimer.claim = timed_claim  # type: ignore[method-assign]
    JetStreamContext.publish = timed_publish  # type: ignore[method-assign]
    Trigger.fire = timed_fire  # type: ignore[method-assign]
    trigger_module.asyncio.open_connection = timed_open_connection  # type: ignore[attr-defined]


async def run_daemon(url: str, app_url: str, seconds: float) -> None:
    config = parse_config(
        {
            "instance_id": "profiled",
            "nats": {"servers": [url]},
            "metrics": {"listen": f"127.0.0.1:{free_port()}"},
            "target": {"url": app_url},
            "jobs": [
                {
                    "name": "idle",
                    "schedule": "* * * * * *",
                    "jitter": 0,
                    "max_late": "5s",
                    "request": {"path": "/prof/idle"},
                }
            ],
        },
        {},
    )
    daemon = Daemon(config, Secrets())
    task = asyncio.create_task(daemon.run())
    await asyncio.sleep(seconds)
    daemon.stop()
    await task


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    marks: dict[int, dict[str, float]] = defaultdict(dict)
    instrument(marks)
    app = App()
    try:
        with workdir("idle") as work, nats_server(work) as server:
            raw = subprocess.Popen(
                [sys.executable, "-m", "bench.raw_trigger", server.url, app.url, str(seconds)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env=sidecar_env(),
            )
            asyncio.run(run_daemon(server.url, app.url, seconds))
            raw_out, _ = raw.communicate(timeout=60)
            records = app.records()
    finally:
        app.stop()
    raw_marks: dict[str, dict[str, float]] = json.loads(raw_out)
    arrivals = {(path, slot): at for path, slot, at in records}
    rows: list[dict[str, float]] = []
    for slot, m in sorted(marks.items()):
        at = arrivals.get(("/prof/idle", slot))
        if slot and at and all(k in m for _, _, k in STEPS[:-1]):
            rows.append({"slot": slot / 1000, **m, "arrival": at})
    rows = rows[3:]  # warm-up
    steps = {name: [(r[b] - r[a]) * 1000 for r in rows] for name, a, b in STEPS if rows}
    total = [(r["arrival"] - r["slot"]) * 1000 for r in rows]
    raw_rows = [
        {**v, "arrival": arrivals[("/raw", int(k))]}
        for k, v in raw_marks.items()
        if ("/raw", int(k)) in arrivals
    ][3:]
    raw_total = [(r["arrival"] - r["scheduled"]) * 1000 for r in raw_rows]
    raw_work = [(r["arrival"] - r["wake"]) * 1000 for r in raw_rows]
    raw_timer = [(r["wake"] - r["scheduled"]) * 1000 for r in raw_rows]
    result = {
        "n": len(rows),
        "steps_ms_p50": {k: statistics.median(v) for k, v in steps.items()},
        "steps_ms_mean": {k: statistics.fmean(v) for k, v in steps.items()},
        "start_delay": summary_ms([t / 1000 for t in total]),
        "raw_from_scheduled": summary_ms([t / 1000 for t in raw_total]),
        "raw_timer": summary_ms([t / 1000 for t in raw_timer]),
        "raw_publish_and_post": summary_ms([t / 1000 for t in raw_work]),
        "machine": machine(),
    }
    write_result("idle_profile", result)
    print(f"{'step':32} {'p50 ms':>8} {'mean ms':>8}")
    for name, _, _ in STEPS:
        print(f"{name:32} {result['steps_ms_p50'][name]:8.3f} {result['steps_ms_mean'][name]:8.3f}")
    for key in ("start_delay", "raw_from_scheduled", "raw_timer", "raw_publish_and_post"):
        s = result[key]
        print(f"{key:32} p50 {s['p50_ms']:.3f}  p99 {s['p99_ms']:.3f}  (n={s['n']})")


if __name__ == "__main__":
    main()
