"""The nemesis: a seeded random schedule of faults, and the code that applies them.

`plan(seed, seconds, ...)` is pure: the same seed gives the same schedule
(replay a failure with ``NEMESIS_SEED``). Two lanes run side by side, so
faults combine: a network lane (majority/minority split, the stream leader
isolated, a bridge, one sidecar cut from NATS) and a process lane (SIGSTOP /
SIGCONT of a server or a sidecar, kill -9 and restart, a sidecar restarted
with its clock shifted, a sidecar killed between a won claim and its lease).
Each fault heals after a few seconds; a gap follows.

`Nemesis` applies a plan to a running `System` and writes what it really did,
with wall-clock times, to the fault log: which hosts could not reach which
(partitions), which processes were down, paused or skewed. Who leads the
stream is only known when the fault starts, so ``leader`` faults resolve
their victim then (and log it).
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.nemesis.harness import System

NETWORK = ("partition", "leader", "bridge", "sidecar-cut")
PROCESS = ("pause-node", "pause-sidecar", "kill-node", "kill-sidecar", "clock", "claim-kill")
# claim-kill: the sidecar is restarted with the ``claim.won`` failpoint armed
# (sidecar/core/failpoints.py); at its first won claim it stops itself, before its
# run lease exists, and is killed -9 there; it starts again, unarmed, at the
# heal. The fault lasts this much longer than drawn: a restart and a win take
# a few seconds.
CLAIM_KILL_EXTRA = 5.0
CLAIM_KILL_FAILPOINT = "claim.won=1*sigstop"
# Power cuts (``NEMESIS_POWER=1``, tests/power.py): at the fault's start a moment of
# the store is marked; at its end the power goes: one node (power-node) or all of
# them at once (power-all) are killed and their store put back to the oldest
# snapshot no fsync came after, then started again. Off by default, so that the
# schedule of a seed stays what it was.
POWER = ("power-node", "power-all")
# The documented skew limit is "far below the duplicate window"; the clock-skew
# scenario proves ±2 s. Offsets stay within that.
MAX_OFFSET = 2.0


@dataclass
class Fault:
    kind: str
    at: float  # seconds after the nemesis started
    duration: float
    target: str = ""  # a node or sidecar (process faults, sidecar-cut)
    sides: list[list[str]] = field(default_factory=list)  # partition: hosts per side
    bridge: str = ""  # the node that sees both sides
    offset: float = 0.0  # clock: seconds

    def describe(self) -> str:
        what = self.target or "|".join(",".join(side) for side in self.sides)
        extra = f" bridge={self.bridge}" if self.bridge else ""
        extra += f" offset={self.offset:+.2f}s" if self.kind == "clock" else ""
        return f"t+{self.at:5.1f}s {self.kind:<13} {self.duration:4.1f}s {what}{extra}"


def plan(
    seed: int, seconds: float, nodes: list[str], sidecars: list[str], power: bool = False
) -> list[Fault]:
    """The faults of a run of `seconds`, from `seed`; all healed by `seconds`.

    With `power`, the process lane also draws power cuts (POWER)."""
    rng = random.Random(seed)
    faults: list[Fault] = []

    def sidecar_sides(k: int) -> list[list[str]]:
        sides: list[list[str]] = [[] for _ in range(k)]
        for s in sidecars:
            sides[rng.randrange(k)].append(s)
        return sides

    t = rng.uniform(1.0, 3.0)
    while True:
        kind = rng.choice(NETWORK)
        duration = rng.uniform(2.0, 6.0)
        if t + duration > seconds:
            break
        order = nodes[:]
        rng.shuffle(order)
        if kind == "partition":
            extra = sidecar_sides(2)
            faults.append(
                Fault(kind, t, duration, sides=[order[:1] + extra[0], order[1:] + extra[1]])
            )
        elif kind == "leader":  # the first side's node is replaced by the leader when it starts
            extra = sidecar_sides(2)
            faults.append(Fault(kind, t, duration, sides=[["?leader"] + extra[0], extra[1]]))
        elif kind == "bridge":
            extra = sidecar_sides(2)
            faults.append(
                Fault(
                    kind,
                    t,
                    duration,
                    sides=[[order[0]] + extra[0], [order[2]] + extra[1]],
                    bridge=order[1],
                )
            )
        else:
            faults.append(Fault(kind, t, duration, target=rng.choice(sidecars)))
        t += duration + rng.uniform(2.0, 8.0)

    t = rng.uniform(2.0, 5.0)
    while True:
        kind = rng.choice(PROCESS + POWER if power else PROCESS)
        duration = rng.uniform(1.0, 5.0) + (CLAIM_KILL_EXTRA if kind == "claim-kill" else 0.0)
        if t + duration > seconds:
            break
        if kind == "power-all":
            faults.append(Fault(kind, t, duration, target=",".join(nodes)))
        elif kind in ("pause-node", "kill-node", "power-node"):
            faults.append(Fault(kind, t, duration, target=rng.choice(nodes)))
        else:
            if kind == "pause-sidecar":
                # Aim at the moment claims are in flight: just after a whole second.
                t = float(int(t)) + rng.uniform(0.0, 0.35)
            offset = rng.choice((-1, 1)) * rng.uniform(0.5, MAX_OFFSET) if kind == "clock" else 0.0
            faults.append(Fault(kind, t, duration, target=rng.choice(sidecars), offset=offset))
        t += duration + rng.uniform(2.0, 8.0)
    return sorted(faults, key=lambda f: f.at)


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP: state ``T`` in /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


class Nemesis:
    """Applies a plan to a System in a thread of its own; `log` is what happened."""

    def __init__(self, system: System, faults: list[Fault], log_path: Path) -> None:
        self.system = system
        self.faults = faults
        self.log_path = log_path
        self.log: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.started = 0.0

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        """One thread per lane: a sidecar restart (it waits for the drain) does not
        hold back the heal of a partition."""
        self.started = time.time()
        for lane in (NETWORK, PROCESS + POWER):
            faults = [f for f in self.faults if f.kind in lane]
            thread = threading.Thread(target=self._run, args=(faults,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self.join(60)

    def _run(self, faults: list[Fault]) -> None:
        events: list[tuple[float, int, Fault]] = []
        for f in faults:
            events.append((f.at, 1, f))
            events.append((f.at + f.duration, 0, f))  # heal before a start at the same time
        events.sort(key=lambda e: (e[0], e[1]))
        records: dict[int, dict[str, Any]] = {}
        for at, starting, fault in events:
            delay = self.started + at - time.time()
            if delay > 0 and self._stop.wait(delay):
                break
            try:
                if starting:
                    records[id(fault)] = self._begin(fault)
                elif id(fault) in records:
                    self._end(fault, records.pop(id(fault)))
            except Exception as exc:  # a fault that could not be applied is reported, not hidden
                with self._lock:
                    self.errors.append(f"{fault.describe()}: {exc!r}")
        for fault_id, record in list(records.items()):
            fault = next(f for f in faults if id(f) == fault_id)
            try:
                self._end(fault, record)
            except Exception as exc:
                self.errors.append(f"heal {fault.describe()}: {exc!r}")

    # ------------------------------------------------------------------ faults

    def _begin(self, fault: Fault) -> dict[str, Any]:
        s = self.system
        rec: dict[str, Any] = {**asdict(fault), "start": time.time()}
        # Who led the stream when the fault began: the checker tells elections from the rest.
        rec["leader"] = s.stream_leader()
        rec["start"] = time.time()
        if fault.kind in NETWORK:
            blocked = self._blocked(fault)
            rec["sides"] = fault.sides
            rec["blocked"] = sorted(
                {tuple(sorted((a, b))) for a, bs in blocked.items() for b in bs}
            )
            s.net.cut(blocked)
        elif fault.kind == "pause-node":
            s.nodes[fault.target].signal(signal.SIGSTOP)
        elif fault.kind == "pause-sidecar":
            s.sidecars[fault.target].signal(signal.SIGSTOP)
        elif fault.kind == "kill-node":
            s.nodes[fault.target].kill()
        elif fault.kind == "kill-sidecar":
            s.sidecars[fault.target].kill()
        elif fault.kind == "clock":
            sc = s.sidecars[fault.target]
            sc.terminate(8)
            sc.start(s.net, fault.offset)
        elif fault.kind == "claim-kill":
            sc = s.sidecars[fault.target]
            sc.terminate(8)
            sc.start(s.net, 0.0, failpoints=CLAIM_KILL_FAILPOINT)
            watcher = threading.Thread(target=self._kill_at_claim, args=(fault, rec), daemon=True)
            watcher.start()
            rec["_watcher"] = watcher
        elif fault.kind in POWER:
            rec["nodes"] = fault.target.split(",")
            rec["marked"] = {n: s.nodes[n].mark() for n in rec["nodes"]}
        rec["applied"] = time.time()
        return rec

    def _kill_at_claim(self, fault: Fault, rec: dict[str, Any]) -> None:
        """claim-kill: kill -9 the sidecar as soon as it stopped itself at its first
        won claim (``killed_at``), or leave it to the heal when it never won one."""
        sc = self.system.sidecars[fault.target]
        heal = self.started + fault.at + fault.duration - 0.5
        while time.time() < heal and not self._stop.is_set():
            proc = sc.proc
            if proc is not None and proc.poll() is None and stopped(proc.pid):
                sc.kill()
                rec["killed_at"] = time.time()
                return
            time.sleep(0.02)

    def _blocked(self, fault: Fault) -> dict[str, set[str]]:
        s = self.system
        if fault.kind == "sidecar-cut":
            return {fault.target: set(s.node_names)}
        if fault.kind == "leader":
            leader = s.stream_leader() or s.node_names[0]
            others = [n for n in s.node_names if n != leader]
            fault.sides = [[leader, *fault.sides[0][1:]], others + fault.sides[1]]
        a, b = fault.sides
        return {x: set(b) for x in a}

    def _power_cut(self, rec: dict[str, Any]) -> None:
        """Every node of the fault stopped at once, then killed, its store put back to
        what was fsynced, and started again. The record's start becomes the cut (the
        nodes ran until then); what each node lost is logged."""
        s = self.system
        names = rec["nodes"]
        now = {n: s.nodes[n].stop_for_cut() for n in names}
        rec["start"] = min(snap.taken_at for snap in now.values())
        rec["power"] = {}
        for n in names:
            cut = s.nodes[n].cut(now[n])
            rec["power"][n] = {
                "syncs_since_mark": cut.syncs_since_mark,
                "lost_s": round(cut.at - cut.restored_from, 3),
            }
        for n in names:
            s.nodes[n].start(s.net)

    def _end(self, fault: Fault, rec: dict[str, Any]) -> None:
        s = self.system
        rec["heal"] = time.time()
        if fault.kind in NETWORK:
            s.net.cut({})
        elif fault.kind == "pause-node":
            s.nodes[fault.target].signal(signal.SIGCONT)
        elif fault.kind == "pause-sidecar":
            s.sidecars[fault.target].signal(signal.SIGCONT)
        elif fault.kind == "kill-node":
            s.nodes[fault.target].start(s.net)
        elif fault.kind == "kill-sidecar":
            s.sidecars[fault.target].start(s.net)
        elif fault.kind == "clock":
            sc = s.sidecars[fault.target]
            sc.terminate(8)
            sc.start(s.net, 0.0)
        elif fault.kind == "claim-kill":
            rec.pop("_watcher").join(15)
            sc = s.sidecars[fault.target]
            sc.kill()  # never stopped at a win: killed now, like kill-sidecar
            sc.start(s.net, 0.0)
        elif fault.kind in POWER:
            self._power_cut(rec)
        rec["end"] = time.time()
        with self._lock:
            self.log.append(rec)
            with self.log_path.open("a") as out:
                out.write(json.dumps(rec) + "\n")
