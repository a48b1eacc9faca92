"""Claim candidates: only k live instances claim a slot at its time (``claim.candidates``).

Without it every replica claims every slot: N publishes a slot, N-1 of them
answered "duplicate". With ``claim: {candidates: k}`` the replicas rank the
live instances that run the job (the ``instance.<id>`` presence keys of the
state bucket, which every sidecar already watches) by rendezvous hashing
(highest random weight) of (job, slot, instance id), and only the k first
claim at the slot. Every replica computes the same ranking from the same view
without talking to the others; the hash is SHA-256, never Python's salted
``hash()``. When an instance leaves, only the slots it ranked first move,
each to the next in its ranking.

Every other replica waits ``jitter + claim.fallback`` after the slot and then
looks in its view of the bucket for the slot's run lease (``run.<job>.<slot>``,
or ``lock.<job>`` naming the slot), which the winner creates right after its
claim. Seen: nothing to do, and no request was made. Not seen (the candidates
died, froze, lost NATS, or their lease is slow): it claims the slot with the
usual id, so the claim still decides: exactly once is unchanged, and a slot
whose candidates died still runs, ``jitter + fallback`` late. A direct read of
the stored claim would cost one request, exactly like the duplicate claim it
would save, so the fallback claims instead of reading.

``sidecar/config/job_entry.py`` keeps ``jitter + claim.fallback + nats.ack_timeout < max_late``
(``check_fit``), so the fallback's claim is always made in time.

Fail open: when the view cannot be trusted (not read yet, the bucket without
TTLs or unfit for leases, replaced, or this instance not in it yet) every
replica claims, as without candidates.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.config.fields import format_duration
from sidecar.obs.ratelog import RateLimitedLog
from sidecar.store.digests import BUCKET_PREFIX, runs_job
from sidecar.when.attempts import is_lease_key

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.core.clock import Clock
    from sidecar.fleet.member import Fleet
    from sidecar.obs.metrics import Metrics

log = logging.getLogger(__name__)

# The slots of a job whose run was seen, kept for the fallbacks (per job).
SEEN_PER_JOB = 512
# Outcomes of a deferred slot (``anarchon_claims_deferred_total{outcome}``).
SEEN = "seen"
FALLBACK = "fallback"


# ---------------------------------------------------------------------- ranking


def score(job: str, slot: int, instance: str) -> int:
    """The instance's weight for this slot: the same on every replica and platform."""
    digest = hashlib.sha256(f"{job}\x00{slot:d}\x00{instance}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rank(job: str, slot: int, instances: Iterable[str], k: int) -> list[str]:
    """The k instances that claim `slot` of `job` at its time, highest weight first."""
    weighted = sorted(((score(job, slot, i), i) for i in set(instances)), reverse=True)
    return [instance for _, instance in weighted[: max(k, 0)]]


@dataclass(frozen=True)
class Decision:
    """Whether this instance claims at the slot; ``why`` for the log and the tests."""

    claim_now: bool
    why: str


def decide(job: str, slot: int, me: str, live: Collection[str] | None, k: int) -> Decision:
    """Claim at the slot, or wait for the fallback. Pure.

    ============================== ========================
    situation                      decision
    ============================== ========================
    k = 0                          claim (off)
    view unknown (None)            claim (fail open)
    this instance not in the view  claim (fail open)
    k or fewer instances           claim (all are candidates)
    ranked among the first k       claim (candidate)
    otherwise                      wait for the fallback
    ============================== ========================
    """
    if k <= 0:
        return Decision(True, "off")
    if live is None:
        return Decision(True, "open: the fleet view is unknown")
    if me not in live:
        return Decision(True, "open: this instance is not in the fleet view yet")
    if len(live) <= k:
        return Decision(True, "candidate: no more live instances than candidates")
    if me in rank(job, slot, live, k):
        return Decision(True, "candidate")
    return Decision(False, "deferred")


# ---------------------------------------------------------------------- the running part


def lease_slot(key: str, value: dict[str, Any]) -> tuple[str, int] | None:
    """(job, slot) of attempt 1 whose run a lease key shows; None for anything else."""
    if key.startswith("run."):
        parts = key.split(".")
        if len(parts) == 3 and parts[2].isdigit():
            return parts[1], int(parts[2])
        return None
    if key.startswith("lock."):
        slot, attempt = value.get("slot"), value.get("attempt", 1)
        if isinstance(slot, int) and not isinstance(slot, bool) and attempt == 1:
            return key[len("lock.") :], slot
    return None


class Candidates:
    """The wait-or-claim decision of one sidecar, and its deferred claims."""

    def __init__(
        self,
        instance_id: str,
        metrics: Metrics,
        clock: Clock,
        fleet: Fleet,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        sleep_until: Callable[[float], Awaitable[bool]],
        claim_later: Callable[[JobConfig, int], Awaitable[None]],
    ) -> None:
        self.instance_id = instance_id
        self.metrics = metrics
        self.clock = clock
        self.fleet = fleet
        self._spawn = spawn
        self._sleep_until = sleep_until
        self._claim_later = claim_later
        self._seen: dict[str, tuple[set[int], deque[int]]] = {}
        # Per job: its live instances, until an instance comes, goes or changes
        # (the view's presence_generation): many jobs due at once. Jobs run by the
        # same instances share one list.
        self._live: dict[str, list[str]] = {}
        self._live_generation = -1
        self._lists: dict[tuple[str, ...], list[str]] = {}
        self.warnings = RateLimitedLog(log)
        fleet.key_listeners.append(self.key_seen, "run.", "lock.")

    def live(self, job: str) -> list[str] | None:
        """The live instances that run `job`, from the view; None when it cannot be trusted."""
        fleet = self.fleet
        if not fleet.view.synced or fleet.problem is not None or not fleet.leases_ok:
            return None
        if self._live_generation != fleet.view.presence_generation:
            self._live.clear()
            self._lists.clear()
            self._live_generation = fleet.view.presence_generation
        live = self._live.get(job)
        if live is None:
            # A job of the state bucket: run by every instance that runs a set of them
            # (its presence has one entry for the set, sidecar/store/state.py).
            bucket = f"{BUCKET_PREFIX}{job}" in fleet.view.keys
            presences = fleet.view.presences()
            found = [i for i, value in presences.items() if runs_job(value, job, bucket)]
            live = self._live[job] = self._lists.setdefault(tuple(found), found)
        return live

    def defer(self, job: JobConfig, slot: int, number: int, trigger: str) -> bool:
        """True when this instance leaves the slot to its candidates (and claims it
        after the fallback unless its run was seen); False: claim now."""
        k = job.claim.candidates
        if k < 1 or number != 1 or trigger != "scheduled":
            return False
        decision = decide(job.name, slot, self.instance_id, self.live(job.name), k)
        if decision.claim_now:
            if decision.why.startswith("open"):
                # Normal for a moment after start (this instance's presence not read back).
                self.warnings.log(
                    logging.INFO,
                    f"open:{job.name}",
                    "job %s: every instance claims: %s",
                    job.name,
                    decision.why,
                )
            return False
        self._spawn(self._fallback(job, slot))
        return True

    async def _fallback(self, job: JobConfig, slot: int) -> None:
        """After jitter + fallback: nothing if the slot's run was seen, else claim it."""
        name = job.name
        if await self._sleep_until(slot / 1000 + job.jitter + job.claim.fallback):
            self.metrics.claims_skipped_total.labels(job=name, reason="shutdown").inc()
            return
        if self.was_run(name, slot):
            self.metrics.claims_deferred_total.labels(job=name, outcome=SEEN).inc()
            return
        if self.clock.wall() - slot / 1000 > job.max_late:  # this process was stalled
            self.metrics.claims_skipped_total.labels(job=name, reason="late").inc()
            log.warning("job %s slot %d: fallback later than max_late; not claimed", name, slot)
            return
        self.metrics.claims_deferred_total.labels(job=name, outcome=FALLBACK).inc()
        log.info(
            "job %s slot %d: no run seen %s after the slot; claiming it (its candidates: %s)",
            name,
            slot,
            format_duration(job.jitter + job.claim.fallback),
            ", ".join(rank(name, slot, self.live(name) or [], job.claim.candidates)) or "?",
        )
        await self._claim_later(job, slot)

    def was_run(self, job: str, slot: int) -> bool:
        seen = self._seen.get(job)
        return seen is not None and slot in seen[0]

    def key_seen(self, key: str) -> None:
        """A key the watch delivered: a run lease marks its slot as taken.

        Only for a job with candidates: no other job's slot is asked about
        (``was_run``), and a burst of 10,000 jobs' leases would otherwise keep
        a set of slots for each of them (docs/PERFORMANCE.md "The burst")."""
        if not is_lease_key(key):
            return
        entry = self.fleet.view.keys.get(key)
        if entry is None:
            return
        found = lease_slot(key, entry.value)
        if found is None:
            return
        job, slot = found
        jobs = self.fleet.jobs
        if job not in jobs or jobs[job].claim.candidates < 1:
            return
        slots, order = self._seen.setdefault(job, (set(), deque()))
        if slot in slots:
            return
        slots.add(slot)
        order.append(slot)
        if len(order) > SEEN_PER_JOB:
            slots.discard(order.popleft())
