"""History: reading 1,000 runs against a raw read of the same messages.

The stream holds 1,000 runs of the job ``hist`` (a claim and a result each,
2,000 messages, bodies as the wire format of sidecar/core/wire.py) and 1,000 of another job.
Interleaved, in one process on one connection:
- sidecar: ``runs.read_history`` (stream info for the count, an ordered
  consumer on ``cron.hist.*``, the join of claims and results);
- raw: a plain nats-py ordered consumer on the same subjects that only
  collects the 2,000 messages (no parsing).
And as whole processes: ``anarchon-sidecar history hist --json --limit 1000``
against ``python -m bench.raw_history`` (imports nats, connects, the same raw
read), wall time from exec to exit.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from bench import runtime
from bench.common import machine, nats_server, ratio, workdir, write_result
from sidecar.core.clock import rfc3339
from sidecar.run.claim import MSG_ID
from sidecar.store.runs import read_history
from sidecar.store.stream import StreamSpec, ensure_stream
from tests.support import ROOT, sidecar_env, write_config

STREAM = "CRON"
PREFIX = "cron."
JOB = "hist"
RUNS = 1000
# In the past: `history` leaves out claims for slots beyond now + duplicate_window
# (sidecar/core/bounds.py: forged, or from a clock far off).
SLOT0 = 1_700_000_000_000
REPEATS = 15
CLI_REPEATS = 7


def run_bodies(job: str, i: int) -> tuple[bytes, bytes]:
    slot = SLOT0 + i * 60_000
    token = f"{i:032x}"
    at = slot / 1000
    claim = {
        "job": job,
        "slot": slot,
        "token": token,
        "instance": f"web-{i % 3}",
        "scheduled_at": rfc3339(at),
        "claimed_at": rfc3339(at + 0.4),
        "manual": False,
    }
    ok = i % 10 != 0
    result = {
        "job": job,
        "slot": slot,
        "token": token,
        "instance": f"web-{i % 3}",
        "status": "succeeded" if ok else "failed",
        "started_at": rfc3339(at + 0.41),
        "finished_at": rfc3339(at + 0.53),
        "duration_ms": 120,
        "http_status": 200 if ok else 500,
        "error": None if ok else "HTTP 500: boom",
        "manual": False,
    }
    return json.dumps(claim).encode(), json.dumps(result).encode()


async def populate(js: JetStreamContext) -> None:
    await ensure_stream(js, StreamSpec(STREAM, PREFIX, 300.0, RUNS, None))
    for job in (JOB, "other"):
        for start in range(0, RUNS, 100):
            pubs = []
            for i in range(start, start + 100):
                claim, result = run_bodies(job, i)
                pubs.append(
                    js.publish(
                        f"{PREFIX}{job}.claims", claim, headers={MSG_ID: f"{job}:{SLOT0 + i}"}
                    )
                )
                pubs.append(js.publish(f"{PREFIX}{job}.results", result))
            await asyncio.gather(*pubs)


async def raw_read(js: JetStreamContext) -> list[tuple[str, bytes]]:
    """A plain ordered consumer on the job's subjects until nothing is pending."""
    out: list[tuple[str, bytes]] = []
    done = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Msg) -> None:
        out.append((msg.subject, msg.data))
        if msg.metadata.num_pending == 0 and not done.done():
            done.set_result(None)

    sub = await js.subscribe(
        f"{PREFIX}{JOB}.*",
        stream=STREAM,
        cb=on_msg,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
    )
    try:
        await asyncio.wait_for(done, 10)
    finally:
        await sub.unsubscribe()
    return out


async def in_process(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await populate(js)
    times: dict[str, list[float]] = {"sidecar": [], "raw": []}
    try:
        for rep in range(REPEATS + 2):
            for kind in ("sidecar", "raw") if rep % 2 else ("raw", "sidecar"):
                t0 = time.perf_counter()
                if kind == "sidecar":
                    hist = await read_history(js, STREAM, PREFIX, JOB)
                    n = len(hist.runs)
                else:
                    n = len(await raw_read(js)) // 2
                t = time.perf_counter() - t0
                assert n == RUNS, (kind, n)
                if rep >= 2:  # two warm-up rounds
                    times[kind].append(t)
    finally:
        await nc.close()
    out: dict[str, Any] = {k: statistics.median(v) * 1000 for k, v in times.items()}
    out["ratio"] = ratio(out["sidecar"], out["raw"])
    return {"median_ms": out, "repeats": REPEATS}


def processes(url: str, work: Path) -> dict[str, Any]:
    cfg = write_config(
        work / "history.yaml",
        {
            "nats": {"servers": [url]},
            "target": {"url": "http://127.0.0.1:9"},
            "jobs": [{"name": JOB, "schedule": "* * * * *"}],
        },
    )
    history = ["history", JOB, "-c", str(cfg), "--json", "--limit", str(RUNS)]
    # Both in the runtime-only venv; the sidecar's script outside the source tree.
    venv = runtime.ensure()
    commands = {
        "sidecar": [str(venv / "bin" / "anarchon-sidecar"), *history],
        "raw": [runtime.python(), "-m", "bench.raw_history", url, STREAM, f"{PREFIX}{JOB}.*"],
    }
    cwd = {"sidecar": work, "raw": ROOT}
    times: dict[str, list[float]] = {k: [] for k in commands}
    for rep in range(CLI_REPEATS + 1):
        for kind in commands if rep % 2 else reversed(list(commands)):
            t0 = time.perf_counter()
            out = subprocess.run(
                commands[kind], capture_output=True, text=True, env=sidecar_env(), cwd=cwd[kind]
            )
            t = time.perf_counter() - t0
            assert out.returncode == 0, out.stderr
            lines = out.stdout.strip().splitlines()
            expected = RUNS if kind == "sidecar" else 1
            assert len(lines) == expected, (kind, out.stdout[-300:], out.stderr[-300:])
            if rep >= 1:
                times[kind].append(t)
    res: dict[str, Any] = {k: statistics.median(v) * 1000 for k, v in times.items()}
    res["ratio"] = ratio(res["sidecar"], res["raw"])
    return {"median_ms": res, "repeats": CLI_REPEATS}


def main() -> None:
    with workdir("history") as work, nats_server(work) as server:
        result = {"in_process": asyncio.run(in_process(server.url))}
        result["cli"] = processes(server.url, work)
    result["runs"] = RUNS
    result["machine"] = machine()
    write_result("history", result)
    ip, cli = result["in_process"]["median_ms"], result["cli"]["median_ms"]
    print(
        f"history of {RUNS} runs: read_history {ip['sidecar']:.1f} ms vs raw ordered consumer "
        f"{ip['raw']:.1f} ms ({ip['ratio']:.2f}x); CLI {cli['sidecar']:.0f} ms vs raw process "
        f"{cli['raw']:.0f} ms ({cli['ratio']:.2f}x)"
    )


if __name__ == "__main__":
    main()
