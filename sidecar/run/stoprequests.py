"""``overlap: replace``: the stop request (``stop.<job>``) a newer slot writes for
the running run, and the run stopped for it (cancel request, ``cancel.grace``,
then its connection closed).

What the policy does is said in sidecar/run/overlap.py's docstring, which hands
this part the watch's changes, a won slot that found the lock held, and each run
of a ``replace`` job. A stop request is honoured only once the stream backs it
(sidecar/run/overlapcheck.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from sidecar.core.bounds import slot_ms
from sidecar.core.clock import rfc3339
from sidecar.core.errors import KeyHeld, TriggerError
from sidecar.core.tasks import TaskSet, cancel_all
from sidecar.core.wakers import Wakers
from sidecar.run.claim import Claim
from sidecar.run.lease import REPLACED, SKIPPED, TAKEN
from sidecar.run.overlapcheck import KeyChecks, StoredClaim
from sidecar.run.trigger import Trigger, TriggerResult, Why, cut_off
from sidecar.store.state import Entry
from sidecar.when.attempts import lock_key

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.context import Context

log = logging.getLogger(__name__)

# The header of a cancel request: the run token (X-Anarchon-Run-Id) of the run to stop.
CANCEL_HEADER = "X-Anarchon-Cancel"
# A waiting replacer looks at the lock this often (and at once when the watch
# delivers a change of it).
LOCK_POLL = 0.25


def stop_key(job: str) -> str:
    return f"stop.{job}"


def _fence(value: dict[str, Any] | None) -> int:
    raw = (value or {}).get("fence")
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else 0


class StopRequests:
    """One sidecar's part in ``replace``: asks a running run to stop, stops its own."""

    def __init__(self, ctx: Context, checks: KeyChecks, trigger: Trigger) -> None:
        self.config = ctx.config
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.fleet = ctx.fleet
        self.keys = ctx.keys
        self.trigger = trigger
        self.spawn = ctx.tasks.spawn
        # By name: the sidecar's job set, the state bucket's jobs as they come and go.
        self.jobs = ctx.jobs
        self.checks = checks
        # The requests of replace runs, each awaited by its run (a run's errors are its own).
        self._fires: TaskSet = TaskSet("a replaceable run's request", say=False)
        # Runs of ``replace`` jobs going on here, by token: set when asked to stop,
        # the asker's claim, the run's own fence.
        self._running: dict[str, tuple[asyncio.Event, dict[str, Any], int]] = {}
        # Stop keys being checked now (key, revision); every check against the stream.
        self._checking: set[tuple[str, int]] = set()
        # By job: the replacers waiting here for its lock to go, each woken by a change
        # of that lock only (a burst of replace jobs is thousands of both).
        self._lock_waiters = Wakers()

    # ------------------------------------------------------------- the watch

    def changed(self, key: str) -> None:
        """``stop.<job>`` changed: acted on if it asks a run of this sidecar to stop."""
        entry = self.fleet.view.keys.get(key)
        wanted = entry.value.get("token") if entry is not None else None
        if isinstance(wanted, str) and wanted in self._running:
            self._look_for_stop(wanted)

    def resynced(self) -> None:
        """The view was read anew: every run here looks for its stop request again, and
        a replacer waiting for a lock looks at it again."""
        for token in list(self._running):
            self._look_for_stop(token)
        self._lock_waiters.wake_all()

    def lock_changed(self, job: str) -> None:
        """``lock.<job>`` changed: the replacers waiting for it to go look again."""
        self._lock_waiters.wake(job)

    async def _lock_may_have_gone(self, job: str, timeout: float) -> None:
        """Until ``lock.<job>`` changes (``lock_changed``), a re-read, or `timeout`."""
        await self._lock_waiters.wait((job,), timeout)

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

    # ------------------------------------------------- a held lock: ask it to stop, wait

    async def replace(
        self,
        job: JobConfig,
        claim: Claim,
        holder: dict[str, Any],
        deadline: float,
        take: Callable[[], Awaitable[object]],
    ) -> tuple[str, str]:
        """Ask `holder`'s run to stop (``stop.<job>``), then take the lock with `take()`
        once it goes: (TAKEN, ""), or (SKIPPED, why) when a newer slot runs or asked
        meanwhile, or the lock is not free by `deadline` (monotonic)."""
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
                await self._lock_may_have_gone(name, min(LOCK_POLL, left))
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

    async def run(
        self,
        job: JobConfig,
        claim: Claim,
        fire: Coroutine[Any, Any, TriggerResult],
        started: tuple[float, float],
    ) -> tuple[TriggerResult, bool]:
        """Await `fire`, stopped when a newer slot asks (True: replaced).

        `started`: when the run's request went out, (wall, monotonic): a run cut off
        is recorded from then to the cut."""
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


__all__ = ["CANCEL_HEADER", "StopRequests", "stop_key"]
