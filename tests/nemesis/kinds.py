"""The checker's rules for issue 50's job kinds (called by checker.check).

``run.json`` names them: ``every`` (``run_on: every`` jobs: period, max_late)
and ``chained`` (jobs run ``after`` another: the job followed, ``on``, and the
followed job's ``retry_max``).

Safety figures (each must be 0):

- **every_doubles**: an (every job, slot, instance) whose app got the request
  more than once (exactly once per instance per slot broken).
- **every_foreign**: a request of such a job that another sidecar sent (its
  ``X-Anarchon-Instance`` is not the app's own sidecar), or whose run id is
  not the token of the stored claim ``<job>:<slot>:every:<instance>``.
- **chain_doubles**: a slot of the followed job after which the chained job
  ran more than once (one B per A run broken: a retried or lost-then-rerun
  A fires B at most once).
- **chain_wrong**: a chained run whose ``X-Anarchon-After-Run`` names no
  stored final result of the followed job that ``on`` fires for (an attempt a
  retry follows, a status ``on`` does not take), or whose run id is not the
  token of the stored claim ``<B>:after:<A>:<slot>``.

Liveness (reported): **every_pairs** (instance-slot pairs run),
**every_slots**, **chain_fired** (final runs of A that fire B),
**chain_ran** (of those, followed by B), **chain_missed**.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Protocol


class _Report(Protocol):
    figures: dict[str, Any]
    failures: list[str]


def _final(status: str, attempt: int, retry_max: int) -> bool:
    """sidecar/run/chains.py ``final`` for a job with ``on_lost: rerun`` (lease's)."""
    if status == "succeeded":
        return True
    return status in ("failed", "lost") and attempt >= 1 + retry_max


def _firing(res: dict[str, Any], on: str, retry_max: int) -> bool:
    """Whether result `res` of the followed job fires a job after it ``on`` this."""
    status = str(res.get("status"))
    return _final(status, int(res.get("attempt") or 1), retry_max) and _fires(on, status)


def _fires(on: str, status: str) -> bool:
    if status == "succeeded":
        return on in ("success", "always")
    return status in ("failed", "lost") and on in ("failure", "always")


def check_every(
    requests: list[dict[str, Any]],
    stream: list[dict[str, Any]],
    every: dict[str, dict[str, Any]],
    report: _Report,
) -> None:
    fig, fails = report.figures, report.failures
    tokens: dict[str, str] = {}  # msg id -> the stored claim's token
    for m in stream:
        msg_id = (m.get("headers") or {}).get("Nats-Msg-Id") or ""
        data = m.get("data") or {}
        if m["subject"].endswith(".claims") and isinstance(data, dict):
            tokens.setdefault(msg_id, str(data.get("token")))
    doubles, foreign = [], []
    pairs: Counter[tuple[str, int, str]] = Counter()
    for r in requests:
        if r.get("job") not in every or r.get("slot") is None:
            continue
        key = (str(r["job"]), int(r["slot"]), str(r["app"]))
        pairs[key] += 1
        claim_token = tokens.get(f"{key[0]}:{key[1]}:every:{key[2]}")
        if r.get("instance") != r["app"] or claim_token != r.get("run_id"):
            foreign.append((key, r.get("instance"), str(r.get("run_id"))[:8]))
    doubles = [(key, n) for key, n in sorted(pairs.items()) if n > 1]
    fig["every_pairs"] = len(pairs)
    fig["every_slots"] = len({(job, slot) for job, slot, _ in pairs})
    fig["every_doubles"] = len(doubles)
    fig["every_foreign"] = len(foreign)
    for key, n in doubles[:10]:
        fails.append(f"every: {key[0]} slot {key[1]} ran {n} times on {key[2]}")
    for item in foreign[:10]:
        fails.append(f"every: a run not its instance's own claim: {item}")


def check_chain(
    requests: list[dict[str, Any]],
    stream: list[dict[str, Any]],
    chained: dict[str, dict[str, Any]],
    report: _Report,
) -> None:
    fig, fails = report.figures, report.failures
    tokens: dict[str, str] = {}
    # A -> token -> its results (a lost record and the run's own may both be stored)
    finals: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for m in stream:
        msg_id = (m.get("headers") or {}).get("Nats-Msg-Id") or ""
        data = m.get("data") or {}
        if not isinstance(data, dict) or data.get("manual"):
            continue
        if m["subject"].endswith(".claims"):
            tokens.setdefault(msg_id, str(data.get("token")))
        elif m["subject"].endswith(".results"):
            finals[str(data.get("job"))][str(data.get("token"))].append(data)
    doubles, wrong = [], []
    fired = ran = 0
    missed: list[tuple[str, int]] = []
    for job, spec in chained.items():
        prior, on, retry_max = str(spec["after"]), str(spec["on"]), int(spec.get("retry_max", 0))
        runs = [r for r in requests if r.get("job") == job and r.get("slot") is not None]
        per_slot = Counter(int(r["slot"]) for r in runs)
        doubles += [(job, slot, n) for slot, n in sorted(per_slot.items()) if n > 1]

        for r in runs:
            followed = finals[prior].get(str(r.get("after_run"))) or []
            ok = any(
                int(res.get("slot") or -1) == int(r["slot"]) and _firing(res, on, retry_max)
                for res in followed
            ) and tokens.get(f"{job}:after:{prior}:{r['slot']}") == r.get("run_id")
            if not ok:
                wrong.append((job, int(r["slot"]), str(r.get("after_run"))[:8]))
        firing = {
            int(res.get("slot") or 0)
            for results in finals[prior].values()
            for res in results
            if _firing(res, on, retry_max)
        }
        fired += len(firing)
        ran += len(firing & set(per_slot))
        missed += [(job, slot) for slot in sorted(firing - set(per_slot))]
    fig["chain_fired"] = fired
    fig["chain_ran"] = ran
    fig["chain_missed"] = len(missed)
    fig["chain_doubles"] = len(doubles)
    fig["chain_wrong"] = len(wrong)
    for job, slot, n in doubles[:10]:
        fails.append(f"chain: {job} ran {n} times after the run of slot {slot}")
    for item in wrong[:10]:
        fails.append(f"chain: a run after no final run that fires it, or unclaimed: {item}")
