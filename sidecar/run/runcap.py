"""``jobs[].max_runs``: a fleet-wide count of a job's runs, kept in the state bucket.

The key ``count.<job>`` holds ``{"runs": N, "slots": [...], "max_runs", "by", "at"}``.
The one sidecar that won a slot's claim (attempt 1) takes the slot's number
(``take``) by compare-and-set on that key just *before* it triggers the app,
once it holds the run's lease (a slot ``overlap: skip`` keeps from running is
not counted): it reads the key, and when ``runs`` is below ``max_runs`` writes
``runs + 1`` with the slot appended, expecting the revision it read. Two winners of two
slots racing (catch-up, a slow replica) conflict; the loser reads again. So:

* each slot is counted at most once (only its claim's winner counts it, and
  ``slots`` makes a write whose answer was lost idempotent: a slot already
  listed is its own count);
* never more than ``max_runs`` slots are triggered: a winner that finds the
  count full does not run its slot (it is recorded ``skipped``, reason
  ``max_runs``), and one that cannot reach the key does not run it either
  (reason ``bucket``). A winner that dies between the count and the trigger
  leaves a counted slot that never ran: the cap errs on the side of fewer.

Retries and reruns of a counted slot are the same run (not counted again);
backfills and manual runs are neither counted nor capped. Deleting the key
(``nats kv del``) starts the count again. Every sidecar also reads the key
from its watch of the bucket (``spent``), so a job whose count is full is not
claimed at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.core.clock import rfc3339
from sidecar.core.errors import CasConflict, CountUnavailable

if TYPE_CHECKING:
    from sidecar.store.kv import Keys
    from sidecar.store.state import View

# A value's ``slots`` keeps this many of the last counted slots: enough to
# recognise a write of one's own answered late, whatever the others did since.
KEEP_SLOTS = 64
# Compare-and-set rounds before giving up (each loser of a round reads again).
ROUNDS = 50


def count_key(job: str) -> str:
    return f"count.{job}"


def runs_of(value: dict[str, Any] | None) -> int:
    """The count a ``count.<job>`` value holds (0 for anything unreadable)."""
    runs = (value or {}).get("runs")
    if isinstance(runs, int) and not isinstance(runs, bool) and runs >= 0:
        return runs
    return 0


def slots_of(value: dict[str, Any] | None) -> list[int]:
    slots = (value or {}).get("slots")
    if not isinstance(slots, list):
        return []
    return [s for s in slots if isinstance(s, int) and not isinstance(s, bool)]


def counted(view: View, job: str) -> int:
    """The job's run count as this sidecar's view of the bucket has it."""
    entry = view.keys.get(count_key(job))
    return runs_of(entry.value if entry is not None else None)


def spent(view: View, job: str, max_runs: int | None) -> bool:
    """Whether the view says the job has had its ``max_runs`` runs."""
    return max_runs is not None and counted(view, job) >= max_runs


async def take(
    keys: Keys, job: str, slot: int, max_runs: int, instance: str, now: float
) -> int | None:
    """Count ``slot`` as a run of ``job``: its number (1..max_runs), or None when the
    count is full. CountUnavailable when the key cannot be read or written."""
    key = count_key(job)
    for _ in range(ROUNDS):
        try:
            last = await keys.last(key)
        except Exception as exc:
            raise CountUnavailable(f"{key} not read: {exc!r}") from exc
        revision, value = last if last is not None else (0, None)
        runs, slots = runs_of(value), slots_of(value)
        if slot in slots:
            # Counted already: our own write, answered too late (or a second winner
            # of the slot, which the claim's dedupe makes impossible).
            return runs - (len(slots) - 1 - slots.index(slot))
        if runs >= max_runs:
            return None
        new = {
            "runs": runs + 1,
            "slots": [*slots, slot][-KEEP_SLOTS:],
            "max_runs": max_runs,
            "by": instance,
            "at": rfc3339(now),
        }
        try:
            await keys.update(key, new, revision)
        except CasConflict:
            continue
        except Exception as exc:
            raise CountUnavailable(f"{key} not written: {exc!r}") from exc
        return runs + 1
    raise CountUnavailable(f"{key}: too many concurrent writers")
