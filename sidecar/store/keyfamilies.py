"""Every family of state bucket keys, in one table the watch reads the bucket through.

A key's family is its first token (``due.``, ``lock.``, ...). Each family
names its shape, who may write it and where its value is checked before a
sidecar acts on it. The checks stay in the modules that act (most of them
above this one: sidecar/run/duecheck.py, sidecar/when/atkey.py, ...); the
table names them, so that a reader, and SECURITY.md's table of what a writer
of each family can and cannot do, find every one in one place.

The View (sidecar/store/state.py) looks every key the watch delivers up here:
a key that no family claims is ignored (not kept, no part of the sidecar
sees it), counted (``hostile_input_total{what="unknown_key"}``) and logged
once a minute by the Fleet; it is not deleted, because a newer release may
add a family (docs/RELEASES.md) and its keys are then unknown to the older
sidecars of a rolling update. ``tests/store/test_keyfamilies.py`` fails when a
function that makes a key of a family not in the table appears anywhere in
sidecar/, and when SECURITY.md does not list a family: no family ships
without its entry, and its check named.
"""

from __future__ import annotations

from dataclasses import dataclass

# Who may write a family (SECURITY.md): a command of this project (the CLI,
# the fleet page or its API, by an operator), the sidecar that holds the run's
# lease or decided its claim, or any sidecar for itself or for the fleet.
COMMAND = "command"
LEASE = "lease"
SIDECAR = "sidecar"


@dataclass(frozen=True)
class Family:
    """One family of keys: ``<prefix><rest>``."""

    prefix: str  # with its dot: "due."
    shape: str  # the key as SECURITY.md's table of key families writes it
    writers: tuple[str, ...]  # COMMAND, LEASE, SIDECAR
    ttl: bool  # always written with a per-message TTL (expires on its own)
    check: str  # where its value is checked before anything acts on it, and how


FAMILIES: tuple[Family, ...] = (
    Family(
        "due.",
        "due.<job>.<slot>.<attempt>",
        (LEASE,),
        True,
        "sidecar/run/duecheck.py: a slot of the schedule, in the past, within the retry "
        "budget, backed by a failed or lost result of the attempt before in the stream",
    ),
    Family(
        "backfill.",
        "backfill.<job>",
        (COMMAND,),
        False,
        "sidecar/run/backfillcheck.py: what the backfill command writes, slots of the "
        "schedule, in the past, at most 1000",
    ),
    Family(
        "at.",
        "at.<job>",
        (COMMAND, SIDECAR),
        False,
        "sidecar/when/atkey.py: instants in epoch ms, at most 366 days ahead, never an "
        "instant of the schedule, at most 100 entries",
    ),
    Family(
        "job.",
        "job.<name>",
        (COMMAND,),
        False,
        "sidecar/admin/jobcheck.py: a valid job, checked as a config file's, its name "
        "its key's, no routing or framing header, within bucket_jobs (how many, name and "
        "value size); the file's job of that name wins",
    ),
    Family(
        "paused.",
        "paused.<job>",
        (COMMAND, SIDECAR),
        False,
        "sidecar/when/pauses.py: only keeps slots from running (pause_after writes it too)",
    ),
    Family(
        "skip.",
        "skip.<job>",
        (COMMAND,),
        False,
        "sidecar/when/pauses.py: only keeps slots of the schedule from running",
    ),
    Family(
        "since.",
        "since.<job>",
        (COMMAND, SIDECAR),
        False,
        "sidecar/run/since.py: only bounds how far back catch-up reaches (never past max_late)",
    ),
    Family(
        "count.",
        "count.<job>",
        (LEASE,),
        False,
        "sidecar/run/runcap.py: a count by compare-and-set; only a claim the stream stores runs",
    ),
    Family(
        "health.",
        "health.<job>",
        (SIDECAR, COMMAND),
        False,
        "sidecar/after/health.py: range-checked counts; decides notifications and "
        "pause_after, never a run",
    ),
    Family(
        "event.",
        "event.<job>.<run>.<event>",
        (SIDECAR,),
        True,
        "sidecar/after/health.py: one notification per event, taken by create",
    ),
    Family(
        "actions.",
        "actions.<job>",
        (COMMAND,),
        False,
        "sidecar/admin/actions.py: the page's audit list, shown as text only",
    ),
    Family(
        "run.",
        "run.<job>.<slot>[.<attempt>]",
        (LEASE,),
        True,
        "sidecar/run/lostruns.py: an expired one is recorded lost only for a claim the "
        "stream stores without a result",
    ),
    Family(
        "lock.",
        "lock.<job>",
        (LEASE,),
        True,
        "sidecar/run/lease.py: one held without a TTL a sidecar writes is deleted, "
        "counted lock_key",
    ),
    Family(
        "conc.",
        "conc.<key>.<n>",
        (LEASE,),
        True,
        "sidecar/run/concurrency.py: a slot of a shared concurrency limit; one held "
        "without a TTL a sidecar writes is deleted, counted conc_key",
    ),
    Family(
        "stop.",
        "stop.<job>",
        (LEASE,),
        True,
        "sidecar/run/stoprequests.py: the cancel request of overlap: replace",
    ),
    Family(
        "buffer.",
        "buffer.<job>",
        (LEASE,),
        False,
        "sidecar/run/keptslots.py: the slot kept by overlap: buffer_one",
    ),
    Family(
        "instance.",
        "instance.<id>",
        (SIDECAR,),
        True,
        "sidecar/fleet/member.py: presence; who runs what, never a run",
    ),
)

BY_PREFIX: dict[str, Family] = {f.prefix: f for f in FAMILIES}


def family_of(key: str) -> Family | None:
    """The family that claims `key`; None for a key of no family (or no name after it)."""
    head, dot, rest = key.partition(".")
    if not dot or not rest:
        return None
    return BY_PREFIX.get(f"{head}.")
