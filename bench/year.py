"""A year of history: the stream at its limits, and the state bucket over 100,000 leased runs.

``python -m bench.year [RUNS_PER_JOB ...]`` (default 1 100 1000; not part of
``make bench``'s default six minutes: ``make bench-year``).

Part 1: 1,000 jobs, ``history_size`` 1,000. The stream is filled with
finished runs (a claim and a result each, bodies as the wire format) at each
size, on a fresh nats-server: 1,000 messages (500 jobs with one run, the
baseline), then 1,000 jobs x R runs for each R given (R = 1,000: two million
messages, the stream at its per-subject limits). At each size, as whole
processes from the runtime-only venv, the median of 3 and the peak RSS:
``history JOB --json --limit 1000``, ``last-run JOB --json``, ``status
--json`` (1,000 jobs), and the start of a sidecar with the 1,000 jobs until
``/readyz`` says ready. The fill uses core publishes (no ack each), then
waits until the stream holds them all.

Part 2: 100,000 runs with leases on a fresh state bucket, through the
sidecar's own ``Keys`` (create with a TTL, delete by revision, as ``Lease``
does), 200 at a time; every 100th run is never released (its runner
"died": the key expires after 2 s). Every 10,000 runs: the live keys and the
bucket stream's messages; then again after the markers' TTL. Bounded means:
the live keys never exceed the runs in flight plus the unreleased ones of
the last lease_ttl, and the messages never exceed the runs of the last two
marker TTLs (a delete marker turns into a MaxAge marker after the TTL, and
that one expires after another), whatever the number of runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import nats

from bench import runtime
from bench.common import machine, workdir, write_result
from sidecar.core.clock import rfc3339
from sidecar.store.bucketcheck import StateSpec
from sidecar.store.kv import Keys
from sidecar.store.state import ensure_bucket
from sidecar.store.stream import StreamSpec, ensure_stream
from tests.support import NatsServer, bucket_keys, free_port, sidecar_env, write_config

JOBS = 1000
HISTORY = 1000
PREFIX = "cron."
JOB = "job-0007"
REPEATS = 3
# BENCH_YEAR_LEASED_RUNS for a quick trial.
LEASED_RUNS = int(os.environ.get("BENCH_YEAR_LEASED_RUNS", "100000"))
IN_FLIGHT = 200


def job_name(i: int) -> str:
    return f"job-{i:04d}"


def config(url: str) -> dict[str, Any]:
    return {
        "instance_id": "bench",
        "nats": {"servers": [url], "history_size": HISTORY},
        "target": {"url": "http://127.0.0.1:9"},
        "metrics": {"listen": f"127.0.0.1:{free_port()}"},
        "jobs": [{"name": job_name(i), "schedule": "0 3 * * *"} for i in range(JOBS)],
    }


def run_bodies(job: str, slot: int, i: int) -> tuple[bytes, bytes]:
    """A finished run's claim and result, as the wire format has them."""
    token = f"{i:016x}{slot:016x}"
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
        **claim,
        "status": "succeeded" if ok else "failed",
        "started_at": rfc3339(at + 0.41),
        "finished_at": rfc3339(at + 0.53),
        "duration_ms": 120,
        "http_status": 200 if ok else 500,
        "error": None if ok else "HTTP 500: boom",
    }
    del result["scheduled_at"], result["claimed_at"]
    return json.dumps(claim).encode(), json.dumps(result).encode()


