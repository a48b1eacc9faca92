"""What the scenarios share: job configs, counting runs per slot, summing metrics."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.support import RecordingApp, Request, Sidecar, StoredMsg, wait_for


def every_second(name: str, **extra: Any) -> dict[str, Any]:
    """A job that fires every second (6-field cron, seconds first)."""
    return {"name": name, "schedule": "* * * * * *", "jitter": "300ms", "max_late": "5s", **extra}


def config(
    servers: Sequence[str], app: RecordingApp, jobs: list[dict[str, Any]], **nats: Any
) -> dict[str, Any]:
    return {
        "nats": {"servers": list(servers), "history_size": 1000, **nats},
        "target": {"url": app.url, "timeout": "10s"},
        "shutdown_grace": "10s",
        "jobs": jobs,
    }


def next_second_ms(after: float | None = None) -> int:
    """The first whole second (epoch ms) strictly after `after` (default: now)."""
    return (math.floor(after if after is not None else time.time()) + 1) * 1000


def slot_of(request: Request) -> int:
    return int(request.headers["X-Anarchon-Slot"])


@dataclass
class Tally:
    """Runs of some jobs over a window of slots (every second, both ends included)."""

    slots: int = 0
    runs: int = 0
    doubles: dict[tuple[str, int], int] = field(default_factory=dict)
    missing: list[tuple[str, int]] = field(default_factory=list)

    @property
    def misses(self) -> int:
        return len(self.missing)


def runs_by_slot(app: RecordingApp, job: str) -> Counter[int]:
    return Counter(slot_of(r) for r in app.requests_for(f"/jobs/{job}"))


def tally(
    app: RecordingApp, jobs: Iterable[str], start_ms: int, end_ms: int, step_ms: int = 1000
) -> Tally:
    """Slots in [start_ms, end_ms], runs of them, doubles (anywhere) and misses."""
    out = Tally()
    for job in jobs:
        seen = runs_by_slot(app, job)
        out.doubles.update({(job, s): n for s, n in seen.items() if n > 1})
        for slot in range(start_ms, end_ms + 1, step_ms):
            out.slots += 1
            if seen[slot]:
                out.runs += 1
            else:
                out.missing.append((job, slot))
    return out


def wait_all_ran(
    app: RecordingApp,
    jobs: Iterable[str],
    start_ms: int,
    end_ms: int,
    timeout: float,
    step_ms: int = 1000,
) -> bool:
    """Wait until every slot in the window ran; False (no error) when the deadline passes."""
    names = list(jobs)
    try:
        wait_for(
            lambda: not tally(app, names, start_ms, end_ms, step_ms).missing,
            timeout,
            interval=0.2,
            what="every slot of the window to run",
        )
    except AssertionError:
        return False
    return True


def metric_sum(procs: Iterable[Sidecar], name: str, labels: dict[str, str] | None = None) -> float:
    """The sum over sidecars of every sample of `name` matching `labels` (absent counts 0)."""
    return sum(metric_total(p, name, labels) for p in procs)


def metric_total(proc: Sidecar, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of every sample of `name` (all label values) matching `labels` on one sidecar."""
    from prometheus_client.parser import text_string_to_metric_families

    _, text = proc.get("/metrics")
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(
                sample.labels.get(k) == v for k, v in (labels or {}).items()
            ):
                total += float(sample.value)
    return total


def claims_and_results(stored: list[StoredMsg]) -> tuple[list[StoredMsg], list[StoredMsg]]:
    claims = [m for m in stored if m.subject.endswith(".claims")]
    results = [m for m in stored if m.subject.endswith(".results")]
    return claims, results


def unclaimed_runs(stored: list[StoredMsg], requests: Iterable[Request]) -> list[str]:
    """App requests that do not carry the token of their slot's stored claim (should be none).

    Also asserts that no msg id was stored twice (JetStream's de-duplication).
    """
    claims, _ = claims_and_results(stored)
    ids = Counter(m.headers.get("Nats-Msg-Id") for m in claims)
    assert max(ids.values(), default=1) == 1, "a msg id stored twice"
    winner = {
        (m.data.get("job"), m.data.get("slot")): m.data.get("token")
        for m in claims
        if not m.data.get("manual")
    }
    return [
        f"{r.headers['X-Anarchon-Job']}:{slot_of(r)}"
        for r in requests
        if winner.get((r.headers["X-Anarchon-Job"], slot_of(r))) != r.headers["X-Anarchon-Run-Id"]
    ]


def lateness(app: RecordingApp, jobs: Iterable[str]) -> list[float]:
    """Arrival time minus slot time, seconds, for every request of the jobs."""
    return [r.at - slot_of(r) / 1000 for job in jobs for r in app.requests_for(f"/jobs/{job}")]
