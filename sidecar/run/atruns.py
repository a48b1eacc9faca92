"""One sidecar's part in the fleet's one-off runs (``at.<job>``, sidecar/when/atkey.py).

Every sidecar watches ``at.*``. For each entry of one of its jobs it waits
until the instant plus a random jitter in [0, jitter] (as for a slot), checks
what a slot is checked for (later than ``max_late``, the stream guard, a
pause), marks the entry ``claiming`` in the key by compare-and-set (the first
to come marks it, the others find it marked; from then on a cancel is too
late and says so, and a cancel that came first removed it, so nothing is
claimed), and claims ``<job>:<ms>:at`` with trigger ``at``: the duplicate
window makes exactly one sidecar win, whichever of them are alive then. A
sidecar that cannot read or mark the key (NATS away) does not claim: a cancel
it cannot see must not be overtaken. The winner runs it like any
won slot (lease, trigger, record; sidecar/run/job_loop.py); the claim's deciders drop
the entry from the key. A winner that dies between its claim and its lease is
judged by the losers as a slot's (sidecar/run/claimwindow.py): recorded lost
once. A one-off is not retried and not rerun when lost (as
``run-now``): its instant is not a slot of the schedule, and a retry's due
key names a slot of the schedule (sidecar/run/duecheck.py).

An entry found after its window (every sidecar was down) is dropped and
counted late by the sidecar whose compare-and-set removed it. Hostile
entries (an instant of the job's own schedule among them: the CLI refuses it,
and it would run that slot twice) are counted (``hostile_input_total{what="at_key"}``), said once,
dropped and never run.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sidecar.core import failpoints
from sidecar.core.clock import rfc3339
from sidecar.core.errors import ClaimDisconnected
from sidecar.core.wire import AT
from sidecar.run.atqueue import drop, mark, rewrite
from sidecar.store.kv import delete_at
from sidecar.when.atkey import KIND, at_key, at_msg_id, instants_of, job_of_key, parse_value

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.claim import Claim
    from sidecar.run.context import Context
    from sidecar.run.skips import Unclaimed

log = logging.getLogger(__name__)

#: ``start(job, claim, start)``: run a won claim (sidecar/run/job_loop.py ``_start_run``).
Start = Callable[["JobConfig", "Claim", float], Any]
#: ``lost(job, claim)``: a claim lost here, whose winner is judged if it never
#: makes its lease (sidecar/run/claimwindow.py ``lost_claim``).
Lost = Callable[["JobConfig", "Claim"], None]


class AtRuns:
    """The one-off runs this sidecar waits for (module doc)."""

    def __init__(self, ctx: Context, unclaimed: Unclaimed, start: Start, lost: Lost) -> None:
        self.config = ctx.config
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.claimer = ctx.claimer
        self.guard = ctx.guard
        self.fleet = ctx.fleet
        self.unclaimed = unclaimed
        self.start = start
        self.lost = lost
        self.spawn = ctx.tasks.spawn
        self.sleep_until = ctx.sleeper.until
        self.stopping = ctx.stopping
        self._jobs = ctx.jobs
        self._waiting: set[tuple[str, int]] = set()  # (job, slot) waited for here
        self._refused: set[tuple[str, int]] = set()  # hostile (key, revision) said

    def changed(self, key: str) -> None:
        """A key the watch delivered ("" after a re-sync: every ``at.*`` key)."""
        if self.stopping.is_set():
            return
        if key == "":  # every job's (its gauge too, when its key went meanwhile)
            keys = {k for k in self.fleet.view.keys if k.startswith(f"{KIND}.")}
            keys.update(at_key(name) for name in self._jobs)
        elif key.startswith(f"{KIND}."):
            keys = {key}
        else:
            return
        for k in keys:
            self._look(k)

    def _look(self, key: str) -> None:
        name = job_of_key(key)
        job = self._jobs.get(name or "")
        entry = self.fleet.view.keys.get(key)
        if job is not None and key == at_key(job.name):
            value = entry.value if entry is not None else None
            count = len(parse_value(value, self.clock.wall()).runs) if value is not None else 0
            self.metrics.job_at_pending.labels(job=job.name).set(count)
        if job is None or entry is None:
            return  # not one of our jobs (another fleet may share the bucket), or gone
        now = self.clock.wall()
        if key != at_key(job.name):
            self._hostile(key, entry.revision, ["not a one-off key: at.<job>"], job, None)
            return
        parsed = parse_value(entry.value, now, instants_of(job.schedule))
        if parsed.hostile:
            self._hostile(key, entry.revision, parsed.hostile, job, set())
        for slot in parsed.runs:
            if (job.name, slot) in self._waiting:
                continue
            self._waiting.add((job.name, slot))
            self.spawn(self._wait(job, slot))

    def _hostile(
        self, key: str, revision: int, why: list[str], job: JobConfig, slots: set[int] | None
    ) -> None:
        """Counted and said once per (key, revision); the bad entries dropped (the good
        ones kept: `slots` empty), or the whole key deleted (`slots` None)."""
        if (key, revision) in self._refused:
            return
        if len(self._refused) >= 1000:
            self._refused.clear()
        self._refused.add((key, revision))
        self.metrics.hostile_input_total.labels(what="at_key").inc(len(why))
        log.error(
            "state bucket: %s refused: %s; it is hostile input (whoever may write the state "
            "bucket wrote it), nothing of it is run",
            key[:200],
            "; ".join(why)[:500],
        )
        self.spawn(self._clean(key, job, slots))

    async def _clean(self, key: str, job: JobConfig, slots: set[int] | None) -> None:
        bucket = self.fleet.bucket
        if bucket is None:
            return
        with contextlib.suppress(Exception):  # another sidecar cleaned it first
            if slots is None:
                await delete_at(bucket.kv, key)
            else:  # rewriting the key keeps only its good entries
                await rewrite(bucket.kv, job)

    async def _wait(self, job: JobConfig, slot: int) -> None:
        try:
            wake = slot / 1000 + random.uniform(0.0, job.jitter)
            if await self.sleep_until(wake):
                if self.clock.wall() >= slot / 1000:
                    self.metrics.claims_skipped_total.labels(job=job.name, reason="shutdown").inc()
                return
            if failpoints.ENABLED:
                await failpoints.hit("at.due")
            await self._due(job, slot)
        except Exception:  # a bug must not stop the others; said
            log.exception("job %s: one-off run at %s failed", job.name, rfc3339(slot / 1000))
        finally:
            self._waiting.discard((job.name, slot))

    async def _mark(self, job: JobConfig, slot: int) -> bool:
        """Mark the entry ``claiming`` in the key itself (not the view, which may lag a
        cancel); True when it is still queued, marked now or by another sidecar."""
        bucket = self.fleet.bucket
        if bucket is None:
            return False
        try:
            held = await mark(bucket.kv, job.name, slot, self.config.instance_id)
        except Exception as exc:  # NATS away: a cancel may be unseen; not claimed here
            self.metrics.claims_skipped_total.labels(job=job.name, reason="bucket").inc()
            log.warning(
                "job %s: one-off run at %s not claimed here: its key could not be read or "
                "marked (%r); another sidecar may claim it",
                job.name,
                rfc3339(slot / 1000),
                exc,
            )
            return False
        if held is None:
            log.info(
                "job %s: one-off run at %s is no longer queued (cancelled, or claimed by "
                "another sidecar)",
                job.name,
                rfc3339(slot / 1000),
            )
        return held is not None

    async def _due(self, job: JobConfig, slot: int) -> None:
        name = job.name
        now = self.clock.wall()
        skip: tuple[str, str] | None = None
        if now - slot / 1000 > job.max_late:
            skip = "late", f"later than max_late {job.max_late:g}s"
        elif why := self.guard.blocked(job, slot):
            skip = "stream", why
        elif blocked := self.fleet.blocked(name):
            skip = blocked
        if skip is not None:
            if await self._drop(name, slot):  # counted once, by the one that dropped it
                self.metrics.claims_skipped_total.labels(job=name, reason=skip[0]).inc()
                log.warning(
                    "job %s: one-off run at %s skipped: %s", name, rfc3339(slot / 1000), skip[1]
                )
            return
        if not await self._mark(job, slot):
            return
        if failpoints.ENABLED:
            await failpoints.hit("at.marked")
        now = self.clock.wall()
        deadline = self.clock.monotonic() + (slot / 1000 + job.max_late - now)
        try:
            claim = await self.claimer.claim(
                name, slot, deadline, msg_id=at_msg_id(name, slot), trigger=AT
            )
        except ClaimDisconnected as exc:
            self.unclaimed.disconnected(job, slot, exc)
            return
        except Exception as exc:  # ClaimError: no definite answer; another may have won
            self.unclaimed.failed(job, slot, exc)
            return
        if claim.won:
            log.info("job %s: one-off run at %s won", name, rfc3339(slot / 1000))
            if failpoints.ENABLED:
                await failpoints.hit("claim.won")
            self.start(job, claim, slot / 1000)
        else:
            # Its winner may die before its lease: judged as a slot's (recorded
            # lost, never rerun: a one-off is not, sidecar/run/retries.py).
            self.lost(job, claim)
        self.unclaimed.count(claim)
        await self._drop(name, slot)

    async def _drop(self, job: str, slot: int) -> bool:
        """Remove the entry; True when this call removed it."""
        bucket = self.fleet.bucket
        if bucket is None:
            return False
        try:
            return bool(await drop(bucket.kv, job, {slot}))
        except Exception as exc:  # the next decider, or the late check, drops it
            log.debug("one-off %s at %s not dropped: %r", job, slot, exc)
            return False