async def fill(url: str, jobs: int, runs: int) -> dict[str, Any]:
    """Claims and results of `runs` finished runs of each of `jobs` jobs."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await ensure_stream(js, StreamSpec("CRON", PREFIX, 300.0, HISTORY, None))
        started = time.monotonic()
        sent = 0
        # Hourly runs that ended an hour ago (a year of a daily job is 365 runs;
        # the stream keeps the newest 1,000 of each subject whatever the schedule).
        first = (int(time.time()) // 3600 - runs) * 3_600_000
        for i in range(runs):
            for j in range(jobs):
                claim, result = run_bodies(job_name(j), first + i * 3_600_000, i)
                await nc.publish(f"{PREFIX}{job_name(j)}.claims", claim)
                await nc.publish(f"{PREFIX}{job_name(j)}.results", result)
                sent += 2
                if sent % 10_000 == 0:
                    await nc.flush()
        await nc.flush()
        expected = jobs * runs * 2
        deadline = time.monotonic() + 600
        while True:
            info = await js.stream_info("CRON")
            if info.state.messages >= expected or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        return {
            "messages": info.state.messages,
            "expected": expected,
            "bytes": info.state.bytes,
            "fill_s": round(time.monotonic() - started, 1),
        }
    finally:
        await nc.close()


def measured(argv: list[str], cwd: Path) -> dict[str, Any]:
    """Median wall time of REPEATS runs and the largest peak RSS, of one command."""
    walls, peaks = [], []
    for _ in range(REPEATS):
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=sidecar_env(), cwd=cwd
        )
        # Read the pipes while waiting, then reap with wait4 for the child's own rusage.
        assert proc.stdout is not None and proc.stderr is not None
        out = proc.stdout.read()  # history's output is small next to the pipe reads
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        walls.append(time.monotonic() - started)
        peaks.append(usage.ru_maxrss / 1024)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[1:3]} exited {proc.returncode}: {err.decode()[-2000:]}")
    return {
        "s": round(statistics.median(walls), 3),
        "max_s": round(max(walls), 3),
        "rss_mib": round(max(peaks), 1),
        "out_bytes": len(out),
    }


def sidecar_start(exe: str, cfg: Path, port: int, cwd: Path) -> dict[str, Any]:
    """Seconds from exec to /readyz 200, and the RSS then (median and max of REPEATS)."""
    walls, peaks = [], []
    for _ in range(REPEATS):
        started = time.monotonic()
        proc = subprocess.Popen(
            [exe, "run", "-c", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=sidecar_env(),
            cwd=cwd,
        )
        try:
            deadline = started + 300
            while True:
                try:
                    url = f"http://127.0.0.1:{port}/readyz"
                    with urllib.request.urlopen(url, timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the sidecar did not become ready")
                time.sleep(0.02)
            walls.append(time.monotonic() - started)
            with open(f"/proc/{proc.pid}/status") as f:
                hwm = next(line for line in f if line.startswith("VmHWM"))
            peaks.append(int(hwm.split()[1]) / 1024)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    return {"s": round(statistics.median(walls), 3), "rss_mib": round(max(peaks), 1)}


def server_rss(server: NatsServer) -> float:
    assert server.proc is not None
    with open(f"/proc/{server.proc.pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS"))
    return round(int(line.split()[1]) / 1024, 1)


def one_size(label: str, jobs: int, runs: int, work: Path) -> dict[str, Any]:
    server = NatsServer(work / label / "nats")
    server.start()
    try:
        stream = asyncio.run(fill(server.url, jobs, runs))
        cfg = config(server.url)
        port = int(cfg["metrics"]["listen"].rsplit(":", 1)[1])
        path = write_config(work / f"{label}.yaml", cfg)
        exe = str(runtime.ensure() / "bin" / "anarchon-sidecar")
        cli = [exe]
        row = {
            "label": label,
            "jobs_with_runs": jobs,
            "runs_per_job": runs,
            **stream,
            "history": measured(
                [*cli, "history", JOB, "-c", str(path), "--json", "--limit", "1000"], work
            ),
            "last_run": measured([*cli, "last-run", JOB, "-c", str(path), "--json"], work),
            "status": measured([*cli, "status", "-c", str(path), "--json"], work),
            "start": sidecar_start(exe, path, port, work),
            "nats_server_rss_mib": server_rss(server),
        }
        print(json.dumps(row), flush=True)
        return row
    finally:
        server.stop()


async def leased_runs(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        bucket = await ensure_bucket(js, StateSpec("CRON_STATE", 1, 60.0))
        assert bucket.ttl, bucket.ttl_problem
        keys = Keys(bucket)
        started = time.monotonic()
        samples = []

        async def one(n: int) -> None:
            key = f"run.{job_name(n % JOBS)}.{1_900_000_000_000 + n * 1000}"
            died = n % 100 == 0
            value = {"slot": n, "attempt": 1, "token": f"{n:032x}", "instance": "bench"}
            revision = await keys.create(key, value, 2.0 if died else 30.0)
            if not died:
                await keys.delete(key, revision)

        async def state() -> dict[str, Any]:
            info = await js.stream_info(bucket.spec.stream)
            live = len(await bucket_keys(bucket.kv))  # not kv.keys(): its early end
            return {"live_keys": live, "messages": info.state.messages}

        for start in range(0, LEASED_RUNS, IN_FLIGHT):
            await asyncio.gather(*(one(n) for n in range(start, start + IN_FLIGHT)))
            done = start + IN_FLIGHT
            if done % max(IN_FLIGHT, LEASED_RUNS // 10) == 0:
                samples.append(
                    {"runs": done, "s": round(time.monotonic() - started, 1), **await state()}
                )
                print(json.dumps(samples[-1]), flush=True)
        took = time.monotonic() - started
        # A delete marker expires into a MaxAge marker after the markers' TTL,
        # which expires after it again: two TTLs and the bucket is empty.
        await asyncio.sleep(bucket.spec.marker_ttl + 5)
        one_ttl = await state()
        await asyncio.sleep(bucket.spec.marker_ttl)
        after = await state()
        return {
            "runs": LEASED_RUNS,
            "unreleased": LEASED_RUNS // 100,
            "runs_per_s": round(LEASED_RUNS / took),
            "samples": samples,
            "after_one_marker_ttl": one_ttl,
            "after_two_marker_ttls": after,
            "max_live_keys": max(s["live_keys"] for s in samples),
            "max_messages": max(s["messages"] for s in samples),
        }
    finally:
        await nc.close()


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1, 100, 1000]
    rows = []
    with workdir("year") as work:
        rows.append(one_size("1k", 500, 1, work))
        for runs in sizes:
            if runs > 1:
                rows.append(one_size(f"{runs}x{JOBS}", JOBS, runs, work))
        server = NatsServer(work / "leases" / "nats")
        server.start()
        try:
            leases = asyncio.run(leased_runs(server.url))
        finally:
            server.stop()
    path = write_result("year", {"machine": machine(), "sizes": rows, "leases": leases})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
