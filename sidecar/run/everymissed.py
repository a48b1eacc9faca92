"""``run_on: every``: the slots an instance missed, counted as their windows close.

``status`` and ``history`` show which instance missed which slot, from the
claims in the stream (sidecar/store/missed.py); an alert needs a number that
rises when it happens. Every sidecar with a ``run_on: every`` job of its
config follows that job's claims (an ordered consumer on
``<prefix><job>.claims``, from the first one the stream keeps: the
per-subject limit bounds the read) and remembers which instance claimed which
of the newest slots. At each slot's ``jitter + max_late`` (plus a little) it
judges the slot by store/missed.py's rule, on the claims up to it: an
instance of the job with no claim of it, whose newest claim lies within
``TRAIL`` judged slots, missed it. Each miss counts in
``anarchon_every_slots_missed_total{job, reason}`` and is logged with the
instance. ``reason`` is ``stopped`` when this sidecar saw the instance's
presence (``instance.<id>``) deleted, and not yet written again, at some time
of the slot's window (the slot to its max_late): it exited cleanly (a rollout,
a scale-down, a restart, a stop on purpose); a slot judged after the instance
came back is judged by when it was out, not by when the judging comes. ``away``
otherwise (it died, froze or lost NATS: its presence expired or is still
there; it was up and made no claim; or it left before this sidecar started).
The alert counts ``away`` only, so that a rollout does not page.

Every live sidecar judges every slot, so each counts the same misses (the
missing one, being away, counts none): the fleet's number is the max over
instances, not the sum (docs/METRICS.md). A sidecar judges only the slots
whose window closes while it runs, so a restart does not count a slot again.
The series exists at 0 from the first claim of the job this sidecar reads
(docs/METRICS.md, "Series per job": the alert's ``increase()`` sees the first
miss). Jobs added at run time (``job.<name>`` keys) are not followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from sidecar.core.backoff import Backoff
from sidecar.core.bounds import slot_ms
from sidecar.core.clock import rfc3339
from sidecar.core.wire import EVERY, RUN_ON_FIELD, claims_subject, decode, instance_key
from sidecar.store.missed import TRAIL, Seen, missed
from sidecar.store.state import DELETED, Removal

if TYPE_CHECKING:
    from sidecar.config.jobset import Change
    from sidecar.config.load import JobConfig
    from sidecar.run.context import Context

log = logging.getLogger(__name__)

# Slots remembered per job: the rule looks TRAIL judged slots past an
# instance's newest claim; three times that keeps an instance away a while known.
KEEP = 3 * TRAIL
# After jitter + max_late: a claim made at the very end of the window is stored.
SETTLE = 1.0
# anarchon_every_slots_missed_total's reasons (module doc).
STOPPED, AWAY = "stopped", "away"
PRESENCE = instance_key("")
# Instances whose clean exits are remembered, and exits remembered per instance.
STOPPED_KEEP = 1000
EXITS_KEPT = 3
# A claim of a slot further ahead than this is not taken (on_claim).
AHEAD_MS = 300_000
# A sidecar suspended for long judges the slots of this last stretch only.
BEHIND = 3600.0


def claim_of(data: bytes, job: str) -> Seen | None:
    """A per-instance claim of `job` (its slot and instance); None for anything else
    (the fleet's claims of other jobs' kinds, or what no sidecar writes)."""
    record = decode(data)
    slot = slot_ms(record.get("slot"))
    instance = record.get("instance")
    if record.get("job") != job or record.get(RUN_ON_FIELD) != EVERY or slot is None:
        return None
    if not isinstance(instance, str) or not instance:
        return None
    return Seen(slot, instance)


@dataclass
class Exit:
    """A clean exit of an instance seen here: its presence deleted at `at_ms`, written
    again at `back_ms` (None: not yet)."""

    at_ms: int
    back_ms: int | None = None

    def covers(self, slot: int, max_late_ms: int) -> bool:
        """Whether the instance was out at some time of `slot`'s window."""
        return self.at_ms <= slot + max_late_ms and (self.back_ms is None or self.back_ms >= slot)


