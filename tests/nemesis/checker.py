"""The checker: reads a run's whole history and says what went wrong.

Input (files in the run's directory, all JSON lines but ``run.json``):

- ``apps.jsonl``: every request any app received, with its arrival time
  (host clock) and the ``X-Anarchon-*`` headers (job, slot, attempt, fence,
  run id, instance).
- ``stream.jsonl``: every message of the stream, read after everything healed.
- ``faults.jsonl``: every fault the nemesis applied, with wall-clock start and end.
- ``run.json``: seed, window, jobs (period, max_late), settle time.

Safety figures (each must be 0; a failure names the slots):

- **doubles**: a (job, slot, attempt) the apps received more than once, with
  different run ids or from different sidecars (exactly-once broken).
- **late**: a first attempt that arrived later than slot + max_late +
  margin (1 s, plus how far behind the sending sidecar's clock was set).
- **early**: a request that arrived before its slot by more than the sending
  sidecar's clock was set ahead, plus 0.2 s.
- **unclaimed**: a request whose run id is not the token of its slot's stored
  claim: a run without a winning claim, or an acknowledged claim lost by NATS.
- **dup_ids**: a msg id stored twice (JetStream's de-duplication broken).
- **lost_wrong**: a ``lost`` record that cannot be right: no stored claim for
  that attempt, or the run's own result was stored before it (the run had
  finished and said so), or nothing touched the runner nor NATS between its
  claim and the lost record (a healthy runner taken for dead).
- **reruns_bad**: a rerun (attempt 2 after a lost attempt 1) whose fence is not
  above the lost attempt's (an app could not refuse the stale runner).
- **claim_kills_unjudged**: a claim won by a sidecar that the claim-kill fault
  killed at ``claim.won`` (before its run lease existed), stored at least
  ``CLAIM_KILL_JUDGED`` seconds before the window's end, with no result: the
  claim-to-lease window left open (docs/GUARANTEES.md).
- issue 50's kinds (``run_on: every``, chains): tests/nemesis/kinds.py.
- **missed_quiet**: a slot that did not run although no fault touched NATS, and
  some sidecar was untouched, from `settle` seconds before the slot to
  max_late after it.

Liveness figures (reported; a miss is allowed while faults last):

- **slots**, **runs** (slots run at least once), **missed** (slots never run),
- **missed_available**: missed slots where, for the whole window above, some
  sidecar and two of the three nodes were running, not paused and not cut from
  each other (the issue's "a claim could have been made"): a sidecar that
  stays connected to a cut-off server cannot claim although another server
  would answer.
- **missed_no_election**: of those, the ones where no fault near the slot
  stopped, killed or cut off the stream's leader (recorded when each fault
  began) or the state bucket's (from the servers' "new stream leader" lines:
  a claim waits for the bucket's view, a run for its lease), nor measured CPU
  starvation explains the miss: a failure. The election the Raft timeout
  forces explains the others.
- **missed_elections_logged**: missed slots that would be
  ``missed_no_election`` but for an election the servers logged, which the
  faults did not predict: the stream was without a leader (from its leader's
  "has NO quorum, stalled" or its Raft group's "Detected another leader with
  higher term, will stepdown" to the next "new stream leader") for at least
  half of [slot, slot + max_late]. nats-server's Raft has no pre-vote: a
  follower cut from the leader alone (a bridge) campaigns with a higher term
  and can depose a leader that kept its majority (seed 477497).
- **missed_starved**: missed slots that would be ``missed_no_election`` but
  for evidence, measured in the run (``cpu.jsonl``, tests/nemesis/cpu.py),
  that the CPU was not there: for at least a quarter of [slot, slot +
  max_late], the harness's own sampling thread could not run, or the slot's
  stored winner (without one: every sidecar that could claim) waited on the
  run queue. Each is listed with its evidence (``notes``).
- **claim_kills** (sidecars killed at a won claim), **missed_claim_killed**
  (missed slots whose attempt 1 was such a claim: recorded lost, and run
  again only as attempt 2 where ``on_lost: rerun``),
- **lost** (lost records), **reruns** (attempts after a lost one that ran),
  **reruns_needless** (reruns of a run whose own ``succeeded`` result was
  stored before the lost record: the slot ran twice for nothing).
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from tests.nemesis.cpu import stalled, waited
from tests.nemesis.kinds import check_chain, check_every

PROCESS_KINDS = ("pause-node", "pause-sidecar", "kill-node", "kill-sidecar", "clock")
LATE_MARGIN = 1.0
EARLY_MARGIN = 0.2
# The share of a miss's window (slot to slot + max_late) the CPU must have been
# missing, measured, before a miss is put down to starvation.
STARVED_SHARE = 0.25


@dataclass
class History:
    requests: list[dict[str, Any]]
    stream: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    run: dict[str, Any]
    cpu: list[dict[str, Any]] = field(default_factory=list)
    # (start, end, what): the stream without a leader, from the servers' logs.
    leaderless: list[tuple[float, float, str]] = field(default_factory=list)
    # The operator's commands (tests/nemesis/operator.py).
    ops: list[dict[str, Any]] = field(default_factory=list)
    # Per sidecar: (time, job, "taken" | "left" | "changed") as it logged taking up a
    # change of a job of the state bucket (sidecar/admin/bucket_jobs.py), time-ordered.
    bucket_job_logs: dict[str, list[tuple[float, str, str]]] = field(default_factory=dict)
    # (time, node): the state bucket's stream leader as each election was logged.
    bucket_leaders: list[tuple[float, str]] = field(default_factory=list)

    @classmethod
    def load(cls, directory: Path) -> History:
        def lines(name: str) -> list[dict[str, Any]]:
            path = directory / name
            if not path.exists():
                return []
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

        run = json.loads((directory / "run.json").read_text())
        return cls(
            lines("apps.jsonl"),
            lines("stream.jsonl"),
            lines("faults.jsonl"),
            run,
            lines("cpu.jsonl"),
            leaderless_from_logs(
                {n: directory / f"{n}.log" for n in run["nodes"]},
                "CRON",
                (run.get("raft_groups") or {}).get("CRON"),
            ),
            lines("ops.jsonl"),
            bucket_job_logs({s: directory / f"{s}.log" for s in run["sidecars"]}),
            leaders_from_logs(
                {n: directory / f"{n}.log" for n in run["nodes"]},
                next((g for g in run.get("raft_groups") or {} if g.startswith("KV_")), ""),
            ),
        )


@dataclass
class Report:
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what explains a miss that is no failure

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class Touch:
    """A fault as the checker sees it: when, which processes, which links."""

    start: float
    end: float
    nodes: frozenset[str]  # servers down or paused
    sidecars: frozenset[str]  # sidecars down, paused, restarting or skewed
    blocked: frozenset[frozenset[str]]  # pairs that could not reach each other
    cluster: bool  # touched the cluster as a whole (a server fault or a partition among servers)
    leader_hit: bool = False  # the stream's leader was stopped, killed or cut from the majority


def touches(
    faults: Iterable[dict[str, Any]],
    nodes: set[str],
    bucket_leaders: Sequence[tuple[float, str]] = (),
) -> list[Touch]:
    """The faults as Touches. A fault hits "the leader" when it stops or cuts off
    the claims' stream's leader (recorded with the fault) or the state bucket's
    (`bucket_leaders`, from the servers' logs): a slot is claimed only once the
    bucket's view is current (Fleet.caught_up, up to 2 s) and run with a lease
    in it (docs/GUARANTEES.md), so a bucket without a leader delays both."""
    out = []
    for f in faults:
        start, end = f["start"], f.get("end", f.get("heal", f["start"]))
        kind, target = f["kind"], f.get("target", "")
        blocked = frozenset(frozenset(p) for p in f.get("blocked", []))
        sides = f.get("sides") or []
        if kind in ("partition", "leader", "bridge") and len(sides) == 2:
            # Every host of one side is cut from every host of the other (the bridge
            # node is on neither list): derived from the sides, whatever was logged.
            blocked = frozenset(frozenset({a, b}) for a in sides[0] for b in sides[1])
        fnodes = frozenset({target}) if kind in ("pause-node", "kill-node") else frozenset()
        if kind in ("power-node", "power-all"):  # down from the cut to the restart
            fnodes = frozenset(f.get("nodes") or target.split(","))
        fsidecars = (
            frozenset({target})
            if kind in ("pause-sidecar", "kill-sidecar", "clock", "claim-kill")
            else frozenset()
        )
        if kind == "sidecar-cut":
            fsidecars = frozenset({target})
        cluster = bool(fnodes) or any(len(p & nodes) == 2 for p in blocked)
        sidecars_cut = frozenset(h for p in blocked for h in p if h not in nodes)
        bucket = next((n for t, n in reversed(bucket_leaders) if t <= start), None)
        hit = any(
            leader in fnodes
            or (cluster and len(_reach(leader, nodes, blocked)) + 1 <= len(nodes) // 2)
            for leader in {f.get("leader"), bucket}
            if leader
        ) or _bridged(kind, f.get("bridge"), f.get("leader"), sides)
        out.append(Touch(start, end, fnodes, fsidecars | sidecars_cut, blocked, cluster, hit))
    return out


def _bridged(kind: str, bridge: str | None, leader: str | None, sides: list[list[str]]) -> bool:
    """A bridge with the claims stream's leader on a side node: a sidecar on the
    other side node (no route to the leader) or on the leader's across the cut
    keeps its connection, and moves only once a claim went unanswered for its
    whole ack timeout (a slot's claim, which first waits up to 2 s for the
    bucket's view, has less; the question about it, asked later, moves it), maybe
    first to another cut server (connect_timeout 5 s): longer than most bridges
    (2-6 s). Every sidecar may be on such a server: the model knows the sides,
    not who is connected where. The bucket's leader alone on a side node costs a
    slot its 2 s probe and the run its lease wait, not its claim: not a hit."""
    return kind == "bridge" and bool(bridge) and any(leader in side for side in sides)


def _reach(leader: str, nodes: set[str], blocked: frozenset[frozenset[str]]) -> list[str]:
    """The other nodes `leader` is not cut from."""
    return [n for n in nodes if n != leader and frozenset({leader, n}) not in blocked]


def leaders_from_logs(logs: dict[str, Path], stream: str) -> list[tuple[float, str]]:
    """(time, node) of each "new stream leader" line of `stream`, time-ordered: the
    node that logged it leads from then on."""
    if not stream:
        return []
    elected = f"new stream leader for '$G > {stream}'"
    out: list[tuple[float, str]] = []
    for node, path in logs.items():
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            m = _LOG_TIME.match(line) if elected in line else None
            if m:
                at = datetime.strptime(m.group(1), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                out.append((at, node))
    return sorted(out)


_LOG_TIME = re.compile(r"^\[\d+\] (\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) ")


def leaderless_from_logs(
    logs: dict[str, Path], stream: str, group: str | None
) -> list[tuple[float, float, str]]:
    """When the stream had no leader, as the servers logged it: from its leader's
    "has NO quorum, stalled" or a step-down of its Raft group (`group`) to the
    next "new stream leader" line of any server (times in the host's zone)."""
    lost = [f"stream '$G > {stream}' has NO quorum, stalled"]
    if group:
        lost.append(f" - {group}] Detected another leader with higher term, will stepdown")
    elected = f"new stream leader for '$G > {stream}'"
    events: list[tuple[float, str, str]] = []
    for node, path in logs.items():
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            kind = "lost" if any(x in line for x in lost) else "elected" if elected in line else ""
            m = _LOG_TIME.match(line) if kind else None
            if m:
                at = datetime.strptime(m.group(1), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                events.append((at, kind, node))
    events.sort()
    out: list[tuple[float, float, str]] = []
    for i, (at, kind, node) in enumerate(events):
        if kind != "lost" or (out and out[-1][1] >= at):
            continue
        end = next(((t, n) for t, k, n in events[i + 1 :] if k == "elected"), None)
        if end is not None:
            out.append((at, end[0], f"{node} lost its leadership, {end[1]} was elected"))
    return out


_SIDECAR_LOG = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) \S+ sidecar\.admin\.bucket_jobs: job (\S+) \(id .*\) "
    r"(taken up from the state bucket|left the state bucket|changed in the state bucket)"
)


def bucket_job_logs(logs: dict[str, Path]) -> dict[str, list[tuple[float, str, str]]]:
    """Per sidecar, when it took up a job of the state bucket or let it go: (time,
    job, "taken" | "left" | "changed") from its log (host zone, as the log writes it)."""
    out: dict[str, list[tuple[float, str, str]]] = {}
    for sidecar, path in logs.items():
        events = []
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                if m := _SIDECAR_LOG.match(line):
                    at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    kind = m.group(3).split()[0]  # taken, left, changed
                    events.append((at, m.group(2), kind))
        out[sidecar] = sorted(events)
    return out


# A claim killed at claim.won is judged within this (the winner's restart, or
# presence expiry and two renewals, plus lease_ttl and the lost record's write).
CLAIM_KILL_JUDGED = 30.0
K = TypeVar("K")


def claim_kills(
    faults: Iterable[dict[str, Any]], claims: dict[K, dict[str, Any]]
) -> dict[K, dict[str, Any]]:
    """The stored claims won by a sidecar that a claim-kill fault then killed at
    ``claim.won``: its claims stored between its armed restart and the kill."""
    out = {}
    for f in faults:
        if f.get("kind") != "claim-kill" or "killed_at" not in f:
            continue
        lo, hi = float(f.get("applied", f["start"])), float(f["killed_at"])
        for key, claim in claims.items():
            if claim.get("instance") == f.get("target") and lo <= float(claim["_time"]) <= hi:
                out[key] = claim
    return out


def _overlapping(ts: list[Touch], lo: float, hi: float) -> list[Touch]:
    return [t for t in ts if t.start <= hi and t.end >= lo]


def offsets_at(faults: Iterable[dict[str, Any]], sidecar: str, at: float) -> float:
    """The clock offset sidecar `sidecar` may have run with around time `at` (0 if none)."""
    for f in faults:
        skewed = f["kind"] == "clock" and f.get("target") == sidecar
        if skewed and f["start"] - 1.0 <= at <= f.get("end", at) + 1.0:
            return float(f.get("offset", 0.0))
    return 0.0


def slots_of(period_s: int, start: float, end: float) -> list[int]:
    """Epoch-ms slots of an every-`period_s`-seconds schedule in [start, end]."""
    first = int(start) + (-int(start)) % period_s
    return [s * 1000 for s in range(first, int(end) + 1, period_s) if start <= s <= end]


def check(history: History) -> Report:
    run = history.run
    report = Report()
    fig = report.figures
    fails = report.failures
    nodes = set(run["nodes"])
    sidecars = list(run["sidecars"])
    settle = float(run["settle"])
    start, end = float(run["window"][0]), float(run["window"][1])
    jobs: dict[str, dict[str, Any]] = run["jobs"]
    ts = touches(history.faults, nodes, history.bucket_leaders)

    operated: dict[str, dict[str, Any]] = run.get("operated") or {}
    all_jobs = {**jobs, **operated, **(run.get("runtime") or {}), **(run.get("locked") or {})}
    # Runs of slots asked for again (backfill, resume --catchup) are checked by
    # check_operated: they run a past slot by design, under their own claim id.
    # Issue 50's kinds are checked by their own rules (tests/nemesis/kinds.py): an
    # every job's slot runs once per instance, a chained job's slot is its leader's.
    every: dict[str, dict[str, Any]] = run.get("every") or {}
    chained: dict[str, dict[str, Any]] = run.get("chained") or {}
    requests = [
        r
        for r in history.requests
        if r.get("slot") is not None
        and r.get("trigger") not in AGAIN
        and r.get("job") not in every
        and r.get("job") not in chained
    ]
    by_run: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in requests:
        by_run[(r["job"], int(r["slot"]), int(r.get("attempt") or 1))].append(r)

    # ---------------------------------------------------------------- the stream
    claims: dict[tuple[str, int, int], dict[str, Any]] = {}
    # Claims of slots asked for again (backfill, catch-up), by their sequence: a
    # taker killed at claim.won must be judged too (docs/GUARANTEES.md).
    again_claims: dict[int, dict[str, Any]] = {}
    # Every stored claim by its token (a lost record names its run's).
    by_token: dict[str, dict[str, Any]] = {}
    results: dict[str, list[dict[str, Any]]] = defaultdict(list)  # by token
    lost: list[dict[str, Any]] = []
    ids: dict[str, int] = defaultdict(int)
    for m in history.stream:
        msg_id = (m.get("headers") or {}).get("Nats-Msg-Id")
        if msg_id:
            ids[msg_id] += 1
        data = m.get("data") or {}
        if not isinstance(data, dict) or data.get("manual"):
            continue
        if m["subject"].endswith(".claims"):
            by_token.setdefault(
                str(data.get("token")), {**data, "_seq": m["seq"], "_time": m["time"]}
            )
            if data.get("job") in every:
                continue  # one claim per instance, no lease: check_every
            if "backfill" in data:
                again_claims[int(m["seq"])] = {**data, "_seq": m["seq"], "_time": m["time"]}
                continue  # a run asked for again: its own id (check_operated)
            key = (data.get("job"), data.get("slot"), int(data.get("attempt") or 1))
            claims.setdefault(key, {**data, "_seq": m["seq"], "_time": m["time"]})  # type: ignore[arg-type]
        elif m["subject"].endswith(".results"):
            rec = {**data, "_seq": m["seq"], "_time": m["time"]}
            if data.get("status") == "lost":
                lost.append(rec)
            else:
                results[str(data.get("token"))].append(rec)
    dup_ids = sorted(k for k, n in ids.items() if n > 1)
    fig["stream_msgs"] = len(history.stream)
    fig["dup_ids"] = len(dup_ids)
    if dup_ids:
        fails.append(f"msg ids stored twice: {dup_ids[:10]}")

    # ---------------------------------------------------------------- doubles, unclaimed
    doubles = []
    for key, reqs in sorted(by_run.items()):
        if len({r["run_id"] for r in reqs}) > 1 or len(reqs) > 1:
            doubles.append((key, [(r["app"], round(r["at"], 3), r["run_id"][:8]) for r in reqs]))
    fig["doubles"] = len(doubles)
    for key, seen in doubles[:10]:
        fails.append(
            f"double: {key[0]} slot {key[1]} attempt {key[2]} ran {len(seen)} times: {seen}"
        )
    unclaimed = []
    for key, reqs in sorted(by_run.items()):
        claim = claims.get(key)
        for r in reqs:
            if claim is None or claim.get("token") != r["run_id"]:
                unclaimed.append(
                    (key, r["app"], r["run_id"][:8], claim and claim.get("token", "")[:8])
                )
    fig["unclaimed"] = len(unclaimed)
    for u in unclaimed[:10]:
        fails.append(f"run without its stored claim (or an acknowledged claim lost): {u}")

    # ---------------------------------------------------------------- late, early
    late, early = [], []
    for (job, slot, attempt), reqs in by_run.items():
        max_late = float(all_jobs[job]["max_late"])
        for r in reqs:
            offset = offsets_at(history.faults, r["app"], r["at"])
            delay = r["at"] - slot / 1000
            if attempt == 1 and delay > max_late + LATE_MARGIN + max(0.0, -offset):
                late.append((job, slot, r["app"], round(delay, 3), offset))
            if delay < -(EARLY_MARGIN + max(0.0, offset)):
                early.append((job, slot, r["app"], round(delay, 3), offset))
    fig["late"] = len(late)
    fig["early"] = len(early)
    for item in sorted(late)[:10]:
        fails.append(
            f"late: {item[0]} slot {item[1]} by {item[2]} arrived {item[3]}s after its slot "
            f"(offset {item[4]:+.2f})"
        )
    for item in sorted(early)[:10]:
        fails.append(
            f"early: {item[0]} slot {item[1]} by {item[2]} arrived {item[3]}s "
            f"(offset {item[4]:+.2f})"
        )
    fig["max_delay_s"] = round(
        max(
            (r["at"] - int(r["slot"]) / 1000 for r in requests if int(r.get("attempt") or 1) == 1),
            default=0.0,
        ),
        3,
    )

    # ---------------------------------------------------------------- claim kills
    killed = claim_kills(history.faults, claims)
    killed_again = claim_kills(history.faults, again_claims)
    fig["claim_kills"] = len(killed) + len(killed_again)
    window_end = float(run["window"][1])
    # Every claim killed before its lease is judged: scheduled, retried, one-off
    # (at), backfilled, and a slot whose run key a backfill holds meanwhile.
    unjudged = [
        (claim.get("job"), claim.get("slot"), claim.get("trigger"), claim.get("backfill"))
        for claim in [*killed.values(), *killed_again.values()]
        if float(claim["_time"]) + CLAIM_KILL_JUDGED < window_end
        and not results.get(str(claim.get("token")))
        and not any(rec.get("token") == claim.get("token") for rec in lost)
    ]
    fig["claim_kills_unjudged"] = len(unjudged)
    fig["claim_kills_again"] = len(killed_again)
    for what in unjudged[:10]:
        fails.append(f"killed before its lease and never recorded: {what}")

    # ---------------------------------------------------------------- slots, misses
    slots = runs = 0
    missed_claim_killed = 0
    missed: list[tuple[str, int]] = []
    missed_quiet: list[tuple[str, int]] = []
    missed_available: list[tuple[str, int]] = []
    missed_no_election: list[tuple[str, int]] = []
    missed_starved: list[tuple[str, int]] = []
    missed_logged: list[tuple[str, int]] = []
    ran = {(job, slot) for (job, slot, attempt) in by_run if attempt == 1}
    for job, spec in jobs.items():
        max_late = float(spec["max_late"])
        for slot in slots_of(int(spec["period_s"]), start, end):
            slots += 1
            if (job, slot) in ran:
                runs += 1
                continue
            missed.append((job, slot))
            if (job, slot, 1) in killed:
                missed_claim_killed += 1  # its winner killed at the claim: recorded lost
                continue
            lo, hi = slot / 1000 - settle, slot / 1000 + max_late
            near = _overlapping(ts, lo, hi)
            if not any(t.cluster for t in near) and any(
                not any(s in t.sidecars for t in near) for s in sidecars
            ):
                missed_quiet.append((job, slot))
            if _claim_possible(near, nodes, sidecars):
                missed_available.append((job, slot))
                if any(t.leader_hit for t in near):
                    continue
                lo_w, hi_w = slot / 1000, hi
                spans = [(a, b, w) for a, b, w in history.leaderless if a < hi_w and b > lo_w]
                if sum(min(b, hi_w) - max(a, lo_w) for a, b, _ in spans) >= (hi_w - lo_w) / 2:
                    missed_logged.append((job, slot))
                    report.notes.append(
                        f"election logged: {job} slot {slot}: no leader "
                        + "; ".join(f"{a:.3f}-{b:.3f} ({w})" for a, b, w in spans)
                    )
                    continue
                winner = claims.get((job, slot, 1), {}).get("instance")
                untouched = [s for s in sidecars if not any(s in t.sidecars for t in near)]
                why = _starved(history.cpu, slot / 1000, hi, winner, untouched)
                if why:
                    missed_starved.append((job, slot))
                    report.notes.append(f"starved: {job} slot {slot}: {why}")
                else:
                    missed_no_election.append((job, slot))
    fig.update(slots=slots, runs=runs, missed=len(missed), missed_available=len(missed_available))
    fig["missed_claim_killed"] = missed_claim_killed
    fig["missed_no_election"] = len(missed_no_election)
    fig["missed_elections_logged"] = len(missed_logged)
    fig["missed_starved"] = len(missed_starved)
    fig["missed_quiet"] = len(missed_quiet)
    for job, slot in missed_quiet[:10]:
        fails.append(f"missed with no fault near: {job} slot {slot}")
    for job, slot in missed_no_election[:10]:
        if (job, slot) not in missed_quiet:
            fails.append(
                f"missed while a claim could be made, with no election nor starvation near: "
                f"{job} slot {slot}"
            )
    stalls = [c["late"] for c in history.cpu if c.get("kind") == "stall"]
    fig["stall_max_s"] = round(max(stalls, default=0.0), 3)
    loads = [c["load"][0] for c in history.cpu if c.get("kind") == "load" and c.get("load")]
    fig["load_max"] = max(loads, default=0.0)

    # ---------------------------------------------------------------- lost records, reruns
    lost_wrong = []
    for rec in lost:
        key = (rec.get("job"), rec.get("slot"), int(rec.get("attempt") or 1))
        # Its run's claim: a slot's, a backfill's or a chained run's (their own ids).
        claim = by_token.get(str(rec.get("token"))) or claims.get(key)  # type: ignore[arg-type]
        own = [x for x in results.get(str(rec.get("token")), []) if x["_seq"] < rec["_seq"]]
        why = ""
        if claim is None or claim.get("token") != rec.get("token"):
            why = "no stored claim with its token"
        elif own:
            why = (
                f"its own {own[0].get('status')} result was stored first "
                f"(seq {own[0]['_seq']} < {rec['_seq']}, "
                f"{float(rec['_time']) - float(own[0]['_time']):.3f}s earlier)"
            )
        else:
            runner = str(rec.get("instance"))
            near = _overlapping(ts, float(claim["_time"]) - 1.0, float(rec["_time"]))
            if not any(t.cluster or runner in t.sidecars for t in near):
                why = "no fault touched the runner or NATS between its claim and the lost record"
        if why:
            lost_wrong.append((key, rec.get("instance"), why))
    fig["lost"] = len(lost)
    fig["lost_wrong"] = len(lost_wrong)
    for wrong in lost_wrong[:10]:
        fails.append(f"wrong lost record: {wrong}")
    reruns = reruns_bad = needless = 0
    for rec in lost:
        lost_job, lost_slot = str(rec.get("job")), int(rec.get("slot") or 0)
        attempt = int(rec.get("attempt") or 1)
        before = by_run.get((lost_job, lost_slot, attempt), [])
        after = by_run.get((lost_job, lost_slot, attempt + 1), [])
        if after:
            reruns += 1
            own = results.get(str(rec.get("token")), [])
            if any(x.get("status") == "succeeded" and x["_seq"] < rec["_seq"] for x in own):
                needless += 1  # the lost run had succeeded, and said so, before it was judged
            if before and max(int(r["fence"]) for r in before) >= min(
                int(r["fence"]) for r in after
            ):
                reruns_bad += 1
                fails.append(
                    f"rerun of {lost_job} slot {lost_slot} has a fence not above the lost run's"
                )
    fig["reruns"] = reruns
    fig["reruns_needless"] = needless
    fig["reruns_bad"] = reruns_bad
    fig["faults"] = len(history.faults)
    check_operated(history, report, ts)
    check_every(history.requests, history.stream, every, report)
    check_chain(history.requests, history.stream, chained, report)
    check_at(history, report)
    check_runtime(history, report, ts)
    return report


# Triggers of a run asked for again (``backfill``, ``resume --catchup``).
AGAIN = ("backfill", "catchup")
# The trigger of a one-off run (``anarchon-sidecar at``).
AT = "at"
# How long after `job remove` answered every untouched sidecar has let the job go:
# docs/CONFIG.md says "taken up by every running sidecar within about a second".
REMOVAL_WINDOW = 1.5


def check_operated(
    history: History,
    report: Report,
    ts: list[Touch],
) -> None:
    """The operated job (pause, skip, resume --catchup, backfill at random moments):

    - each slot has at most one fate message (its claim or skip record, stored
      under ``<job>:<slot>``; a ``<job>:<slot>:s`` record of an older sidecar
      counts too), and never a run and a skip record both;
    - the app sees each slot at most once as scheduled, at most once as
      ``catchup`` and only when its fate is a skip record of a pause (never
      with a scheduled run), and at most once per backfill tag;
    - a slot in the window with no fault near has a fate (it ran or was skipped).
    """
    run = history.run
    operated: dict[str, dict[str, Any]] = run.get("operated") or {}
    fig, fails = report.figures, report.failures
    settle = float(run["settle"])
    start, end = float(run["window"][0]), float(run["window"][1])
    violations: list[str] = []
    for job, spec in operated.items():
        fates: dict[int, list[dict[str, Any]]] = defaultdict(list)
        again_claims: dict[str, dict[str, Any]] = {}
        for m in history.stream:
            data = m.get("data") or {}
            if not m["subject"].endswith(".claims") or not isinstance(data, dict):
                continue
            if data.get("job") != job or data.get("manual") or int(data.get("attempt") or 1) != 1:
                continue
            if data.get("trigger") == AT:
                continue  # a one-off run (check_at)
            if "backfill" in data:
                again_claims[str(data.get("token"))] = data
            elif isinstance(data.get("slot"), int):
                fates[int(data["slot"])].append(data)
        calls: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in history.requests:
            if r.get("job") == job and r.get("slot") is not None and r.get("trigger") != AT:
                calls[int(r["slot"])].append(r)
        skip_records = runs = catchups = backfills = undecided = 0
        for slot in sorted(set(fates) | set(calls)):
            msgs, reqs = fates.get(slot, []), calls.get(slot, [])
            skipped = [d["skipped"] for d in msgs if "skipped" in d]
            scheduled = [r for r in reqs if r.get("trigger") not in AGAIN]
            caught = [r for r in reqs if r.get("trigger") == "catchup"]
            filled = [r for r in reqs if r.get("trigger") == "backfill"]
            skip_records += bool(skipped)
            runs += len(scheduled)
            catchups += len(caught)
            backfills += len(filled)
            where = f"{job} slot {slot}"
            if len(msgs) > 1:
                violations.append(f"{where}: {len(msgs)} fate messages")
            if skipped and scheduled:
                violations.append(f"{where}: a skip record ({skipped[0]}) and a run")
            if len(scheduled) > 1:
                violations.append(f"{where}: run {len(scheduled)} times as scheduled")
            if caught and (len(caught) > 1 or scheduled or skipped not in ([], ["paused"])):
                violations.append(
                    f"{where}: caught up {len(caught)} time(s) though its fate is "
                    f"{skipped or 'a run' if msgs else 'none'} ({len(scheduled)} scheduled run(s))"
                )
            tags = Counter(
                str((again_claims.get(str(r.get("run_id"))) or {}).get("backfill")) for r in filled
            )
            if any(n > 1 for n in tags.values()):
                violations.append(f"{where}: backfilled twice under one tag {dict(tags)}")
            for r in caught + filled:
                if str(r.get("run_id")) not in again_claims:
                    violations.append(f"{where}: a {r.get('trigger')} run without its claim")
        for slot in slots_of(int(spec["period_s"]), start, end):
            if fates.get(slot) or calls.get(slot):
                continue
            near = _overlapping(ts, slot / 1000 - settle, slot / 1000 + float(spec["max_late"]))
            if not near:
                undecided += 1
                violations.append(f"{job} slot {slot}: no fate though no fault was near")
        fig[f"{job}_slots"] = len(slots_of(int(spec["period_s"]), start, end))
        fig[f"{job}_runs"] = runs
        fig[f"{job}_skip_records"] = skip_records
        fig[f"{job}_catchups"] = catchups
        fig[f"{job}_backfills"] = backfills
        fig[f"{job}_undecided_quiet"] = undecided
    fig["operator_actions"] = len(history.ops)
    fig["operator_failed"] = sum(1 for o in history.ops if not o.get("ok"))
    fig["fate_violations"] = len(violations)
    fails.extend(violations[:20])


def check_at(history: History, report: Report) -> None:
    """One-off runs (``at``, queued and cancelled by the operator):

    - a one-off is claimed (``<job>:<ms>:at``, trigger ``at``) at most once, and
      the app sees it at most once (doubles, late, early and a run without its
      claim are judged with every run by ``check``);
    - nothing runs as a one-off that was not queued (an ``at`` command, answered
      or not);
    - a one-off whose cancel removed it (the cancel's answer listed it) never
      runs, unless its claim was stored before the cancel answered: a claim
      stored after that is a failure.

    Liveness (reported): **at_missed**, queued and not cancelled one-offs whose
    instant fell in the window and that were never claimed (a pause drops them
    by design, faults may).
    """
    fig, fails = report.figures, report.failures
    start, end = float(history.run["window"][0]), float(history.run["window"][1])
    queued: dict[tuple[str, int], dict[str, Any]] = {}
    cancelled: dict[tuple[str, int], dict[str, Any]] = {}
    for o in history.ops:
        p = o.get("params") or {}
        if "slot" not in p:
            continue
        key = (str(p.get("job")), int(p["slot"]))
        if o.get("action") == "at":
            queued.setdefault(key, o)
        elif o.get("action") == "cancel-at" and o.get("ok") and key[1] in _gone(o):
            cancelled[key] = o
    claims: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for m in history.stream:
        data = m.get("data") or {}
        if not m["subject"].endswith(".claims") or not isinstance(data, dict):
            continue
        if data.get("trigger") == AT and isinstance(data.get("slot"), int):
            claims[(str(data.get("job")), int(data["slot"]))].append({**data, "_time": m["time"]})
    calls: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in history.requests:
        if r.get("trigger") == AT and r.get("slot") is not None:
            calls[(str(r["job"]), int(r["slot"]))].append(r)
    violations: list[str] = []
    for key in sorted(set(claims) | set(calls)):
        where = f"one-off {key[0]} at {key[1]}"
        stored, seen = claims.get(key, []), calls.get(key, [])
        if key not in queued:
            violations.append(f"{where}: ran though nobody queued it")
        if len(stored) > 1:
            violations.append(f"{where}: claimed {len(stored)} times")
        if len(seen) > 1:
            apps = [(r["app"], round(float(r["at"]), 3)) for r in seen]
            violations.append(f"{where}: the app saw it {len(seen)} times: {apps}")
        cancel = cancelled.get(key)
        if cancel is not None:
            first = min((float(c["_time"]) for c in stored), default=None)
            if first is None or first > float(cancel["done"]):
                violations.append(
                    f"{where}: ran though cancelled ({float(cancel['at']):.3f} to "
                    f"{float(cancel['done']):.3f}), its claim stored "
                    + (f"at {first:.3f}" if first is not None else "nowhere")
                )
    fig["at_queued"] = sum(1 for o in queued.values() if o.get("ok"))
    fig["at_cancelled"] = len(cancelled)
    fig["at_ran"] = len(set(claims) | set(calls))
    fig["at_missed"] = sum(
        1
        for key in queued
        if key not in cancelled
        and key not in claims
        and key not in calls
        and start <= key[1] / 1000 <= end
    )
    fig["at_violations"] = len(violations)
    fails.extend(violations[:20])


def _gone(cancel: dict[str, Any]) -> list[int]:
    """The one-offs a ``cancel-at`` answered it removed."""
    detail = cancel.get("detail")
    return list(detail.get("gone") or []) if isinstance(detail, dict) else []


def check_runtime(history: History, report: Report, ts: list[Touch]) -> None:
    """A job of the state bucket (``job add/update/remove`` by the operator):

    - its slots run at most once each (``check``'s doubles, as for every job);
    - no slot before the job was first added, nor between a removal and the next
      add, runs: a slot later than ``job remove``'s answer plus REMOVAL_WINDOW
      is a failure when it ran on a sidecar that nothing touched from the
      removal to the slot's claim window (a sidecar paused, cut off or
      restarting then, or NATS itself, may take the removal up late: counted
      ``<job>_after_removal_excused``);
    - a sidecar never claims the job after it logged letting it go
      ("left the state bucket") and before it logged taking it up again,
      whatever the faults: a failure.
    """
    fig, fails = report.figures, report.failures
    runtime: dict[str, dict[str, Any]] = history.run.get("runtime") or {}
    violations: list[str] = []
    for job, spec in runtime.items():
        mine = [o for o in history.ops if (o.get("params") or {}).get("job") == job]
        adds = sorted(float(o["at"]) for o in mine if o.get("action") == "job-add")
        removals = sorted(
            float(o["done"])
            for o in mine
            if o.get("action") == "job-remove"
            and o.get("ok")
            and (o.get("detail") or {}).get("what") == "removed"
        )
        tokens: dict[str, float] = {}
        for m in history.stream:
            data = m.get("data") or {}
            ours = isinstance(data, dict) and data.get("job") == job and "token" in data
            if ours and m["subject"].endswith(".claims"):
                tokens[str(data["token"])] = float(m["time"])
        excused = runs = 0
        for r in history.requests:
            if r.get("job") != job or r.get("slot") is None:
                continue
            runs += 1
            slot_s, app = int(r["slot"]) / 1000, str(r["app"])
            where = f"{job} slot {int(r['slot'])} on {app}"
            claimed = tokens.get(str(r.get("run_id")), float(r["at"]))
            events = [e for e in history.bucket_job_logs.get(app, []) if e[1] == job]
            before = [kind for at, _, kind in events if at < claimed - 0.05]
            if before and before[-1] == "left":
                violations.append(f"{where}: claimed after {app} logged letting the job go")
                continue
            last_add = max((a for a in adds if a <= slot_s), default=None)
            if last_add is None:
                violations.append(f"{where}: ran though its instant came before any job add")
                continue
            gone = [x for x in removals if x >= last_add and x + REMOVAL_WINDOW < slot_s]
            if not gone:
                continue
            hi = slot_s + float(spec["max_late"])
            near = _overlapping(ts, gone[0] - REMOVAL_WINDOW, hi)
            if any(t.cluster or app in t.sidecars for t in near):
                excused += 1
                report.notes.append(
                    f"removal taken up late under a fault: {where}, removed {gone[0]:.3f}"
                )
                continue
            # What the runner said of the job around the removal (the evidence a
            # failure needs: was the removal taken up late, or the job put back?).
            said = ", ".join(
                f"{kind} {at - gone[0]:+.2f}s" for at, _, kind in events if abs(at - gone[0]) < 10
            )
            violations.append(
                f"{where}: ran {slot_s - gone[0]:.3f}s after `job remove` answered "
                f"(window {REMOVAL_WINDOW:g}s), nothing touched {app} or NATS "
                f"({app} logged, from the removal: {said or 'nothing'})"
            )
        fig[f"{job}_runs"] = runs
        fig[f"{job}_adds"] = len(adds)
        fig[f"{job}_removals"] = len(removals)
        fig[f"{job}_after_removal_excused"] = excused
    fig["runtime_violations"] = len(violations)
    fails.extend(violations[:20])


def _starved(
    cpu: list[dict[str, Any]], lo: float, hi: float, winner: str | None, claimers: list[str]
) -> str | None:
    """The evidence that [lo, hi] lacked CPU (see ``missed_starved``); None without it."""
    need = STARVED_SHARE * (hi - lo)
    host = stalled(cpu, lo, hi)
    if host >= need:
        return f"the harness's sampling thread could not run for {host:.2f}s of {hi - lo:g}s"
    who = [winner] if winner else claimers
    waits = {s: waited(cpu, s, lo, hi) for s in who}
    if waits and min(waits.values()) >= need:
        role = f"its winner {winner}" if winner else "every sidecar that could claim"
        listed = ", ".join(f"{s} {w:.2f}s" for s, w in sorted(waits.items()))
        return f"{role} waited on the run queue for {listed} of {hi - lo:g}s"
    return None


def _claim_possible(near: list[Touch], nodes: set[str], sidecars: list[str]) -> bool:
    """Some sidecar and two servers up, unpaused and connected for the whole window."""
    down_nodes = {n for t in near for n in t.nodes}
    process_sidecars = {s for t in near for s in t.sidecars if not t.blocked}
    blocked = {p for t in near for p in t.blocked}
    for s in sidecars:
        if s in process_sidecars:
            continue
        for m in itertools.combinations(sorted(nodes - down_nodes), 2):
            group = (s, *m)
            if not any(frozenset(pair) in blocked for pair in itertools.combinations(group, 2)):
                return True
    return False


SPIN = re.compile(r"^(\S+ \d\d:\d\d:\d\d),\d+ INFO sidecar\.lease: .*a spurious CAS conflict")
DRAIN = re.compile(r"waiting up to \S+ for (\d+) running trigger")


def log_figures(directory: Path) -> dict[str, int]:
    """What the sidecars' own logs show (figures, never failures by themselves).

    - **tracebacks**: Python tracebacks in any sidecar log.
    - **cas_spin_per_s**: the most "spurious CAS conflict" lines one sidecar
      wrote within one second (a lease renewal retried without a pause).
    - **running_at_stop**: the most runs one sidecar still waited for when it
      was stopped at the end (a lease run takes 2 s; more than one or two means
      runs whose task never ended).
    """
    tracebacks = spin = running = 0
    for path in sorted(directory.glob("s*.log")):
        per_second: dict[str, int] = defaultdict(int)
        text = path.read_text(errors="replace")
        tracebacks += text.count("Traceback (most recent call last)")
        for line in text.splitlines():
            if m := SPIN.match(line):
                per_second[m.group(1)] += 1
            elif m := DRAIN.search(line):
                running = max(running, int(m.group(1)))
        spin = max([spin, *per_second.values()])
    return {"tracebacks": tracebacks, "cas_spin_per_s": spin, "running_at_stop": running}


def summary(report: Report) -> str:
    order = [
        "slots",
        "runs",
        "missed",
        "missed_available",
        "missed_no_election",
        "missed_elections_logged",
        "missed_starved",
        "missed_quiet",
        "doubles",
        "late",
        "early",
        "unclaimed",
        "dup_ids",
        "lost",
        "lost_wrong",
        "reruns",
        "reruns_needless",
        "reruns_bad",
        "claim_kills",
        "claim_kills_unjudged",
        "missed_claim_killed",
        "faults",
        "ops_slots",
        "ops_runs",
        "ops_skip_records",
        "ops_catchups",
        "ops_backfills",
        "ops_undecided_quiet",
        "operator_actions",
        "operator_failed",
        "fate_violations",
        "at_queued",
        "at_cancelled",
        "at_ran",
        "at_missed",
        "at_violations",
        "rt_runs",
        "rt_adds",
        "rt_removals",
        "rt_after_removal_excused",
        "runtime_violations",
        "every_pairs",
        "every_slots",
        "every_doubles",
        "every_foreign",
        "chain_fired",
        "chain_ran",
        "chain_missed",
        "chain_doubles",
        "chain_wrong",
        "stream_msgs",
        "max_delay_s",
        "tracebacks",
        "cas_spin_per_s",
        "running_at_stop",
        "stall_max_s",
        "load_max",
    ]
    return " ".join(f"{k}={report.figures[k]}" for k in order if k in report.figures)
