"""A burst at one instant (issue 49): 10,000 jobs due at the same second on three
sidecars.

``python -m bench.burst [JOBS] [--candidates K [--fallback D]] [--no-scrapes]``
(``make bench.jobs``). Real processes: a
nats-server, three sidecars of the runtime-only venv, the bench app
(``bench.app``) noting when each trigger arrives. JOBS jobs of the state bucket
(default 10,000), every one due once at the same instant T (``S M H * * *``,
``jitter: 0``), are written before the sidecars start; once every sidecar runs
them all, T comes. Then: every slot ran once (doubles and misses counted from
the app's records), the time from T to the first, median and last trigger;
the claim phase of each sidecar (``bench.claimphase``: its ``/metrics``
scraped every 100 ms from T until it has decided, won or lost, all JOBS
claims) and the claims per second per sidecar over it, against the raw nats-py
publisher (``bench.raw_publish``: claims with message ids, 100 at a time,
flat out) on the same server in the same run. The older figure, JOBS over T
to the last trigger, is kept as ``jobs_per_s_to_last_trigger``: it counts the
runs' time as well as the claims'; ``runs_per_sidecar`` counts the triggers
each sidecar sent (the app counts ``X-Anarchon-Instance``). Every slot the app never saw must have a
fate record in the stream (``bench.fates``): ``missed_fates`` counts them by
kind, ``missed_without_record`` those with none.

The claim phase's scrapes cost what they measure: each scrape of a sidecar
with 10,000 jobs that ran renders them all (at most once a second, reused
meanwhile: sidecar/obs/exposition.py), about a fifth of its CPU in the burst
and nearly two seconds of its last trigger here. ``--no-scrapes`` measures no
claim phase and leaves the sidecars alone: the time to the last trigger
without the bench's own load (``burst-unscraped.json``).

With ``--candidates K`` every job has ``claim: {candidates: K, fallback: D}``
(docs/CONFIG.md, "Claim candidates"; D 1s unless given): K sidecars claim each
slot at its time, the others only if they have not seen its run by D; a slot
left so is settled for the claim phase, not decided (``deferred_seen``).

Writes ``bench/results/burst.json`` (``burst-candidates-K.json`` with
candidates). With ``BURST_PROFILE=FILE`` the first sidecar
runs under cProfile over the window whose CPU is measured (from just before the
instant to the last trigger, not its start) and writes its profile to FILE
when it stops (cProfile counts every call of a small function, a generator's
steps among them, at several times its cost: it says what is called, not what
it costs); with ``BURST_SPY=FILE`` ``py-spy`` (found on PATH, not a dependency
of this project) samples the first sidecar from half a second before the
instant for ``BURST_SPY_S`` seconds (15) and writes its stacks, collapsed, to
FILE; with ``BURST_LOGS=DIR`` the sidecars' logs are copied to DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import runtime
from bench.claimphase import ClaimPhase
from bench.common import cpu_seconds, machine, nats_server, workdir, write_result
from bench.fates import fates, without_record
from bench.fleet import App
from bench.jobs_scale import fill_with, taken_up
from sidecar.config.load import parse_config
from sidecar.store.state import state_spec
from sidecar.store.stream import stream_spec
from tests.support import ROOT, sidecar_env

JOBS = 10_000
SIDECARS = 3
# From the last sidecar's take-up to T: the fleet settles.
LEAD = 10.0
# Each missed slot's fate record is waited for this long after the claim phase.
FATES_WAIT = 60.0
# The claim phase is scraped from this long before T until this long after.
SCRAPE_FROM = 1.0
SCRAPE_UNTIL = 120.0
# py-spy's collapsed stacks (BURST_SPY).
RAW = ("--format", "raw", "-o")


def rank_correlation(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation of two equally long lists (no ties expected)."""
    if len(xs) < 2:
        return float("nan")

    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        for rank, i in enumerate(order):
            out[i] = float(rank)
        return out

    return statistics.correlation(ranks(xs), ranks(ys))


def pid_of(proc: runtime.RuntimeSidecar) -> int:
    assert proc.proc is not None, "the sidecar was not started"
    return proc.proc.pid