class Claims:
    """One job's per-instance claims of its newest ``KEEP`` slots (pure)."""

    def __init__(self) -> None:
        self.slots: dict[int, set[str]] = {}

    def add(self, seen: Seen) -> None:
        if seen.slot not in self.slots and len(self.slots) >= KEEP:
            oldest = min(self.slots)
            if seen.slot < oldest:
                return
            del self.slots[oldest]
        self.slots.setdefault(seen.slot, set()).add(seen.instance)

    def missed_at(self, slot: int, now_ms: int, max_late_ms: int) -> list[str]:
        """The instances that missed `slot`, judged on the claims up to it (sorted)."""
        seen = [Seen(s, i) for s, who in self.slots.items() if s <= slot for i in who]
        return [g.instance for g in missed(seen, now_ms, max_late_ms) if g.slot == slot]


class EveryMissed:
    """The ``run_on: every`` jobs of the job set (the file's, and the state bucket's as
    they come and go), followed and judged (module doc)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.claims: dict[str, Claims] = {}
        # Each followed job's two tasks (its claims followed, its slots judged).
        self._tasks: dict[str, tuple[asyncio.Task[None], ...]] = {}
        # Per instance, the clean exits this sidecar saw (its presence deleted, then
        # written again), the newest EXITS_KEPT; for the newest STOPPED_KEEP instances
        # (each rollout adds its old ids).
        self.stopped: dict[str, list[Exit]] = {}

    def begin(self) -> None:
        """Follow and judge each job, in tasks that end with the sidecar (or with the
        job, for one of the state bucket's that leaves or stops being ``every``)."""
        self.ctx.fleet.removal_listeners.append(self.removed)
        # Only presences (sidecar/fleet/listeners.py): a burst's run leases never reach it.
        self.ctx.fleet.key_listeners.append(self.changed, PRESENCE)
        self.ctx.jobs.subscribe(self._jobs_changed)
        for job in self.ctx.jobs.all:
            if job.run_on == EVERY:
                self._start(job)

    def _start(self, job: JobConfig) -> None:
        self.claims[job.name] = Claims()
        spawn = self.ctx.tasks.spawn
        self._tasks[job.name] = (spawn(self._follow(job)), spawn(self._judge(job)))

    def _stop(self, name: str) -> None:
        for task in self._tasks.pop(name, ()):
            task.cancel()
        self.claims.pop(name, None)

    def _unsubscribe_when_made(self, subscribing: asyncio.Future[Any]) -> None:
        """A subscription made after its follower was cancelled: ended at once."""
        if subscribing.cancelled() or subscribing.exception() is not None:
            return
        self.ctx.tasks.spawn(subscribing.result().unsubscribe())

    def _jobs_changed(self, change: Change) -> None:
        for name in change.removed:
            self._stop(name)
        for job in change.put:  # new, or changed: followed afresh with its settings
            self._stop(job.name)
            if job.run_on == EVERY and not self.ctx.stopping.is_set():
                self._start(job)

    def removed(self, removal: Removal) -> None:
        if not removal.key.startswith(PRESENCE) or removal.how != DELETED:
            return
        instance = removal.key[len(PRESENCE) :]
        # When the delete was stored (its marker's time), not when it was seen here: a
        # full re-read tells of it late. Never later than now (a server's clock ahead).
        now_ms = self.ctx.clock.wall_ms()
        at = removal.at
        at_ms = now_ms if at is None or not math.isfinite(at) else min(now_ms, int(at * 1000))
        exits = self.stopped.pop(instance, [])  # put back as the newest instance
        self.stopped[instance] = [*exits[1 - EXITS_KEPT :], Exit(at_ms)]
        if len(self.stopped) > STOPPED_KEEP:
            del self.stopped[next(iter(self.stopped))]

    def changed(self, key: str) -> None:
        """A presence written (back), or ``""`` after a full re-read: every exit of an
        instance whose presence is in the view now is closed."""
        if key and not key.startswith(PRESENCE):
            return
        keys, now_ms = self.ctx.fleet.view.keys, self.ctx.clock.wall_ms()
        for instance in [key[len(PRESENCE) :]] if key else list(self.stopped):
            if instance_key(instance) not in keys:
                continue
            for out in self.stopped.get(instance, ()):
                if out.back_ms is None:
                    out.back_ms = now_ms

    def exited(self, instance: str, slot: int, max_late_ms: int) -> bool:
        """Whether `instance` was out after a clean exit at some time of `slot`'s window."""
        return any(out.covers(slot, max_late_ms) for out in self.stopped.get(instance, ()))

    def on_claim(self, name: str, data: bytes) -> None:
        seen = claim_of(data, name)
        if seen is None or seen.slot > self.ctx.clock.wall_ms() + AHEAD_MS:
            # No instance claims a slot before its time: one far ahead is forged
            # (or its clock is far off), and kept it would push real slots out.
            return
        claims = self.claims.get(name)
        if claims is None:  # the job left (a job of the state bucket) meanwhile
            return
        if not claims.slots:  # the job has something to say from now on
            self.ctx.metrics.every_slots_missed_total.add(name, AWAY)
        claims.add(seen)

    async def _follow(self, job: JobConfig) -> None:
        ctx, backoff = self.ctx, Backoff(start=0.5, cap=10.0)

        async def on_msg(msg: Msg) -> None:  # nats-py takes only a coroutine function
            self.on_claim(job.name, msg.data)

        while not ctx.stopping.is_set():
            # In a task of its own: a job of the state bucket that leaves cancels this
            # one, and the subscription then made is ended all the same.
            subscribing = asyncio.ensure_future(
                ctx.js.subscribe(
                    claims_subject(ctx.spec.prefix, job.name),
                    stream=ctx.spec.name,
                    cb=on_msg,
                    ordered_consumer=True,
                    config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
                )
            )
            try:
                sub: Any = await asyncio.shield(subscribing)
            except asyncio.CancelledError:
                subscribing.add_done_callback(self._unsubscribe_when_made)
                raise
            except Exception as exc:  # NATS away: asked again
                log.debug("job %s: following its claims failed (%r); again", job.name, exc)
                await backoff.sleep()
                continue
            try:
                await ctx.stopping.wait()
            finally:  # stopping, or the job left: its consumer is not kept
                with contextlib.suppress(Exception):
                    await asyncio.shield(sub.unsubscribe())
            return

    async def _judge(self, job: JobConfig) -> None:
        clock, max_late_ms = self.ctx.clock, round(job.max_late * 1000)
        window = job.jitter + job.max_late + SETTLE
        slot = job.schedule.next_slot(clock.wall_ms())
        while not self.ctx.stopping.is_set():
            if await self.ctx.sleeper.until(slot / 1000 + window):
                return
            now_ms = clock.wall_ms()
            self.judge(job, slot, now_ms, max_late_ms)
            # Each slot in turn; after a long suspend, not further back than BEHIND.
            slot = job.schedule.next_slot(max(slot, now_ms - round((window + BEHIND) * 1000)))

    def judge(self, job: JobConfig, slot: int, now_ms: int, max_late_ms: int) -> list[str]:
        """Count and say the instances that missed `slot`; returns them."""
        gone = self.claims[job.name].missed_at(slot, now_ms, max_late_ms)
        for instance in gone:
            reason = STOPPED if self.exited(instance, slot, max_late_ms) else AWAY
            self.ctx.metrics.every_slots_missed_total.labels(job=job.name, reason=reason).inc()
            log.log(
                logging.INFO if reason == STOPPED else logging.WARNING,
                "job %s: instance %s missed slot %s (no claim of it within max_late: %s)",
                job.name,
                instance,
                rfc3339(slot / 1000),
                "it had exited cleanly" if reason == STOPPED else "it was away",
            )
        return gone
