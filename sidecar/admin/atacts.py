"""One-off runs (``at.<job>``) from the page and its API, and what ``at`` shares with them.

The page and its API act on the sidecar's own bucket (``act``); the command
``at`` on a connection of its own (sidecar/ops/atops.py). Both change
``at.<job>`` through sidecar/run/atqueue.py, say the same words (here) and
write each act to ``actions.<job>`` (sidecar/admin/actions.py) with ``via``
``cli``, ``page`` or ``api``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from nats.js.kv import KeyValue

from sidecar.config.load import JobConfig
from sidecar.core.clock import rfc3339
from sidecar.run.atqueue import cancel, queue
from sidecar.when.atkey import AtRun, instant_problem, on_schedule

log = logging.getLogger(__name__)


def action_entry(
    action: str, by: str, where: str, via: str, instance: str, detail: str
) -> dict[str, Any]:
    """An ``actions.<job>`` entry (sidecar/admin/actions.py)."""
    return {
        "at": rfc3339(time.time()),
        "by": by,
        "action": action,
        "from": where,
        "via": via,
        "instance": instance,
        "detail": detail,
    }


def queued_detail(run: AtRun) -> str:
    return f"one-off run at {rfc3339(run.slot / 1000)}" + (f": {run.reason}" if run.reason else "")


def nothing_to_cancel(job: str, text: str) -> str:
    """Why a cancel cancelled nothing: no run pending at that time (or none at all)."""
    if text.strip() == "all":
        return f"{job}: no one-off run pending, so none was cancelled"
    return f"{job}: no one-off run pending at {text.strip()}, so none was cancelled"


def too_late(job: str, late: list[AtRun]) -> str:
    """Why a cancel did not cancel: a sidecar had started claiming them."""
    return (
        f"{job}: too late to cancel "
        + ", ".join(
            f"the one-off run at {rfc3339(r.slot / 1000)} ({r.claiming} is claiming it)"
            for r in late
        )
        + "; `history` shows its run"
    )


def cancelled_detail(gone: list[AtRun]) -> str:
    return "cancelled one-off run(s) at " + ", ".join(rfc3339(r.slot / 1000) for r in gone)


async def audit(kv: KeyValue, job: str, entry: dict[str, Any]) -> None:
    """Best effort from the CLI: the act is done; a lost audit line is said, not fatal."""
    from sidecar.admin.actions import record_action

    try:
        await record_action(kv, job, entry)
    except Exception as exc:
        log.warning("%s: the act was not written to actions.%s: %r", job, job, exc)


# ---------------------------------------------------------------------- the page and API


def _slot_of(text: str, now: float) -> int:
    """A one-off's instant from a form: epoch ms, RFC 3339, or a duration from now."""
    from sidecar.config.instants import instant_of

    text = text.strip()
    # epoch ms, as --list --json and the page give it; ASCII digits (int() reads others)
    if text.isascii() and text.isdigit() and len(text) >= 12:
        return int(text)
    return round(instant_of(text, now) * 1000)


async def act(
    kv: KeyValue, job: JobConfig, action: str, form: dict[str, str], by: str
) -> tuple[int, str, dict[str, Any]]:
    """``POST .../jobs/<job>/at`` (fields ``time``, ``reason``) and ``.../cancel-at``
    (``time``: the instant, or ``all``): (HTTP status, the action's detail, answer)."""
    now = time.time()
    text = form.get("time", "").strip()
    if not text:
        return 400, "", {"error": "time: RFC 3339 (2026-12-24T08:00:00Z) or a duration (30m)"}
    if action == "cancel-at" and text == "all":
        slots: set[int] | None = None
    else:
        try:
            slot = _slot_of(text, now)
        except ValueError as exc:
            return 400, "", {"error": f"time: {exc}"}
        slots = {slot}
    if action == "cancel-at":
        gone, late = await cancel(kv, job.name, slots)
        if not gone:
            if late:
                return 409, "", {"error": too_late(job.name, late)}
            return 409, "", {"error": nothing_to_cancel(job.name, text)}
        answer = {"cancelled": [r.as_dict() for r in gone], "too_late": [r.as_dict() for r in late]}
        return 200, cancelled_detail(gone), answer
    if why := instant_problem(slot, now, on_schedule(job.schedule.next_slot, slot)):
        return 400, "", {"error": f"time: {why}"}
    try:
        done = await queue(kv, job, slot, by, form.get("reason", ""))
    except ValueError as exc:
        return 409, "", {"error": str(exc)}
    detail = queued_detail(done.run) + ("" if done.new else " (queued already; kept)")
    return 200, detail, {"queued": done.run.as_dict(), "new": done.new}
