"""``run_on: every`` in ``status --json`` and on the page: each instance's last run of
the job, and the slots an instance missed (sidecar/store/missed.py's rule).

Fed with (slot, instance, status) of the job's per-instance claims: the page's
recent strip, or the whole history (``status``, sidecar/ops/fleetview.py).
"""

from __future__ import annotations

from typing import Any

from sidecar.core.clock import rfc3339
from sidecar.store.missed import Seen, missed
from sidecar.store.runs import Run


def per_instance(runs: list[tuple[int, str, str]], now_ms: int, max_late_ms: int) -> dict[str, Any]:
    """``instances`` (each instance's newest slot and its status) and ``missed`` (the
    slots an instance missed, newest first) of (slot, instance, status) triples."""
    newest: dict[str, tuple[int, str]] = {}
    for slot, instance, status in runs:
        if instance not in newest or slot > newest[instance][0]:
            newest[instance] = (slot, status)
    gaps = missed([Seen(slot, instance) for slot, instance, _ in runs], now_ms, max_late_ms)
    return {
        "instances": {
            instance: {"slot": rfc3339(slot / 1000), "status": status}
            for instance, (slot, status) in sorted(newest.items())
        },
        "missed": [{"slot": rfc3339(g.slot / 1000), "instance": g.instance} for g in gaps],
    }


def of_runs(runs: list[Run], now_ms: int, max_late_ms: int) -> dict[str, Any]:
    """``per_instance`` of a history's per-instance runs."""
    triples = [(run.slot, run.instance, run.status) for run in runs if run.every]
    return per_instance(triples, now_ms, max_late_ms)
