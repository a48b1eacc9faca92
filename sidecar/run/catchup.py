"""Catch-up (docs/GUARANTEES.md): claim the slots of the last max_late that nobody claimed.

Run at a job loop's start and after each reconnect, for jobs with
``catchup: latest`` or ``all``. Only slots before the one the loop handles
next, and only those whose claim can still be made in time. When the job's
newest claim is for the newest of them, nothing was missed: one read, no
claim. Otherwise the newest missed slot (``latest``) or each of them
(``all``, at most MAX_CATCHUP) is claimed with its usual id through the
`attempt` callback (``Jobs.attempt``), so a slot that did run is a duplicate
and does not run again. A newest claim of the slot the loop handles next, or
a later one (stored before this read: a loaded sidecar, a fleet reconnecting
just before a slot), says nothing of the slots before it: they are all
claimed then, as if the read had found nothing; not for ``overlap: replace``,
where an older slot claimed after a newer one would stop the newer one's run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sidecar.core.clock import rfc3339
from sidecar.core.wire import CATCHUP, EVERY
from sidecar.run.since import floor_ms, settle, since_key

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.context import Context
    from sidecar.run.retries import Attempt

log = logging.getLogger(__name__)

# catchup: all claims at most this many missed slots of a job at once.
MAX_CATCHUP = 100


class CatchUp:
    """``await catch_up(job)``: claim what the fleet missed (module doc)."""

    def __init__(
        self, ctx: Context, attempt: Attempt, next_slot: Callable[[JobConfig], int]
    ) -> None:
        self.clock = ctx.clock
        self.js = ctx.js
        self.spec = ctx.spec
        self.guard = ctx.guard
        self.fleet = ctx.fleet
        self.stopping = ctx.stopping
        self.attempt = attempt
        self.next_slot = next_slot  # the slot the job's loop handles next

    async def __call__(self, job: JobConfig) -> None:
        now = self.clock.wall()
        first = self.next_slot(job)
        candidates: list[int] = []
        slot = job.schedule.next_slot(int((now - job.max_late) * 1000))
        while slot < first and slot <= now * 1000 and len(candidates) < 10 * MAX_CATCHUP:
            candidates.append(slot)
            slot = job.schedule.next_slot(slot)
        if not candidates:
            return
        # The stream check and the state bucket must have been read first: waited for
        # while the newest missed slot can still be claimed, not only the oldest (a
        # sidecar ready a second late caught up nothing of a job due every second).
        wait = candidates[-1] / 1000 + job.max_late - now
        ready = await self._wait_ready(wait)
        if not ready or self.stopping.is_set():
            return
        late = self.clock.wall() - job.max_late
        candidates = [s for s in candidates if s / 1000 >= late]
        if not candidates:
            return
        # Never before a resume, a timed pause's end or a schedule change (since.py).
        floor = await self._floor(job)
        candidates = [s for s in candidates if s >= floor]
        if not candidates:
            return
        # The stream's reader (sidecar/store/runs.py, the history's) is loaded by the
        # first slot to catch up, not by every start: ``catchup`` is ``none`` unless set.
        from sidecar.store.runs import last_messages, last_scheduled_slot

        messages: list[tuple[int, str, bytes]] = []
        # run_on: every: the job's last claim is any instance's; each instance claims
        # every candidate under its own id instead (the ones it ran are duplicates).
        if job.run_on != EVERY:
            try:
                messages = await last_messages(self.js, self.spec.name, self.spec.prefix, job.name)
            except Exception as exc:  # no answer: claim them all; duplicates do not run
                log.debug("catch-up of %s: reading its last claim failed: %r", job.name, exc)
        last = last_scheduled_slot(messages, self.spec.prefix, job.name)
        # A claim of the loop's slot or a later one, stored first: it hides the candidates.
        hiding = rfc3339(last / 1000) if last is not None and last >= first else None
        if hiding is not None and job.overlap == "replace":
            # Claimed after the later slot's, an older slot would stop its run.
            log.info(
                "job %s: not caught up: slot %s was claimed first, and overlap: replace "
                "runs the newest slot only",
                job.name,
                hiding,
            )
            return
        missed = [s for s in candidates if last is None or hiding or s > last]
        if not missed:
            return
        chosen = missed[-1:] if job.catchup == "latest" else missed[-MAX_CATCHUP:]
        log.info(
            "job %s: catching up %d %s of the last %gs (catchup: %s)",
            job.name,
            len(chosen),
            (
                f"slot(s), missed or not (a claim of slot {hiding} came first: "
                "those that ran do not run again)"
                if hiding
                else "missed slot(s)"
            ),
            job.max_late,
            job.catchup,
        )
        for slot in chosen:
            now = self.clock.wall()
            if now - slot / 1000 > job.max_late or self.stopping.is_set():
                continue
            if job.overlap == "replace" and self.next_slot(job) != first:
                # The loop handled a newer slot meanwhile: claimed after it, this
                # older one would stop its run.
                log.info("job %s: catch-up ended: a newer slot came (overlap: replace)", job.name)
                return
            await self.attempt(job, slot, now, 1, None, CATCHUP)

    async def _floor(self, job: JobConfig) -> int:
        bucket = self.fleet.bucket
        entry = self.fleet.view.keys.get(since_key(job.name))
        since = entry.value if entry is not None else None
        now_ms = self.clock.wall_ms()
        if bucket is not None:
            try:
                since = await settle(
                    bucket.kv, job, since, entry.revision if entry else None, now_ms
                )
            except Exception as exc:  # NATS away: the bound as last read
                log.warning("job %s: %s not updated: %r", job.name, since_key(job.name), exc)
        paused = self.fleet.view.paused(job.name)
        return floor_ms(since, paused.value if paused is not None else None, now_ms)

    async def _wait_ready(self, timeout: float) -> bool:
        deadline = self.clock.monotonic() + max(0.0, timeout)
        while not (self.guard.stream_ready and self.fleet.view.synced):
            if self.clock.monotonic() > deadline or self.stopping.is_set():
                return False
            await asyncio.sleep(0.05)
        return True
