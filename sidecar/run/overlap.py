"""Overlap policies beyond skip: ``replace`` and ``buffer_one`` (docs/CONFIG.md).

All three policies that keep runs apart (``skip``, ``replace``, ``buffer_one``)
hold the fleet-wide ``lock.<job>`` of ``skip`` for every run (sidecar/run/lease.py):
no two runs of such a job are ever alive at once. What happens when a won
slot finds the lock held:

* ``replace``: the winner asks the holder to stop by writing
  ``stop.<job>`` (the holder's run token, the asking slot and claim
  sequence; TTL ``lease_ttl``). Every sidecar watches the state bucket; the
  one running that token sends the app the cancel request (``jobs[].cancel``,
  docs/TRIGGER.md), gives the run ``cancel.grace`` to answer, then closes
  its connection, records it ``failed`` with error ``replaced: ...`` (no
  retry), and releases the lock. The winner takes the lock as soon as it is
  free and runs; if it is not free by slot + ``max_late``, the slot is
  recorded ``skipped`` (reason ``overlap``). When several slots wait, the
  newest wins: an older waiter that sees a newer slot's stop request gives up
  (skipped, overlap).
* ``buffer_one``: the winner keeps its slot in ``buffer.<job>``, created by
  compare-and-set (no TTL): one slot is kept, the others are skipped
  (overlap). When the lock is released (or expires: a dead runner), every
  sidecar that sees it gone while ``buffer.<job>`` exists deletes the key by
  its revision: exactly one succeeds and runs the kept slot, with the kept
  claim's token (the slot's claim was won once, by its winner), trigger
  ``scheduled`` and the header ``X-Anarchon-Buffered: true``. The kept run
  takes the lock like any run: should another run hold it by then, it is kept
  again (or skipped when another slot is kept already). A kept slot is not run
  while its job is paused (recorded ``skipped``, paused), and one older than
  ``kept_window`` is recorded ``skipped`` (late).

Both keys can be written by anyone who may write the state bucket: neither is
acted on before the stream backs it (sidecar/run/overlapcheck.py). A kept
slot's run id, fence, attempt and trigger are its stored claim's; a stop
request is honoured only for a newer claim of the job that is still waiting.
Any other value is counted (``hostile_input_total{what="buffer_key"}`` or
``"stop_key"``), logged once and deleted, and nothing of it is done.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from sidecar.core.bounds import slot_ms
from sidecar.core.clock import rfc3339
from sidecar.core.errors import CasConflict, KeyHeld, TriggerError
from sidecar.core.tasks import TaskSet, cancel_all
from sidecar.run.claim import Claim
from sidecar.run.lease import KEPT, REPLACED, SKIPPED, TAKEN
from sidecar.run.overlapcheck import KeyChecks, StoredClaim, kept_window
from sidecar.run.trigger import Trigger, TriggerResult, Why, cut_off
from sidecar.store.state import Entry
from sidecar.when.attempts import lock_key

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.context import Context

log = logging.getLogger(__name__)

# The header of a cancel request: the run token (X-Anarchon-Run-Id) of the run to stop.
CANCEL_HEADER = "X-Anarchon-Cancel"
# The header of a run kept by ``buffer_one`` and run after the one it fell during.
BUFFERED_HEADER = "X-Anarchon-Buffered"
# A waiting replacer looks at the lock this often (and at once when the watch
# delivers a change of it).
LOCK_POLL = 0.25
# The run ids last seen holding each job's lock: a kept slot is never one of them.
HOLDERS_KEPT = 16


def stop_key(job: str) -> str:
    return f"stop.{job}"


def buffer_key(job: str) -> str:
    return f"buffer.{job}"


def _fence(value: dict[str, Any] | None) -> int:
    raw = (value or {}).get("fence")
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else 0


class Overlap:
    """One sidecar's part in ``replace`` and ``buffer_one`` (see the module doc)."""

    def __init__(
        self,
        ctx: Context,
        trigger: Trigger,
        run_kept: Callable[[JobConfig, Claim, str | None], bool],
    ) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.fleet = fleet = ctx.fleet
        # The requests of replace runs, each awaited by its run (a run's errors are its own).
        self._fires: TaskSet = TaskSet("a replaceable run's request", say=False)
        self.keys = ctx.keys
        self.trigger = trigger
        # Runs a kept slot's claim through the gates of a due run (paused: skipped), or
        # records it skipped with the reason given (late); True when it runs.
        self.run_kept = run_kept
        self.spawn = ctx.tasks.spawn
        # By name: the sidecar's job set, the state bucket's jobs as they come and go.
        self.jobs = ctx.jobs
        # Runs of ``replace`` jobs going on here, by token: set when asked to stop,
        # the asker's claim, the run's own fence.
        self._running: dict[str, tuple[asyncio.Event, dict[str, Any], int]] = {}
        # Per job, the run ids seen holding its lock (never a kept slot's).
        self._holders: dict[str, collections.deque[str]] = {}
        # Stop keys being checked now (key, revision); every check against the stream.
        self._checking: set[tuple[str, int]] = set()
        self.checks = KeyChecks(ctx)
        # Tokens of kept runs this sidecar runs now (their request says so).
        self._buffered: set[str] = set()
        # Jobs whose kept slot this sidecar is checking or taking now, and those whose
        # keys changed meanwhile.
        self._taking: set[str] = set()
        self._again: set[str] = set()
        # Woken on every change of a lock (a replacer waits for one to go).
        self._lock_changed = asyncio.Event()
        fleet.key_listeners.append(self.changed)

    # ------------------------------------------------------------- the watch

    def changed(self, key: str) -> None:
        """A key of the state bucket changed ("" after a re-sync)."""
        kind, _, name = key.partition(".")
        if key == "":
            for each in self.jobs.values():
                self._saw_lock(each.name)
                if each.overlap == "buffer_one":
                    self._maybe_take(each.name)
            for token in list(self._running):
                self._look_for_stop(token)
            self._lock_changed.set()
            return
        job = self.jobs.get(name)
        if job is None:
            return
        if kind == "lock":
            self._saw_lock(name)
            self._lock_changed.set()
            if job.overlap == "buffer_one":
                self._maybe_take(name)
        elif kind == "buffer" and job.overlap == "buffer_one":
            self._maybe_take(name)
        elif kind == "stop" and job.overlap == "replace":
            entry = self.fleet.view.keys.get(key)
            wanted = entry.value.get("token") if entry is not None else None
            if isinstance(wanted, str) and wanted in self._running:
                self._look_for_stop(wanted)

    def _saw_lock(self, name: str) -> None:
        """Remember who holds `name`'s lock now: a kept slot never held it."""
        entry = self.fleet.view.keys.get(lock_key(name))
        token = entry.value.get("token") if entry is not None else None
        if isinstance(token, str):
            seen = self._holders.setdefault(name, collections.deque(maxlen=HOLDERS_KEPT))
            if token not in seen:
                seen.append(token)

    def _look_for_stop(self, token: str) -> None:
        """The stop request for the run `token` in the view, if any: checked against the
        stream first (sidecar/run/overlapcheck.py), then acted on."""
        event, asker, fence = self._running[token]
        name = str(asker.get("job", ""))
        key, job = stop_key(name), self.jobs.get(name)
        entry = self.fleet.view.keys.get(key)
        if job is None or entry is None or entry.value.get("token") != token or event.is_set():
            return
        if (key, entry.revision) in self._checking or self.checks.refused(key, entry.revision):
            return
        self._checking.add((key, entry.revision))
        self.spawn(self._stop_asked(job, token, key, entry, fence))

    async def _stop_asked(
        self, job: JobConfig, token: str, key: str, entry: Entry, fence: int
    ) -> None:
        try:
            asking = await self._stop_backed(job, key, entry, fence)
        finally:
            self._checking.discard((key, entry.revision))
        live = self._running.get(token)
        if asking is not None and live is not None:
            live[1].update({"slot": asking.slot, "fence": asking.seq})
            live[0].set()

    async def _stop_backed(
        self, job: JobConfig, key: str, entry: Entry, running_fence: int
    ) -> StoredClaim | None:
        """The asking claim when the stream backs the stop request `entry`; None when it
        does not (hostile: counted, logged once, deleted) or the stream did not answer."""
        if self.checks.refused(key, entry.revision):
            return None  # refused already: its delete is on its way to the view
        return await self.checks.stop(job, key, entry.revision, entry.value, running_fence)

    # ------------------------------------------------------- a held lock: wait or keep

    async def held(
        self,
        job: JobConfig,
        claim: Claim,
        holder: dict[str, Any],
        deadline: float,
        take: Callable[[], Awaitable[object]],
    ) -> tuple[str, str]:
        """A won slot of a ``replace`` or ``buffer_one`` job found ``lock.<job>`` held by
        `holder`. (TAKEN, ""): `take()` got the lock, run it; (KEPT, ""): kept in
        ``buffer.<job>``, nothing more to do now; (SKIPPED, why): record it skipped."""
        if job.overlap == "buffer_one":
            return await self._keep(job, claim, holder)
        return await self._replace(job, claim, holder, deadline, take)

    async def _keep(self, job: JobConfig, claim: Claim, holder: dict[str, Any]) -> tuple[str, str]:
        keys = self.keys()
        if keys is None:
            return SKIPPED, "overlap: a run is alive and the state bucket cannot keep this slot"
        value = {
            "job": job.name,
            "slot": claim.slot,
            "attempt": claim.attempt,
            "token": claim.token,
            "trigger": claim.trigger,
            "manual": claim.manual,
            "fence": claim.seq,
            "instance": self.config.instance_id,
            "kept_at": rfc3339(self.clock.wall()),
            "behind": holder.get("token"),
        }
        key = buffer_key(job.name)
        try:
            await keys.create(key, value, None)
        except KeyHeld as kept:
            other = slot_ms(kept.value.get("slot"))
            said = rfc3339(other / 1000) if other is not None else "another slot"
            return SKIPPED, f"overlap: a run is alive and {said} is already kept to run after it"
        except Exception as exc:
            return SKIPPED, f"overlap: a run is alive and this slot could not be kept: {exc!r}"
        self.metrics.runs_buffered_total.labels(job=job.name).inc()
        log.info(
            "job %s slot %s kept in %s: runs when the running one ends",
            job.name,
            rfc3339(claim.slot / 1000),
            key,
        )
        # Released meanwhile? Then nobody saw the lock go with this key there.
        self._maybe_take(job.name)
        return KEPT, ""

    async def _replace(
        self,
        job: JobConfig,
        claim: Claim,
        holder: dict[str, Any],
        deadline: float,
        take: Callable[[], Awaitable[object]],
    ) -> tuple[str, str]:
        keys = self.keys()
        name = job.name
        asked: str | None = None
        while True:
            token = holder.get("token")
            if _fence(holder) > claim.seq:
                return SKIPPED, "overlap: a newer slot of this job runs already"
            stop = self.fleet.view.keys.get(stop_key(name))
            if (
                stop is not None
                and stop.value.get("token") == token
                and _fence(stop.value) > (claim.seq)
                and await self._stop_backed(job, stop_key(name), stop, _fence(holder))
            ):
                return SKIPPED, "overlap: replaced by a newer slot before it ran"
            if keys is not None and isinstance(token, str) and asked != token:
                value = {
                    "job": name,
                    "token": token,
                    "slot": claim.slot,
                    "fence": claim.seq,
                    "instance": self.config.instance_id,
                    "at": rfc3339(self.clock.wall()),
                }
                try:
                    await keys.put(stop_key(name), value, self.config.nats.lease_ttl)
                    asked = token
                    log.info(
                        "job %s slot %s: asked the run of slot %s on %s to stop (overlap: replace)",
                        name,
                        rfc3339(claim.slot / 1000),
                        holder.get("slot"),
                        str(holder.get("instance", "?"))[:100],
                    )
                except Exception as exc:
                    log.warning("job %s: %s not written: %r", name, stop_key(name), exc)
            # Wait for the lock to go (the watch says so), or look again now and then.
            while lock_key(name) in self.fleet.view.keys:
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    return SKIPPED, (
                        f"overlap: the run of slot {holder.get('slot')} was asked to stop "
                        "and did not end within max_late"
                    )
                self._lock_changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._lock_changed.wait(), min(LOCK_POLL, left))
                if asked is None:
                    break  # the stop key was not written: try again
            if self.clock.monotonic() >= deadline:
                return SKIPPED, "overlap: the lock was not free within max_late"
            try:
                await take()
                return TAKEN, ""
            except KeyHeld as again:
                holder = again.value
            except Exception as exc:  # no answer: asked again until the deadline
                log.warning("job %s: %s not taken: %r", name, lock_key(name), exc)
                await asyncio.sleep(LOCK_POLL)

    # --------------------------------------------------------- a run that may be stopped

    def request_job(self, job: JobConfig, claim: Claim) -> JobConfig:
        """The job as its request is sent: a kept run's says it was kept."""
        if claim.token not in self._buffered:
            return job
        headers = {**job.request.headers, BUFFERED_HEADER: "true"}
        return dataclasses.replace(job, request=dataclasses.replace(job.request, headers=headers))

    async def run(
        self,
        job: JobConfig,
        claim: Claim,
        fire: Coroutine[Any, Any, TriggerResult],
        started: tuple[float, float],
    ) -> tuple[TriggerResult, bool]:
        """Await `fire`; for ``replace``, stop it when a newer slot asks (True: replaced).

        `started`: when the run's request went out, (wall, monotonic): a run cut off
        is recorded from then to the cut."""
        if job.overlap == "buffer_one":  # it holds the lock: never a kept slot's claim
            self._holders.setdefault(job.name, collections.deque(maxlen=HOLDERS_KEPT))
            self._holders[job.name].append(claim.token)
        if job.overlap != "replace":
            try:
                return await fire, False
            finally:
                self._buffered.discard(claim.token)
        self._buffered.discard(claim.token)
        event = asyncio.Event()
        asker: dict[str, Any] = {"job": job.name}
        self._running[claim.token] = (event, asker, claim.seq)
        self._look_for_stop(claim.token)
        task = self._fires.spawn(fire)  # awaited here, ended below if it outlives us
        asked = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({task, asked}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result(), False
            return await self._stop(job, claim, task, asker, started), True
        finally:
            asked.cancel()
            self._running.pop(claim.token, None)
            if not task.done():
                await cancel_all([task])

    async def _stop(
        self,
        job: JobConfig,
        claim: Claim,
        task: asyncio.Task[TriggerResult],
        asker: dict[str, Any],
        started: tuple[float, float],
    ) -> TriggerResult:
        """Send the cancel request, give the run `cancel.grace`, then close it."""
        cancel = job.cancel
        by = slot_ms(asker.get("slot"))
        newer = f"slot {rfc3339(by / 1000)}" if by is not None else "a newer slot"
        grace_end = self.clock.monotonic() + cancel.grace
        said = await self._cancel_request(job, claim, cancel.grace)
        left = max(0.0, grace_end - self.clock.monotonic())
        done, _ = await asyncio.wait({task}, timeout=left)
        self.metrics.runs_replaced_total.labels(job=job.name).inc()
        if done:
            answered = task.result()
            how = (
                f"it answered HTTP {answered.http_status}"
                if answered.http_status is not None
                else f"it ended: {answered.error}"
            )
            return dataclasses.replace(
                answered, ok=False, error=f"{REPLACED}: stopped for {newer} ({said}; {how})"
            )
        await cancel_all([task])
        # The run's own times, from its request to the cut (not from the cancel
        # request on: docs/CONFIG.md, overlap), as the drain records a run it cuts.
        started_at, since = started
        ran = self.clock.monotonic() - since
        log.warning(
            "job %s slot %s: the replaced run did not answer within cancel.grace %gs: "
            "its connection is closed",
            job.name,
            rfc3339(claim.slot / 1000),
            cancel.grace,
        )
        return cut_off(
            started_at,
            ran,
            f"{REPLACED}: stopped for {newer} ({said}; no answer within "
            f"cancel.grace {cancel.grace:g}s: connection closed)",
        )

    async def _cancel_request(self, job: JobConfig, claim: Claim, grace: float) -> str:
        """Send the app the cancel request of `claim`'s run; what came of it, in words."""
        cancel = job.cancel
        headers = {**job.request.headers, CANCEL_HEADER: claim.token}
        request = dataclasses.replace(
            job.request,
            method=cancel.method,
            path=cancel.path or job.request.path,
            body="",
            headers=headers,
            # Its path rendered with the replaced run's values (docs/TRIGGER.md).
            params=job.request.params or cancel.params,
            timeout=min(job.request.timeout, grace),
        )
        cancel_job = dataclasses.replace(job, request=request)
        try:
            status, _ = await self.trigger.send_once(
                cancel_job, claim.slot, claim.token, claim.attempt, claim.seq, Why("cancel")
            )
        except TriggerError as exc:
            self.metrics.cancel_requests_failed_total.labels(job=job.name).inc()
            log.warning("job %s: cancel request %s: %s", job.name, request.path, exc)
            return f"cancel request failed: {exc}"
        log.info("job %s: cancel request answered HTTP %d", job.name, status)
        return f"cancel request answered HTTP {status}"

    # --------------------------------------------------------------- the kept slot

    def _maybe_take(self, name: str) -> None:
        """Check the kept slot of `name` (sidecar/run/overlapcheck.py) as soon as it is
        seen, and run it if the lock is free (as the watch shows it)."""
        if buffer_key(name) not in self.fleet.view.keys:
            return
        if name in self._taking:
            self._again.add(name)  # changed meanwhile (the lock went): looked at again
            return
        self._taking.add(name)
        self.spawn(self._take(name))

    async def _take(self, name: str) -> None:
        try:
            await self._take_kept(name)
            while name in self._again:
                self._again.discard(name)
                await self._take_kept(name)
        finally:
            self._taking.discard(name)
            self._again.discard(name)

    async def _take_kept(self, name: str) -> None:
        job = self.jobs.get(name)
        keys = self.keys()
        if job is None or keys is None:
            return
        key = buffer_key(name)
        last = await keys.last(key)
        if last is None:
            return
        revision, value = last
        if value is None:
            return
        if self.checks.refused(key, revision):
            return
        holders = set(self._holders.get(name, ()))
        stored = await self.checks.kept(job, key, revision, value, holders)
        if stored is None or lock_key(name) in self.fleet.view.keys:
            return  # hostile (deleted), not checked, or the run it waits for goes on
        try:
            await keys.delete(key, revision)  # exactly one sidecar gets here per kept slot
        except CasConflict:
            return  # taken by another sidecar (or kept anew)
        self._run_kept(job, stored, value)

    def _run_kept(self, job: JobConfig, stored: StoredClaim, value: dict[str, Any]) -> None:
        """The kept slot's run, made of its stored claim (never of the key's value)."""
        claim = Claim(
            job=job.name,
            slot=stored.slot,
            token=stored.token,
            won=True,
            seq=stored.seq,
            publish_tries=0,
            duplicate_acks=0,
            ack_seconds=0.0,
            attempt=stored.attempt,
            trigger=stored.trigger,
        )
        window = kept_window(job, self.config.nats.lease_ttl)
        late = None
        if self.clock.wall() - stored.stored_at > window:
            late = f"overlap: kept longer than {window:g}s (the fleet was away); not run"
        log.info(
            "job %s: the kept slot %s (kept by %s at %s) %s",
            job.name,
            rfc3339(stored.slot / 1000),
            str(value.get("instance", "?"))[:100],
            str(value.get("kept_at", "?"))[:40],
            "is recorded skipped: too late" if late else "runs now",
        )
        self._buffered.add(stored.token)
        if not self.run_kept(job, claim, late):
            self._buffered.discard(stored.token)


__all__ = [
    "BUFFERED_HEADER",
    "CANCEL_HEADER",
    "Overlap",
    "buffer_key",
    "stop_key",
]
