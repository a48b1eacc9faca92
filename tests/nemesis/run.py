"""One nemesis run, start to finish: build, break, heal, read, check, tear down.

    NEMESIS_SECONDS=300 NEMESIS_SEED=42 .venv/bin/python -m tests.nemesis.run

(`make nemesis` runs the pytest test with 300 s). The run's directory keeps the
history (``apps.jsonl``, ``stream.jsonl``, ``faults.jsonl``, ``run.json``) and
every process's log, and ``cpu.jsonl`` (evidence of CPU starvation,
tests/nemesis/cpu.py); it is copied to ``bench/results/nemesis/`` (not committed).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tests.nemesis.checker import History, Report, check, log_figures, summary
from tests.nemesis.cpu import CpuWatch, loadavg
from tests.nemesis.faults import Fault, Nemesis, plan
from tests.nemesis.harness import CHAINED_JOB, EVERY_JOB, LOCKED, STREAM, System
from tests.nemesis.net import sweep_leftovers
from tests.nemesis.operator import OPERATED, RUNTIME, RUNTIME_PERIOD_S, Operator
from tests.support import ROOT, read_stream, wait_for

# Seconds after every fault healed before a slot counts as "quiet" again
# (elections, reconnects, TCP retransmission back-off after a black hole).
SETTLE = 10.0
MAX_LATE = 4.0
# The last stretch without faults: every slot in it must run.
QUIET_TAIL = SETTLE + MAX_LATE + 4.0
RESULTS = ROOT / "bench" / "results" / "nemesis"


def seed_from_env() -> int:
    text = os.environ.get("NEMESIS_SEED", "").strip()
    return int(text) if text else random.SystemRandom().randrange(1, 10**6)


def candidates_from_env() -> int:
    """``NEMESIS_CANDIDATES=k``: the jobs claim with ``claim.candidates: k`` (0: off)."""
    text = os.environ.get("NEMESIS_CANDIDATES", "").strip()
    return int(text) if text else 0


def power_from_env() -> bool:
    """``NEMESIS_POWER=1``: power cuts too (tests/power.py; needs strace)."""
    return os.environ.get("NEMESIS_POWER", "").strip() == "1"


def seconds_from_env(default: float = 60.0) -> float:
    text = os.environ.get("NEMESIS_SECONDS", "").strip()
    return float(text) if text else default


@dataclass
class Outcome:
    seed: int
    seconds: float
    report: Report
    faults: list[Fault]
    directory: Path
    took: float
    errors: list[str]
    candidates: int = 0
    power: bool = False
    sync: str = "default"

    def line(self) -> str:
        k = f" candidates={self.candidates}" if self.candidates else ""
        k += f" power=1 sync={self.sync}" if self.power else ""
        return f"NEMESIS seed={self.seed} seconds={self.seconds:g}{k} " + summary(self.report)

    def explain(self) -> str:
        plan_text = "\n".join("  " + f.describe() for f in self.faults)
        fails = "\n".join("  " + f for f in self.report.failures + self.errors)
        notes = "".join(f"\n  {n}" for n in self.report.notes)
        return (
            f"{self.line()}\nreplay: NEMESIS_SEED={self.seed} NEMESIS_SECONDS={self.seconds:g}"
            f"{f' NEMESIS_CANDIDATES={self.candidates}' if self.candidates else ''}"
            f"{' NEMESIS_POWER=1' if self.power else ''}"
            f"{f' NEMESIS_SYNC={self.sync}' if self.sync != 'default' else ''}\n"
            f"history and logs: {self.directory}\nfailures:\n{fails}\nnotes:{notes}\n"
            f"fault schedule:\n{plan_text}"
        )


def run(workdir: Path, seed: int, seconds: float, candidates: int | None = None) -> Outcome:
    began = time.monotonic()
    sweep_leftovers()
    candidates = candidates_from_env() if candidates is None else candidates
    power = power_from_env()
    system = System(workdir, max_late=MAX_LATE, candidates=candidates, power=power)
    fault_seconds = max(5.0, seconds - QUIET_TAIL)
    faults = plan(seed, fault_seconds, system.node_names, system.sidecar_names, power)
    (workdir / "plan.txt").write_text("\n".join(f.describe() for f in faults) + "\n")
    nemesis = Nemesis(system, faults, workdir / "faults.jsonl")
    errors: list[str] = []
    load_at_start = loadavg()
    cpu = CpuWatch(
        workdir / "cpu.jsonl", lambda: {s: system.pid_of(s) for s in system.sidecar_names}
    )
    operator: Operator | None = None
    try:
        # NEMESIS_SYNC=always: every server fsyncs each write (what DEPLOY.md recommends).
        system.start(sync_always=os.environ.get("NEMESIS_SYNC", "") == "always")
        cpu.start()
        nemesis.start()
        operator = Operator(system.operator_config(), workdir / "ops.jsonl", seed)
        operator.start(until=nemesis.started + fault_seconds)
        nemesis.join(fault_seconds + 120)
        operator.stop()
        heal_all(system)
        errors += nemesis.errors
        # The quiet tail: the experiment's own duration, not a wait for a condition.
        time.sleep(max(0.0, nemesis.started + seconds - time.time()))
        stopped = stop_sidecars(system)
        wait_for(
            lambda: all(system.node_healthy(n) for n in system.node_names),
            60,
            interval=0.5,
            what="cluster healthy after the faults",
        )
        stored = read_stream(system.client_url("n1"), STREAM)
        with (workdir / "stream.jsonl").open("w") as out:
            for m in stored:
                out.write(
                    json.dumps(
                        {
                            "seq": m.seq,
                            "subject": m.subject,
                            "headers": m.headers,
                            "data": m.data,
                            "time": m.time,
                        }
                    )
                    + "\n"
                )
        run_info = {
            "seed": seed,
            "seconds": seconds,
            "window": [nemesis.started, stopped - MAX_LATE - 1.5],
            "settle": SETTLE,
            "loadavg": {"start": load_at_start, "end": loadavg()},
            "nodes": system.node_names,
            "raft_groups": system.raft_groups(),
            "sidecars": system.sidecar_names,
            "candidates": candidates,
            "power": power,
            "sync": os.environ.get("NEMESIS_SYNC", "") or "default",
            "jobs": {
                "tick": {"period_s": 1, "max_late": MAX_LATE},
                "lease": {"period_s": 2, "max_late": MAX_LATE},
            },
            # overlap: skip (harness.py): not required to run every slot.
            "locked": {LOCKED: {"period_s": 2, "max_late": MAX_LATE}},
            # Issue 50's kinds (harness.job_configs): checked per instance and per run.
            "every": {EVERY_JOB: {"period_s": 2, "max_late": MAX_LATE}},
            "chained": {CHAINED_JOB: {"after": "lease", "on": "always", "retry_max": 1}},
            # Paused, skipped, caught up and backfilled by the operator (operator.py).
            "operated": {OPERATED: {"period_s": 2, "max_late": MAX_LATE, "jitter": 1.0}},
            # Added, updated and removed in the state bucket by the operator.
            "runtime": {RUNTIME: {"period_s": RUNTIME_PERIOD_S, "max_late": MAX_LATE}},
            "operator_actions": operator.count,
        }
        (workdir / "run.json").write_text(json.dumps(run_info, indent=1) + "\n")
    finally:
        if operator is not None:
            operator.stop()
        cpu.stop()
        nemesis.stop()
        system.stop()
    report = check(History.load(workdir))
    report.figures.update(log_figures(workdir))
    outcome = Outcome(
        seed,
        seconds,
        report,
        faults,
        workdir,
        time.monotonic() - began,
        errors,
        candidates,
        power,
        os.environ.get("NEMESIS_SYNC", "") or "default",
    )
    keep(outcome)
    return outcome


def heal_all(system: System) -> None:
    """Whatever the nemesis left (it heals everything itself; this is the safety net)."""
    system.net.cut({})
    for node in system.nodes.values():
        if node.stopped:
            node.signal(signal.SIGCONT)
        if not node.alive:
            node.start(system.net)
    for sc in system.sidecars.values():
        if sc.stopped:
            sc.signal(signal.SIGCONT)
        if not sc.alive or sc.offset:
            sc.terminate(8)
            sc.start(system.net)


def stop_sidecars(system: System) -> float:
    """SIGTERM every sidecar at once; returns when the first was asked to stop."""
    at = time.time()
    for sc in system.sidecars.values():
        sc.signal(signal.SIGCONT)
        sc.signal(signal.SIGTERM)
    for sc in system.sidecars.values():
        if sc.proc is not None:
            try:
                sc.proc.wait(15)
            except subprocess.TimeoutExpired:
                sc.kill()
    return at


def keep(outcome: Outcome) -> None:
    """Copy the history and logs to bench/results/nemesis/ and append the figures."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    dest = RESULTS / f"{stamp}-seed{outcome.seed}"
    dest.mkdir(parents=True, exist_ok=True)
    for path in outcome.directory.iterdir():
        if path.is_file() and path.suffix in (".jsonl", ".json", ".log", ".txt", ".yaml", ".conf"):
            shutil.copy(path, dest / path.name)
    record = {
        "seed": outcome.seed,
        "seconds": outcome.seconds,
        "candidates": outcome.candidates,
        "power": outcome.power,
        "sync": outcome.sync,
        "figures": outcome.report.figures,
        "failures": outcome.report.failures + outcome.errors,
        "notes": outcome.report.notes,
        "loadavg": json.loads((dest / "run.json").read_text()).get("loadavg")
        if (dest / "run.json").exists()
        else None,
        "took_s": round(outcome.took, 1),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "kept": dest.name,
        "cpus": os.cpu_count(),
    }
    with (RESULTS / "runs.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\n")
    outcome.directory = dest


def main() -> int:
    seed, seconds = seed_from_env(), seconds_from_env()
    with tempfile.TemporaryDirectory(prefix="nemesis-") as tmp:
        outcome = run(Path(tmp), seed, seconds)
    print(outcome.explain() if not outcome.report.ok or outcome.errors else outcome.line())
    return 0 if outcome.report.ok and not outcome.errors else 1


if __name__ == "__main__":
    sys.exit(main())
