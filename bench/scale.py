"""Scale: how the cost grows with the fleet (N sidecars) and with the jobs (J per sidecar).

``python -m bench.scale`` (``make bench.scale``). Real sidecar processes from the
runtime-only venv (``bench.runtime``) on one real nats-server, a real app
(``bench.app``) in a process of its own. Four parts, each optional:

- **fleet sweep** (``--fleets``, default 2,10,30,100) at 100 jobs per sidecar, and
  **jobs sweep** (``--jobs``, default 10,100,1000,10000) with 2 sidecars. The
  schedules make every minute two halves: in seconds 0-29 about 500 slots are
  due (16.7 a second; 10 jobs: every job every second, 10 a second), in
  seconds 30-59 none. A job of 100 fires 5 times a half-minute, one of 1,000
  every 2 minutes, one of 10,000 every 20 minutes: most jobs are not due most
  of the time, and the slots per second stay the same whatever the jobs.
  ``jitter: 0``, so the start delay is the request's arrival at the app minus
  the slot time. Per point: the first N-1 sidecars start at once (their time
  to ready, the machine's), the last one alone (the time to ready of a
  sidecar joining the fleet); then, at the next half-minute, a busy half
  (every slot's start delay, slots run and doubled, JetStream requests per
  slot counted on the server, every process's CPU, nats-server's CPU and
  messages in + out from its ``/varz``) and an idle half (20 s: every
  sidecar's CPU and context switches per second, the server's); after the
  idle window, still in the idle half, the raw client (``bench.raw_publish``,
  5 s flat out) on the same server: the baseline of the CPU ratio and, as the
  fleet grows, the machine's own degradation. RSS of every sidecar at the
  end. Machine load (``/proc/stat``: the share of both cores in use; load
  average) in every window.
- **idle cost** (``--idle-seconds``, default 60): one sidecar with 1,000 jobs of
  varied schedules (hourly, daily, weekly, monthly, in five time zones), none
  due in the window; its CPU over the window (nanoseconds, from schedstat) as
  a share of a core, and its context switches per second (each wait of the
  event loop that sleeps is one: the wake-ups).
- **variants** (``--variants``, default asyncio,uvloop,py3.13): the issue-14
  fleet (3 sidecars x 100 jobs every second at jitter 0, ``bench.fleet``) and
  the footprint with 1,000 jobs (``bench.footprint``), interleaved round by
  round for each variant: asyncio's loop on this Python (the default),
  ``ANARCHON_EVENT_LOOP=uvloop`` with the ``[uvloop]`` extra, and the plain
  install on another CPython where one is on the machine.

Writes ``bench/results/scale.json``; ``python -m bench.report --write`` draws
the curves into docs/ and the tables into docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from cronsim import CronSim

from bench import footprint, runtime
from bench.common import (
    cpu_precise,
    machine,
    machine_busy,
    machine_cpu,
    nats_server,
    pct,
    ratio,
    read_result,
    rss_mib,
    summary_ms,
    wakeups,
    workdir,
    write_result,
)
from bench.fleet import App, RequestCounter, raw_baseline, run_fleet, sleep_until
from tests.support import NatsServer

BUSY = 30  # seconds 0-29 of every minute: slots due; 30-59: none
PER_HALF = 500  # slots due in a busy half-minute (10 jobs: 300)
IDLE_WINDOW = 20.0
RAW_SECONDS = 5.0
BASE_JOBS, BASE_FLEET = 100, 2  # the sweeps cross at 2 sidecars x 100 jobs
WAVE = 10  # sidecars started at once


@dataclass(frozen=True)
class Plan:
    """One job's schedule: `seconds` of every `every`-th minute (at `offset`)."""

    seconds: tuple[int, ...]
    every: int = 1
    offset: int = 0

    @property
    def cron(self) -> str:
        sec = "0-29" if self.seconds == tuple(range(BUSY)) else ",".join(map(str, self.seconds))
        minute = "*" if self.every == 1 else f"{self.offset}/{self.every}"
        return f"{sec} {minute} * * * *"

    def due(self, minute: int) -> int:
        return len(self.seconds) if minute % self.every == self.offset else 0


