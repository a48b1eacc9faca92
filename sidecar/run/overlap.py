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
  again (or skipped when another slot is kept already).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from sidecar.core.bounds import slot_ms
from sidecar.core.clock import Clock, rfc3339
from sidecar.core.errors import CasConflict, KeyHeld, TriggerError
from sidecar.core.tasks import TaskSet, cancel_all
from sidecar.core.wire import SCHEDULED
from sidecar.run.claim import Claim
from sidecar.run.lease import KEPT, REPLACED, SKIPPED, TAKEN
from sidecar.run.trigger import Trigger, TriggerResult, Why, cut_off
from sidecar.when.attempts import lock_key

if TYPE_CHECKING:
    from sidecar.config.load import Config, JobConfig
    from sidecar.fleet.member import Fleet
    from sidecar.obs.metrics import Metrics
    from sidecar.store.kv import Keys

log = logging.getLogger("sidecar.overlap")

# The header of a cancel request: the run token (X-Anarchon-Run-Id) of the run to stop.
CANCEL_HEADER = "X-Anarchon-Cancel"
# The header of a run kept by ``buffer_one`` and run after the one it fell during.
BUFFERED_HEADER = "X-Anarchon-Buffered"
# A waiting replacer looks at the lock this often (and at once when the watch
# delivers a change of it).
LOCK_POLL = 0.25


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
        config: Config,
        metrics: Metrics,
        clock: Clock,
        fleet: Fleet,
        keys: Callable[[], Keys | None],
        trigger: Trigger,
        start_run: Callable[[JobConfig, Claim, float], object],
        spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.fleet = fleet
        # The requests of replace runs, each awaited by its run (a run's errors are its own).
        self._fires: TaskSet = TaskSet("a replaceable run's request", say=False)
        self.keys = keys
        self.trigger = trigger
        self.start_run = start_run
        self.spawn = spawn
        # By name, made again when config.jobs changes (jobs of the state bucket come
        # and go: sidecar/admin/bucket_jobs.py sets the tuple anew).
        self._jobs: dict[str, JobConfig] = {}
        self._jobs_of: tuple[JobConfig, ...] | None = None
        # Runs of ``replace`` jobs going on here, by token: set when asked to stop.
        self._running: dict[str, tuple[asyncio.Event, dict[str, Any]]] = {}
        # Tokens of kept runs this sidecar runs now (their request says so).
        self._buffered: set[str] = set()
        # Jobs whose kept slot this sidecar is trying to take now.
        self._taking: set[str] = set()
        # Woken on every change of a lock (a replacer waits for one to go).
        self._lock_changed = asyncio.Event()
        fleet.key_listeners.append(self.changed)

    @property
    def jobs(self) -> dict[str, JobConfig]:
        if self._jobs_of is not self.config.jobs:
            self._jobs_of = self.config.jobs
            self._jobs = {job.name: job for job in self.config.jobs}
        return self._jobs

    # ------------------------------------------------------------- the watch

    def changed(self, key: str) -> None:
        """A key of the state bucket changed ("" after a re-sync)."""
        kind, _, name = key.partition(".")
        if key == "":
            for each in self.jobs.values():
                if each.overlap == "buffer_one":
                    self._maybe_take(each.name)
            for token, (event, _) in self._running.items():
                self._look_for_stop(token, event)
            self._lock_changed.set()
            return
        job = self.jobs.get(name)
        if job is None:
            return
        if kind == "lock":
            self._lock_changed.set()
            if job.overlap == "buffer_one":
                self._maybe_take(name)
        elif kind == "buffer" and job.overlap == "buffer_one":
            self._maybe_take(name)
        elif kind == "stop" and job.overlap == "replace":
            entry = self.fleet.view.keys.get(key)
            wanted = entry.value.get("token") if entry is not None else None
            if entry is not None and isinstance(wanted, str) and wanted in self._running:
                event, asker = self._running[wanted]
                asker.update(entry.value)
                event.set()

    def _look_for_stop(self, token: str, event: asyncio.Event) -> None:
        entry = self.fleet.view.keys.get(stop_key(self._running_job(token)))
        if entry is not None and entry.value.get("token") == token:
            self._running[token][1].update(entry.value)
            event.set()

    def _running_job(self, token: str) -> str:
        return str(self._running[token][1].get("job", ""))

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
        if job.overlap != "replace":
            try:
                return await fire, False
            finally:
                self._buffered.discard(claim.token)
        self._buffered.discard(claim.token)
        event = asyncio.Event()
        asker: dict[str, Any] = {"job": job.name}
        self._running[claim.token] = (event, asker)
        self._look_for_stop(claim.token, event)
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
        """Run the kept slot of `name` if the lock is free (as the watch shows it)."""
        view = self.fleet.view.keys
        if buffer_key(name) not in view or lock_key(name) in view or name in self._taking:
            return
        self._taking.add(name)
        self.spawn(self._take(name))

    async def _take(self, name: str) -> None:
        try:
            await self._take_kept(name)
        finally:
            self._taking.discard(name)

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
        slot = slot_ms(value.get("slot"))
        token = value.get("token")
        if slot is None or not isinstance(token, str) or not token:
            log.warning("job %s: %s unreadable, deleted: %r", name, key, value)
            with contextlib.suppress(Exception):
                await keys.delete(key, revision)
            return
        try:
            await keys.delete(key, revision)  # exactly one sidecar gets here per kept slot
        except CasConflict:
            return  # taken by another sidecar (or kept anew)
        attempt = value.get("attempt")
        trigger = value.get("trigger")
        claim = Claim(
            job=name,
            slot=slot,
            token=token,
            won=True,
            seq=_fence(value),
            publish_tries=0,
            duplicate_acks=0,
            ack_seconds=0.0,
            manual=value.get("manual") is True,
            attempt=attempt if isinstance(attempt, int) and 1 <= attempt <= 11 else 1,
            trigger=trigger if isinstance(trigger, str) and trigger else SCHEDULED,
        )
        log.info(
            "job %s: running the kept slot %s (kept by %s at %s)",
            name,
            rfc3339(slot / 1000),
            str(value.get("instance", "?"))[:100],
            str(value.get("kept_at", "?"))[:40],
        )
        self._buffered.add(token)
        self.start_run(job, claim, self.clock.wall())


__all__ = [
    "BUFFERED_HEADER",
    "CANCEL_HEADER",
    "Overlap",
    "buffer_key",
    "stop_key",
]
