"""A concurrency limit shared by several jobs: ``jobs[].concurrency: {key, limit}``.

At most ``limit`` runs of all the jobs that give ``key`` are alive at once,
fleet-wide (docs/CONFIG.md, docs/GUARANTEES.md). The limit is ``limit`` slot
keys in the state bucket, ``conc.<key>.<n>`` for n in 0..limit-1, each a
lease like ``lock.<job>`` (sidecar/run/lease.py): created with a TTL of
``nats.lease_ttl`` by the run that takes it, renewed every third of it,
deleted by its revision when the run has ended and its result is stored.
A runner killed while it holds one frees it when the TTL runs out.

A won run takes its slot after its own lease (``lock.<job>`` or its run
lease) and before ``max_runs`` counts it: a run that never gets a slot was
never sent and is not counted. It takes any free slot. When all are held:

* ``overlap: skip``: the run is recorded ``skipped`` (reason
  ``concurrency``) at once;
* any other policy (``allow``, ``replace``, ``buffer_one``): it waits for a
  slot to go (the watch says so, or it looks again every ``POLL``) until
  the slot's time + ``max_late``, then it is recorded ``skipped``
  (``concurrency``).

A slot key is always written with a TTL. One found without a TTL, or with
one longer than any sidecar's lease, was written by hand and would hold the
slot for ever: it is refused like a forged lock (counted
``hostile_input_total{what="conc_key"}``, logged once a minute, deleted by its
revision, the slot taken).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import TYPE_CHECKING, Any

from sidecar.core.clock import rfc3339
from sidecar.core.errors import KeyHeld
from sidecar.core.wakers import Wakers
from sidecar.run.lease import Lease

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.claim import Claim
    from sidecar.run.context import Context
    from sidecar.store.kv import Keys

log = logging.getLogger(__name__)

PREFIX = "conc."
# A waiting run tries every slot key again after this long without a change the
# watch delivers (a forged slot without a TTL is seen only by trying it).
POLL = 1.0
# How long one slot's create may be asked again when NATS does not answer: a
# waiting run moves on to the next slot rather than hang on one.
CREATE_WAIT = 2.0
# The skip reason of a run that found its limit full (runs_skipped_total{reason}).
REASON = "concurrency"


def conc_key(key: str, n: int) -> str:
    """The state bucket key of slot `n` of the concurrency key `key`."""
    return f"{PREFIX}{key}.{n}"


class Limits:
    """One sidecar's part in shared concurrency limits (see the module doc)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.fleet = ctx.fleet
        # By concurrency key: the runs waiting here for one of its slots, woken by a
        # change of a slot key of that key (they look again), not of any other.
        self._waiting = Wakers()
        # By concurrency key: when a run of this sidecar last tried every slot, held
        # ones too (a forged slot is seen only by trying it). Once per POLL for all
        # the runs waiting here, not once per run: a burst of thousands of waiting
        # runs each trying every slot each second was a storm of creates.
        self._tried_all: dict[str, float] = {}
        ctx.fleet.key_listeners.append(self.changed, PREFIX)

    def changed(self, key: str) -> None:
        """A key of the state bucket changed ("" after a re-sync)."""
        if key == "":
            self._waiting.wake_all()
        elif key.startswith(PREFIX):  # conc.<key>.<n>: <key> has no dot (docs/CONFIG.md)
            self._waiting.wake(key[len(PREFIX) :].rpartition(".")[0])

    async def take(self, keys: Keys, job: JobConfig, claim: Claim, deadline: float) -> Lease | str:
        """A slot of `job`'s limit, created (the caller releases it: ``__aexit__``), or
        why none was taken (the run is then recorded skipped, reason ``concurrency``).

        `deadline` (monotonic): slot + max_late; a job with ``overlap: skip`` does not wait.
        """
        conc = job.concurrency
        assert conc is not None
        value = {
            "job": job.name,
            "slot": claim.slot,
            "attempt": claim.attempt,
            "token": claim.token,
            "instance": self.config.instance_id,
            "started_at": rfc3339(self.clock.wall()),
            "fence": claim.seq,
            "concurrency": conc.key,
        }
        try:
            with self._waiting.watching(conc.key) as changed:
                return await self._take(keys, job, claim, deadline, value, changed)
        finally:
            if not self._waiting.waits(conc.key):  # nothing to pace with nobody waiting
                self._tried_all.pop(conc.key, None)

    async def _take(
        self,
        keys: Keys,
        job: JobConfig,
        claim: Claim,
        deadline: float,
        value: dict[str, Any],
        changed: asyncio.Event,
    ) -> Lease | str:
        conc = job.concurrency
        assert conc is not None
        ttl = self.config.nats.lease_ttl
        waited = False
        while True:
            changed.clear()
            # Every slot: a run that will not wait, or the first run here to look after
            # POLL; the others only the slots the view shows free (``_tried_all``).
            now = self.clock.monotonic()
            every = job.overlap == "skip" or now - self._tried_all.get(conc.key, -math.inf) >= POLL
            if every:
                self._tried_all[conc.key] = now
            view = self.fleet.view.keys
            # Free in the view first; then the held ones (a forged one is refused only
            # when tried, and the view may lag a release). Woken by the watch, only the
            # slots it shows free, and one held by this run's own token (its create got
            # through, its answer did not: taking it again keeps it): many waiters do
            # not each try every held slot at each renewal of one.
            order = sorted(range(conc.limit), key=lambda n: conc_key(conc.key, n) in view)
            if not every:
                token = value["token"]
                order = [
                    n
                    for n in order
                    if (entry := view.get(conc_key(conc.key, n))) is None
                    or entry.value.get("token") == token
                ]
            for n in order:
                key = conc_key(conc.key, n)
                until = min(deadline, self.clock.monotonic() + CREATE_WAIT)
                lease = Lease(keys, key, dict(value), ttl, self.metrics, self.clock, until)
                try:
                    await lease.__aenter__()
                except KeyHeld:
                    continue
                except Exception as exc:  # no answer: the next slot, then again
                    log.warning("job %s: %s not taken: %r", job.name, key, exc)
                    continue
                self.metrics.concurrency_slots_held.labels(job=job.name).inc()
                if waited:
                    log.info("job %s slot %s: took %s after waiting", job.name, claim.slot, key)
                return lease
            if job.overlap == "skip":
                return f"{REASON}: all {conc.limit} slots of {conc.key!r} are held"
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return (
                    f"{REASON}: all {conc.limit} slots of {conc.key!r} stayed held until max_late"
                )
            if not waited:
                waited = True
                log.info(
                    "job %s slot %s: all %d slots of %r are held; waiting up to max_late",
                    job.name,
                    rfc3339(claim.slot / 1000),
                    conc.limit,
                    conc.key,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(POLL, left))

    async def release(self, job: JobConfig, lease: Lease) -> None:
        """Delete the slot key by its revision (after the run's result is stored)."""
        try:
            await lease.__aexit__(None, None, None)
        finally:
            self.metrics.concurrency_slots_held.labels(job=job.name).dec()


__all__ = ["PREFIX", "REASON", "Limits", "conc_key"]