def plans(jobs: int) -> list[Plan]:
    """About PER_HALF slots in seconds 0-29 of every minute, none in 30-59."""
    if jobs * BUSY <= PER_HALF:
        return [Plan(tuple(range(BUSY)))] * jobs
    if jobs <= PER_HALF:
        times = PER_HALF // jobs  # 100 jobs: 5 times a half-minute, 6 s apart
        step = BUSY // times
        return [Plan(tuple(i % step + step * t for t in range(times))) for i in range(jobs)]
    every = jobs // PER_HALF  # 1,000 jobs: every 2 minutes; 10,000: every 20
    assert 60 % every == 0, "the minute step must divide the hour"
    return [Plan((i % BUSY,), every, (i // BUSY) % every) for i in range(jobs)]


def scale_config(server: NatsServer, app: App, label: str, jobs: int) -> dict[str, Any]:
    return {
        "nats": {"servers": [server.url]},
        "target": {"url": app.url, "timeout": "10s"},
        "jobs": [
            {
                "name": f"{label}-{k:05d}",
                "schedule": plan.cron,
                "jitter": 0,
                "max_late": "5s",
                "request": {"path": f"/{label}/{k:05d}"},
            }
            for k, plan in enumerate(plans(jobs))
        ],
    }


def server_msgs(server: NatsServer) -> int:
    """Messages in + out of nats-server so far (its /varz)."""
    url = f"http://127.0.0.1:{server.monitor_port}/varz"
    with urllib.request.urlopen(url, timeout=5) as resp:
        varz = json.loads(resp.read())
    return int(varz["in_msgs"]) + int(varz["out_msgs"])


@dataclass
class Snap:
    at: float
    cpu: list[float]
    wakeups: list[int]
    server_cpu: float
    server_msgs: int
    machine: tuple[int, int]

    @classmethod
    def take(cls, pids: list[int], server: NatsServer) -> Snap:
        assert server.proc is not None
        return cls(
            time.monotonic(),
            [cpu_precise(p) for p in pids],
            [wakeups(p) for p in pids],
            cpu_precise(server.proc.pid),
            server_msgs(server),
            machine_cpu(),
        )

    def to(self, later: Snap) -> dict[str, Any]:
        secs = later.at - self.at
        cpu = [b - a for a, b in zip(self.cpu, later.cpu, strict=True)]
        wake = [(b - a) / secs for a, b in zip(self.wakeups, later.wakeups, strict=True)]
        return {
            "seconds": secs,
            "cpu_seconds": cpu,
            "cpu_share_mean": statistics.fmean(cpu) / secs,
            "cpu_share_max": max(cpu) / secs,
            "wakeups_per_second_mean": statistics.fmean(wake),
            "wakeups_per_second_max": max(wake),
            "server_cpu_seconds": later.server_cpu - self.server_cpu,
            "server_cpu_share": (later.server_cpu - self.server_cpu) / secs,
            "server_msgs": later.server_msgs - self.server_msgs,
            "machine_busy": machine_busy(self.machine, later.machine),
            "loadavg_1m": os.getloadavg()[0],
        }


def start_fleet(procs: list[runtime.RuntimeSidecar], timeout: float) -> dict[str, Any]:
    """The first N-1 in waves of WAVE at once (a rollout), then the last alone: time to ready
    (exec to /readyz 200) of each; the last one's is that of a sidecar joining the fleet."""
    together, last = procs[:-1], procs[-1]
    times: list[float] = []
    t_all = time.monotonic()
    for w in range(0, len(together), WAVE):
        wave = together[w : w + WAVE]
        t0 = time.monotonic()
        for p in wave:
            p.start()
        pending = set(range(len(wave)))
        while pending:
            for i in sorted(pending):
                p = wave[i]
                assert p.proc is not None and p.proc.poll() is None, p.log()
                if p.ready():
                    times.append(time.monotonic() - t0)
                    pending.discard(i)
            assert time.monotonic() - t0 < timeout, (
                f"{len(times)}/{len(together)} ready: a wave of {len(wave)} not ready in "
                f"{timeout:.0f} s"
            )
            time.sleep(0.02)
    fleet_s = time.monotonic() - t_all
    time.sleep(2)  # the fleet settles (presence, the bucket's watch)
    t1 = time.monotonic()
    last.start()
    while not last.ready():
        assert last.proc is not None and last.proc.poll() is None, last.log()
        assert time.monotonic() - t1 < timeout, "the last sidecar not ready"
        time.sleep(0.005)
    joined = time.monotonic() - t1
    times.sort()
    return {
        "ready_alone_s": joined,
        "ready_together_p50_s": pct(times, 50) if times else float("nan"),
        "ready_together_max_s": max(times) if times else float("nan"),
        "fleet_start_s": fleet_s,
    }


def stop_all(procs: list[runtime.RuntimeSidecar]) -> None:
    """SIGTERM to all at once (they leave the fleet's view), then wait; kill what is left."""
    for p in procs:
        if p.proc is not None and p.proc.poll() is None:
            p.proc.terminate()
    deadline = time.monotonic() + 60
    for p in procs:
        if p.proc is not None:
            try:
                p.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()


def run_point(
    work: Path, server: NatsServer, app: App, instances: int, jobs: int
) -> dict[str, Any]:
    """One (N, J) point: see the module's docstring."""
    label = f"n{instances}j{jobs}"
    config = scale_config(server, app, label, jobs)
    procs = [runtime.RuntimeSidecar(work, f"{label}-s{i}", config, {}) for i in range(instances)]
    counter = RequestCounter(server.url, label)
    out: dict[str, Any] = {"instances": instances, "jobs": jobs}
    try:
        out.update(start_fleet(procs, timeout=180))
        pids = [p.proc.pid for p in procs if p.proc]
        # The next half-minute boundary at least 1 s ahead.
        b = math.ceil((time.time() + 1.0) / BUSY) * BUSY
        busy_at = b if b % 60 == 0 else b + BUSY
        idle_at = busy_at + BUSY if busy_at == b else b

        def idle_window() -> None:
            sleep_until(idle_at + 2)
            s0 = Snap.take(pids, server)
            sleep_until(idle_at + 2 + IDLE_WINDOW)
            out["idle"] = s0.to(Snap.take(pids, server))
            out["raw"] = raw_baseline(server, 100, RAW_SECONDS)

        if idle_at < busy_at:
            idle_window()
        sleep_until(busy_at - 0.4)
        s0 = Snap.take(pids, server)
        counter.counting = True
        sleep_until(busy_at + BUSY + 1.5)
        s1 = Snap.take(pids, server)
        counter.counting = False
        out["busy"] = s0.to(s1)
        if idle_at > busy_at:
            idle_window()
        rss = [rss_mib(pid) for pid in pids]
        out["rss_mib_mean"] = statistics.fmean(r["VmRSS"] for r in rss)
        out["rss_mib_max"] = max(r["VmRSS"] for r in rss)
        out["hwm_mib_max"] = max(r["VmHWM"] for r in rss)
    finally:
        counter.close()
        stop_all(procs)
    minute = (busy_at // 60) % 60
    expected = sum(plan.due(minute) for plan in plans(jobs))
    first, last = busy_at * 1000, (busy_at + BUSY - 1) * 1000
    seen: dict[tuple[str, int], int] = {}
    delays: list[float] = []
    for path, slot, at in app.records():
        if path.startswith(f"/{label}/") and first <= slot <= last:
            seen[(path, slot)] = seen.get((path, slot), 0) + 1
            delays.append(at - slot / 1000)
    busy, idle, raw = out["busy"], out["idle"], out["raw"]
    slots = len(seen)
    cpu_per_slot = [c / expected for c in busy["cpu_seconds"]]
    idle_rate = [c / idle["seconds"] for c in idle["cpu_seconds"]]
    marginal = [
        (c - r * busy["seconds"]) / expected
        for c, r in zip(busy["cpu_seconds"], idle_rate, strict=True)
    ]
    raw["publishes_per_second"] = raw["publishes"] / raw["seconds"]
    raw["cpu_ms_per_publish"] = 1000 * raw["cpu_seconds"] / raw["publishes"]
    out.update(
        {
            "slots_expected": expected,
            "slots": slots,
            "doubles": sum(n - 1 for n in seen.values()),
            "start_delay": summary_ms(delays),
            "js_requests": dict(counter.counts),
            "js_requests_per_slot": sum(counter.counts.values()) / expected,
            "cpu_ms_per_slot_mean": 1000 * statistics.fmean(cpu_per_slot),
            "cpu_ms_per_slot_max": 1000 * max(cpu_per_slot),
            "cpu_ms_per_slot_marginal": 1000 * statistics.fmean(marginal),
            "cpu_ratio_vs_raw_publish": ratio(
                1000 * statistics.fmean(marginal), raw["cpu_ms_per_publish"]
            ),
            "idle_cpu_percent_mean": 100 * idle["cpu_share_mean"],
            "idle_cpu_percent_max": 100 * idle["cpu_share_max"],
            "idle_wakeups_per_second": idle["wakeups_per_second_mean"],
            "server_cpu_ms_per_slot": 1000 * busy["server_cpu_seconds"] / expected,
            "server_msgs_per_slot": busy["server_msgs"] / expected,
            "server_idle_cpu_percent": 100 * idle["server_cpu_share"],
            "server_idle_msgs_per_second": idle["server_msgs"] / idle["seconds"],
        }
    )
    return out


def say(point: dict[str, Any]) -> None:
    d = point["start_delay"]
    print(
        f"  N={point['instances']:3d} J={point['jobs']:5d}: ready {point['ready_alone_s']:.2f} s"
        f" (together max {point['ready_together_max_s']:.1f} s);"
        f" {point['slots']}/{point['slots_expected']} slots, {point['doubles']} doubles;"
        f" start delay p50 {d.get('p50_ms', 0):.0f} / p99 {d.get('p99_ms', 0):.0f} ms;"
        f" {point['js_requests_per_slot']:.2f} JS req/slot;"
        f" CPU/slot {point['cpu_ms_per_slot_mean']:.3f} ms"
        f" (marginal {point['cpu_ms_per_slot_marginal']:.3f},"
        f" x{point['cpu_ratio_vs_raw_publish']:.1f}"
        f" raw); idle {point['idle_cpu_percent_mean']:.2f}% of a core,"
        f" {point['idle_wakeups_per_second']:.1f} wake-ups/s; RSS {point['rss_mib_mean']:.1f} MiB;"
        f" server {point['server_cpu_ms_per_slot']:.3f} ms and"
        f" {point['server_msgs_per_slot']:.0f} msgs per slot;"
        f" machine busy {100 * point['busy']['machine_busy']:.0f}% / idle half"
        f" {100 * point['idle']['machine_busy']:.0f}%, load {point['busy']['loadavg_1m']:.1f};"
        f" raw {point['raw']['publishes_per_second']:.0f} pub/s",
        flush=True,
    )


# ------------------------------------------------------------------ idle cost


def idle_plans(now: float) -> list[str]:
    """1,000 schedules of a real config (hourly, daily, weekly, monthly), none due soon."""
    hour = time.gmtime(now).tm_hour
    far = [(hour + 3 + k) % 24 for k in range(18)]  # hours at least 3 h away (any zone: below)
    out = []
    for i in range(1000):
        h, m = far[i % len(far)], (i * 7) % 60
        kind = i % 4
        if kind == 0:
            out.append(f"{m} {h} * * *")
        elif kind == 1:
            out.append(f"{m} {h} * * {i % 7}")
        elif kind == 2:
            out.append(f"{m} {h} {1 + i % 28} * *")
        else:
            out.append(f"{m} {h},{far[(i + 5) % len(far)]} * * 1-5")
    return out


def run_idle(work: Path, server: NatsServer, seconds: float) -> dict[str, Any]:
    now = time.time()
    schedules = idle_plans(now)
    jobs = [
        {"name": f"idle-{i:04d}", "schedule": s, "timezone": "UTC", "request": {"path": "/x"}}
        for i, s in enumerate(schedules)
    ]
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
    horizon = now + seconds + 120
    for s in schedules:  # nothing due while measured
        first = next(iter(CronSim(s, _utc(start))))
        assert first.timestamp() > horizon, (s, first)
    config = {
        "nats": {"servers": [server.url]},
        "target": {"url": "http://127.0.0.1:9"},
        "jobs": jobs,
    }
    proc = runtime.RuntimeSidecar(work, "idle1000", config, {})
    proc.start()
    try:
        proc.wait_ready(60)
        time.sleep(5)  # start-up work done
        assert proc.proc is not None
        pid = proc.proc.pid
        t0, c0, w0 = time.monotonic(), cpu_precise(pid), wakeups(pid)
        m0 = machine_cpu()
        time.sleep(seconds)
        t1, c1, w1 = time.monotonic(), cpu_precise(pid), wakeups(pid)
        m1 = machine_cpu()
        rss = rss_mib(pid)
    finally:
        proc.kill()
    return {
        "jobs": len(jobs),
        "seconds": t1 - t0,
        "cpu_seconds": c1 - c0,
        "cpu_percent_of_a_core": 100 * (c1 - c0) / (t1 - t0),
        "wakeups_per_second": (w1 - w0) / (t1 - t0),
        "rss_mib": rss["VmRSS"],
        "machine_busy": machine_busy(m0, m1),
        "loadavg_1m": os.getloadavg()[0],
    }


def _utc(stamp: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(stamp).replace(tzinfo=ZoneInfo("UTC"))


# ------------------------------------------------------------------ variants

OTHER_PYTHONS = ("python3.14", "python3.13", "python3.12")


def other_python(name: str) -> str | None:
    """`py3.13` -> an interpreter of that version on this machine (PATH or pyenv), or None."""
    version = name.removeprefix("py")
    found = shutil.which(f"python{version}")
    candidates = [found] if found else []
    pyenv = Path.home() / ".pyenv" / "versions"
    if pyenv.is_dir():
        candidates += [
            str(d / "bin" / f"python{version}")
            for d in sorted(pyenv.iterdir())
            if d.name.startswith(version + ".")
        ]
    for exe in candidates:
        ok = subprocess.run([exe, "-c", "import venv, ensurepip"], capture_output=True, check=False)
        if ok.returncode == 0:
            return exe
    return None


def variant_env(name: str) -> tuple[Path, dict[str, str], str]:
    """(venv, environment, what it is) of a variant."""
    if name == "asyncio":
        return runtime.ensure(), {}, "asyncio's loop, this Python"
    if name == "uvloop":
        venv = runtime.ensure(extras=("uvloop",), name="uvloop")
        return venv, {"ANARCHON_EVENT_LOOP": "uvloop"}, "ANARCHON_EVENT_LOOP=uvloop, [uvloop]"
    exe = other_python(name)
    if exe is None:
        raise LookupError(f"no {name} on this machine")
    return runtime.ensure(interpreter=exe, name=name), {}, f"CPython {name[2:]}, asyncio's loop"


def run_variants(
    work: Path, server: NatsServer, app: App, names: list[str], rounds: int, seconds: int
) -> dict[str, Any]:
    ready: dict[str, tuple[Path, dict[str, str], str]] = {}
    out: dict[str, Any] = {"rounds": rounds, "window_seconds": seconds, "skipped": {}}
    for name in names:
        try:
            ready[name] = variant_env(name)
        except (LookupError, subprocess.CalledProcessError) as exc:
            out["skipped"][name] = str(exc)
            print(f"  variant {name}: skipped ({exc})", flush=True)
    runs: dict[str, dict[str, list[Any]]] = {n: {"fleet": [], "fp": [], "floor": []} for n in ready}
    for r in range(rounds):
        for name, (venv, env, _) in ready.items():
            tag = name.replace(".", "")  # names an instance: letters, digits, _ and -
            fleet = run_fleet(
                work,
                server,
                app,
                f"v{r}{tag}",
                3,
                100,
                seconds,
                venv=venv,
                env=env,
            )
            runs[name]["fleet"].append(fleet)
            runs[name]["floor"].append(footprint.floor(venv))
            runs[name]["fp"].append(
                footprint.sidecar(work, server, 1000, f"{r}{tag}", "vfp", venv=venv, env=env)
            )
            d, fp, fl = fleet["start_delay"], runs[name]["fp"][-1], runs[name]["floor"][-1]
            print(
                f"  round {r} {name}: CPU/slot/instance "
                f"{fleet['cpu_ms_per_slot_per_instance']:.3f} ms, start delay p50 "
                f"{d['p50_ms']:.0f} / p99 {d['p99_ms']:.0f} ms,"
                f" {fleet['slots']}/{fleet['slots_expected']} slots; 1,000 jobs ready in "
                f"{fp['seconds']:.3f} s, RSS {fp['rss_mib']:.1f} MiB (floor {fl['rss_mib']:.1f})",
                flush=True,
            )
    raw = raw_baseline(server, 100, RAW_SECONDS)
    raw["cpu_ms_per_publish"] = 1000 * raw["cpu_seconds"] / raw["publishes"]
    out["raw"] = raw
    for name, r in runs.items():
        cpu = [f["cpu_ms_per_slot_per_instance"] for f in r["fleet"]]
        delays = sorted(d for f in r["fleet"] for d in f["start_delays_ms"])
        out[name] = {
            "what": ready[name][2],
            "cpu_ms_per_slot_per_instance": cpu,
            "cpu_ms_per_slot_per_instance_median": statistics.median(cpu),
            "cpu_ratio_vs_raw_publish": statistics.median(cpu) / raw["cpu_ms_per_publish"],
            "start_delay_p50_ms": pct(delays, 50),
            "start_delay_p99_ms": pct(delays, 99),
            "slots": sum(f["slots"] for f in r["fleet"]),
            "slots_expected": sum(f["slots_expected"] for f in r["fleet"]),
            "doubles": sum(f["doubles"] for f in r["fleet"]),
            "ready_1000_s": statistics.median(f["seconds"] for f in r["fp"]),
            "rss_1000_mib": statistics.median(f["rss_mib"] for f in r["fp"]),
            "floor_rss_mib": statistics.median(f["rss_mib"] for f in r["floor"]),
            "floor_import_s": statistics.median(f["seconds"] for f in r["floor"]),
        }
        v = out[name]
        v["rss_ratio_vs_floor"] = v["rss_1000_mib"] / v["floor_rss_mib"]
    if "asyncio" in runs:
        base = out["asyncio"]
        for name in runs:
            v = out[name]
            v["cpu_vs_asyncio"] = (
                v["cpu_ms_per_slot_per_instance_median"]
                / base["cpu_ms_per_slot_per_instance_median"]
            )
            v["p99_vs_asyncio"] = v["start_delay_p99_ms"] / base["start_delay_p99_ms"]
            v["ready_vs_asyncio"] = v["ready_1000_s"] / base["ready_1000_s"]
            v["rss_vs_asyncio"] = v["rss_1000_mib"] / base["rss_1000_mib"]
    return out


# ------------------------------------------------------------------ main


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--fleets", default="2,10,30,100", help="sidecars, at 100 jobs each")
    parser.add_argument("--jobs", default="10,100,1000,10000", help="jobs, with 2 sidecars")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--variants", default="asyncio,uvloop,py3.13")
    parser.add_argument("--variant-rounds", type=int, default=2)
    parser.add_argument("--variant-seconds", type=int, default=15)
    parser.add_argument(
        "--add", action="store_true", help="keep the last run's other points (a partial run)"
    )
    args = parser.parse_args()
    t_start = time.monotonic()
    earlier = read_result("scale") if args.add else None
    result: dict[str, Any] = earlier or {
        "busy_seconds": BUSY,
        "idle_window_seconds": IDLE_WINDOW,
        "slots_per_busy_half": PER_HALF,
        "points": [],
    }
    runtime.ensure()
    app = App()
    try:
        with workdir("scale") as work, nats_server(work) as server:
            if args.idle_seconds:
                idle = run_idle(work, server, args.idle_seconds)
                result["idle_1000"] = idle
                print(
                    f"idle, 1,000 jobs: {idle['cpu_percent_of_a_core']:.3f}% of a core over "
                    f"{idle['seconds']:.0f} s, {idle['wakeups_per_second']:.1f} wake-ups/s, "
                    f"RSS {idle['rss_mib']:.1f} MiB (machine {100 * idle['machine_busy']:.0f}% "
                    f"busy, load {idle['loadavg_1m']:.1f})",
                    flush=True,
                )
            todo = [(n, BASE_JOBS) for n in ints(args.fleets)]
            todo += [(BASE_FLEET, j) for j in ints(args.jobs) if (BASE_FLEET, j) not in todo]
            for n, j in todo:
                try:
                    point = run_point(work, server, app, n, j)
                except AssertionError as exc:  # the machine could not hold it: say so, go on
                    point = {"instances": n, "jobs": j, "failed": str(exc).splitlines()[0]}
                    print(f"  N={n} J={j}: not measured: {point['failed']}", flush=True)
                else:
                    say(point)
                result["points"] = [
                    p for p in result["points"] if (p["instances"], p["jobs"]) != (n, j)
                ] + [point]
                write_result("scale", result)  # what there is so far
            names = [v for v in args.variants.split(",") if v]
            if names:
                result["variants"] = run_variants(
                    work, server, app, names, args.variant_rounds, args.variant_seconds
                )
    finally:
        app.stop()
    result["machine"] = machine()
    minutes = (time.monotonic() - t_start) / 60
    result["minutes"] = minutes + (result.get("minutes", 0) if args.add else 0)
    write_result("scale", result)
    print(f"scale: {result['minutes']:.1f} min")


if __name__ == "__main__":
    main()
