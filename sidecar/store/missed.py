"""``run_on: every``: which instance missed which slot, from the claims alone (pure).

Each instance claims its own (job, slot, instance) (sidecar/core/wire.py,
``every_msg_id``), and records a kept slot (paused, excluded, skip) under the same
id: so an instance that was there for a slot has a claim of it. The rule
(docs/GUARANTEES.md, "Jobs on every instance"):

- only slots whose window is over (slot + max_late in the past) are judged,
  and only slots some instance claimed (a slot nobody claimed is the fleet's
  gap, shown as such by the metrics, not one instance's);
- an instance belongs to the job from its oldest claim in the history read: a
  replica added later is not missing the slots before it came;
- it missed a judged slot it has no claim of, when it claimed a later slot (it
  was away and came back), or when the slot is among the first ``TRAIL``
  judged slots after its newest claim (it is away now: shown missed for a
  while, then it counts as gone: a replica scaled away for good is not missing
  for ever).

Presence (``instance.<id>``) is not used: it says who is alive now, not who was
at a slot past; the instance's own claims before and after a slot do.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.clock import rfc3339
from sidecar.store.runs import Run

# An instance with no claim since is shown missed for this many judged slots.
TRAIL = 10
MISSED = "missed"  # history's status of a slot an instance missed (never stored)


@dataclass(frozen=True)
class Seen:
    """One per-instance claim: its slot (epoch ms) and its instance."""

    slot: int
    instance: str


def missed(claims: list[Seen], now_ms: int, max_late_ms: int) -> list[Seen]:
    """The (slot, instance) pairs missed, newest slot first, instances sorted."""
    have: dict[str, set[int]] = {}
    for seen in claims:
        have.setdefault(seen.instance, set()).add(seen.slot)
    judged = sorted({s.slot for s in claims if s.slot + max_late_ms < now_ms})
    out: list[Seen] = []
    for instance, slots in have.items():
        first, last = min(slots), max(slots)
        after = 0
        for slot in judged:
            if slot <= first or slot in slots:
                continue
            if slot > last:
                after += 1
                if after > TRAIL:
                    break
            out.append(Seen(slot, instance))
    return sorted(out, key=lambda s: (-s.slot, s.instance))


def with_missed(runs: list[Run], now_ms: int, max_late_ms: int) -> list[Run]:
    """`runs` (newest first) with a ``missed`` row for each slot an instance missed."""
    seen = [Seen(run.slot, run.instance) for run in runs if run.every]
    rows = [
        Run(
            job=runs[0].job,
            slot=gap.slot,
            token="",
            instance=gap.instance,
            manual=False,
            status=MISSED,
            scheduled_at=rfc3339(gap.slot / 1000),
            claimed_at="",
            started_at=None,
            finished_at=None,
            duration_ms=None,
            http_status=None,
            error=f"{gap.instance} did not claim this slot within max_late (it was away)",
            every=True,
        )
        for gap in missed(seen, now_ms, max_late_ms)
    ]
    if not rows:
        return runs
    return sorted([*runs, *rows], key=lambda run: (run.slot, run.seq), reverse=True)