def spy_on(pid: int, out: str) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` into `out` (``BURST_SPY``, the module's doc)."""
    spy = shutil.which("py-spy")
    assert spy is not None, "BURST_SPY needs py-spy on PATH (pip install py-spy, anywhere)"
    seconds = os.environ.get("BURST_SPY_S", "15")
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--duration", seconds, "--rate", "250", *RAW, out],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.burst")
    parser.add_argument("jobs", type=int, nargs="?", default=JOBS)
    parser.add_argument("--candidates", type=int, default=0)
    parser.add_argument("--fallback", default="1s")
    parser.add_argument(
        "--no-scrapes",
        action="store_true",
        help="measure no claim phase: the sidecars' /metrics is not scraped in the burst",
    )
    args = parser.parse_args()
    jobs = args.jobs
    runtime.ensure()
    result: dict[str, Any] = {
        "jobs": jobs,
        "sidecars": SIDECARS,
        "candidates": args.candidates,
        "scraped": not args.no_scrapes,
    }
    load_before = os.getloadavg()
    with workdir("burst") as work, nats_server(work) as server:
        app = App()
        procs = []
        try:
            config: dict[str, Any] = {
                "nats": {"servers": [server.url]},
                "target": {"url": app.url},
                "bucket_jobs": {"max_jobs": jobs},
                "jobs": [{"name": "keep", "schedule": "0 0 1 1 *"}],
            }
            if args.candidates:
                claim = {"candidates": args.candidates, "fallback": args.fallback}
                config["defaults"] = {"claim": claim}
                result["fallback"] = args.fallback
            # T: far enough ahead for the take-up (about 3 s a sidecar for 10,000).
            t = int(time.time()) + 60 + jobs // 1000
            at = datetime.fromtimestamp(t, UTC)
            spec = {
                "schedule": f"{at.second} {at.minute} {at.hour} * * *",
                "timezone": "UTC",
                "jitter": "0ms",
            }
            asyncio.run(fill_with(server, {**config, "instance_id": "x"}, jobs, spec))
            bucket = state_spec(parse_config(config, {})).bucket
            for i in range(SIDECARS):
                cfg = {**config, "instance_id": f"b{i}"}
                procs.append(runtime.RuntimeSidecar(work, f"b{i}", cfg, {}))
            if profile := os.environ.get("BURST_PROFILE"):
                procs[0].profile = Path(profile).resolve()
                procs[0].profile_window = True
            for p in procs:
                p.start()
            for p in procs:
                p.wait_ready(120)
            for i in range(SIDECARS):
                while asyncio.run(taken_up(server, bucket, f"b{i}")) < jobs:
                    assert time.time() < t - LEAD, "not taken up before T"
                    time.sleep(0.5)
            phases = [
                ClaimPhase(p.base_url + "/metrics", jobs, t - SCRAPE_FROM, t + SCRAPE_UNTIL)
                for p in procs
                if not args.no_scrapes
            ]
            for phase in phases:
                phase.start()
            # Each sidecar's CPU from before the instant to the last trigger: the
            # burst's own cost, whatever the machine's load did to its time.
            if procs[0].profile is not None:
                procs[0].profile_on()
            spy = None
            if out := os.environ.get("BURST_SPY"):
                while time.time() < t - 0.5:
                    time.sleep(0.01)
                spy = spy_on(pid_of(procs[0]), str(Path(out).resolve()))
            cpu0 = [cpu_seconds(pid_of(p)) for p in procs]
            while time.time() < t + 5:
                time.sleep(0.5)
            records: list[tuple[str, int, float]] = []
            deadline = time.time() + 120
            while time.time() < deadline:
                records += app.records()
                if len({p for p, _, _ in records}) >= jobs:
                    break
                time.sleep(1)
            records += app.records()
            cpu = [cpu_seconds(pid_of(p)) - c for p, c in zip(procs, cpu0, strict=True)]
            by_instance = app.instances()
            if procs[0].profile is not None:
                procs[0].profile_off()
            if spy is not None:
                spy.wait(60)
            # A loser's claim may be decided after the winner's trigger: the scrapes
            # go on until every slot is settled (or SCRAPE_UNTIL).
            for phase in phases:
                phase.join(max(0.0, t + SCRAPE_UNTIL - time.time()) + 15)
            # The slots nobody ran, and what the stream says of each (bench.fates):
            # read while the sidecars run, which record them after slot + max_late.
            seen = {p for p, _, _ in records}
            missed = [f"tenant-{i:06d}" for i in range(jobs) if f"/tenants/{i}/sync" not in seen]
            cron = stream_spec(parse_config(config, {}))
            until = time.time() + FATES_WAIT
            while True:
                missed_fates = asyncio.run(
                    fates(server.url, cron.name, cron.prefix, missed, t * 1000)
                )
                if not without_record(missed_fates) or time.time() > until:
                    break
                time.sleep(2)
        finally:
            for p in procs:
                p.terminate(60)
            if keep := os.environ.get("BURST_LOGS"):  # the sidecars' logs, kept
                for p in procs:
                    shutil.copy(p.log_path, Path(keep) / p.log_path.name)
            app.stop()
        raw = subprocess.run(
            [runtime.python(), "-m", "bench.raw_publish", server.url, "100", "5"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=sidecar_env(),
            check=True,
        )
        raw_rate = json.loads(raw.stdout)["publishes"] / json.loads(raw.stdout)["seconds"]
    per_path = Counter(p for p, _, _ in records)
    arrivals = sorted(a - t for _, _, a in records)
    # Whether the same tenants come last at every burst: the rank correlation of a
    # job's number (the order every sidecar armed the jobs in) and its trigger's time.
    first_at: dict[int, float] = {}
    for path, _, a in records:
        number = int(path.split("/")[2])
        first_at[number] = min(a, first_at.get(number, a))
    order_correlation = rank_correlation(sorted(first_at), [first_at[n] for n in sorted(first_at)])
    last = arrivals[-1] if arrivals else float("nan")
    to_last = jobs / last if arrivals else 0.0
    sidecars = [phase.result(t) for phase in phases]
    took = [s["claim_phase_s"] for s in sidecars]
    # The fleet's claim phase ends with its slowest sidecar's; the rate per sidecar
    # is the claims each decided (JOBS when none was skipped) over that.
    slowest = None if None in took or not took else max(took)
    claims = statistics.mean(s.get("decided", 0) for s in sidecars) if sidecars else 0
    rate = claims / slowest if slowest else None
    result.update(
        {
            "ran": len(per_path),
            "doubles": sum(n - 1 for n in per_path.values() if n > 1),
            "missed": jobs - len(per_path),
            "missed_fates": dict(missed_fates),
            "missed_without_record": without_record(missed_fates),
            "first_s": arrivals[0] if arrivals else None,
            "median_s": statistics.median(arrivals) if arrivals else None,
            "last_s": last,
            "claim_phase_s": slowest,
            "claims_per_s_per_sidecar": rate,
            "raw_publishes_per_s": raw_rate,
            "claim_rate_ratio_vs_raw": rate / raw_rate if rate and raw_rate else None,
            "claim_phase_per_sidecar": sidecars,
            "jobs_per_s_to_last_trigger": to_last,
            "to_last_trigger_ratio_vs_raw": to_last / raw_rate if raw_rate else None,
            "sidecar_cpu_s": cpu,
            "job_number_vs_trigger_time_spearman": order_correlation,
            # Triggers sent by each sidecar: how evenly the burst's runs spread.
            "runs_per_sidecar": [by_instance.get(f"b{i}", 0) for i in range(SIDECARS)],
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "machine": machine(),
        }
    )
    print(
        f"{jobs} jobs due at one instant on {SIDECARS} sidecars: ran {result['ran']}, "
        f"doubles {result['doubles']}, missed {result['missed']} (their fates "
        f"{result['missed_fates']}: {result['missed_without_record']} without a record); "
        f"first trigger "
        f"{result['first_s']:.2f} s after the instant, median {result['median_s']:.2f} s, "
        f"last {last:.2f} s",
        flush=True,
    )
    if rate is not None:
        print(
            f"claim phase {slowest:.2f} s (each sidecar's last claim decided at "
            f"{', '.join(f'{x:.2f}' for x in took if x is not None)} s; claims decided "
            f"{[s['decided'] for s in sidecars]}, skipped {[s['skipped'] for s in sidecars]}, "
            f"in error {[s['claim_errors'] for s in sidecars]}, left to candidates and seen "
            f"{[s.get('deferred_seen', 0) for s in sidecars]}): "
            f"claims/s per sidecar {rate:.0f} = {result['claim_rate_ratio_vs_raw']:.2f}x "
            f"the raw publisher's {raw_rate:.0f}",
            flush=True,
        )
    else:
        print(f"claim phase: not measured ({sidecars})", flush=True)
    print(
        f"jobs/s to the last trigger (claims and runs) {to_last:.0f} = "
        f"{result['to_last_trigger_ratio_vs_raw']:.3f}x the raw publisher's; sidecars' CPU "
        f"in the burst {', '.join(f'{c:.1f}' for c in cpu)} s, runs "
        f"{', '.join(str(n) for n in result['runs_per_sidecar'])}; a job's number against its "
        f"trigger's time: rank correlation {order_correlation:.2f}; load "
        f"{load_before[0]:.1f} before, {result['load_after'][0]:.1f} after",
        flush=True,
    )
    name = f"burst-candidates-{args.candidates}" if args.candidates else "burst"
    write_result(name + ("-unscraped" if args.no_scrapes else ""), result)


if __name__ == "__main__":
    main()
