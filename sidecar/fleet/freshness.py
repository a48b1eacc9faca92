"""Whether a sidecar's view of the state bucket is whole up to an instant.

A slot is judged with what the bucket held at its instant (docs/GUARANTEES.md,
"One fate per slot"). Before it is judged, ``Freshness.caught_up`` makes sure the
watch delivered every change stored before the instant: at once when it already
delivered one stored after it, else by one probe that every slot waiting
meanwhile shares (a presence write, or the stream's last sequence on a bucket
without TTLs), then the watch's delivery of it. The probe wakes on each entry the
watch delivers, not on a timer (tests/fleet/test_caught_up.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sidecar.core.clock import Clock, rfc3339
from sidecar.core.errors import PermissionDenied
from sidecar.core.natspy import jetstream_of
from sidecar.core.tasks import TaskSet
from sidecar.core.wire import instance_key
from sidecar.obs.ratelog import RateLimitedLog
from sidecar.store.kv import Keys, stream_now
from sidecar.store.state import PRESENCE_TTL, Bucket, View

if TYPE_CHECKING:
    from sidecar.config.model import JobConfig

log = logging.getLogger(__name__)
# Said once a minute a job at most: a re-read not in when a slot is judged.
_said = RateLimitedLog(log)

# caught_up: one probe's bound, and the pause between two probes.
PROBE_TIMEOUT = 2.0
PROBE_PAUSE = 0.05
# The probe wakes on each delivery of the watch; it looks again after this long
# without one too (a delete of a key the view did not hold tells nobody).
PROBE_LOOK = 0.05
# A slot is judged at most this long after its decider first looks (caught_up).
CAUGHT_UP_WAIT = 2.0
# A slot due while the bucket is read again waits for that read at most this long
# (and at most half of what is left of its claim's window): view_at.
REREAD_WAIT = 10.0
# caught_up waits for a server clock behind this host's by at most this much.
MAX_SERVER_BEHIND = 1.0


class Freshness:
    """The fate probe of one sidecar's view (`view`: fed by its watch)."""

    def __init__(
        self,
        view: View,
        clock: Clock,
        *,
        bucket: Callable[[], Bucket | None],
        instance_id: str,
        presence: dict[str, Any],
        tasks: TaskSet,
        denied: Callable[[str], bool] | None = None,
    ) -> None:
        self.view = view
        self.clock = clock
        self.bucket = bucket  # None until the fleet opened it
        self.instance_id = instance_id
        self.presence = presence  # the fleet's presence, written as it is at each probe
        self._tasks = tasks
        self.denied = denied
        self._probe: asyncio.Future[float] | None = None
        self._reread: asyncio.Task[None] | None = None
        # Set by each entry the watch delivers and by each re-sync: the probe's wake-up.
        self._delivered = asyncio.Event()
        view.on_delivered = self._delivered.set

    def stop(self) -> None:
        for task in (self._probe, self._reread):
            if task is not None:
                task.cancel()

    @property
    def rereading(self) -> bool:
        """Whether the bucket is being read again (after a reconnect or a stall): read
        once, and no watch follows it until the new read is in."""
        return self.view.synced and not self.view.following

    async def view_at(self, job: JobConfig, slot: int, stopping: asyncio.Event) -> bool:
        """Wait until the view holds every pause/skip change stored before the slot's
        instant (docs/GUARANTEES.md, "One fate per slot", rule 3), before the job loop
        judges the slot's first attempt; False when `stopping` is set first. While
        the bucket is read again (a reconnect, a stall: no watch follows it), a view
        that heard nothing after the instant is the one from before: the read is
        waited for, at most ``REREAD_WAIT`` and half of what is left of the claim's
        window. Then the probe (``caught_up``), at most half of what is left again;
        else judged with the view as it is (said, for a read not in).
        """
        end = slot / 1000 + job.max_late
        if self.rereading and slot / 1000 >= self.view.last_time:
            left = min(REREAD_WAIT, (end - self.clock.wall()) / 2)
            if not await self.reread(self.clock.monotonic() + left, stopping):
                if stopping.is_set():
                    return False
                _said.warning(
                    f"reread:{job.name}",
                    "job %s slot %s: the state bucket's new read is not in after %.1fs; "
                    "judged with the view from before it",
                    job.name,
                    rfc3339(slot / 1000),
                    max(0.0, left),
                )
        wait = min(CAUGHT_UP_WAIT, max(0.0, (end - self.clock.wall()) / 2))
        if not await self.caught_up(slot / 1000, self.clock.monotonic() + wait):
            log.debug("job %s slot %s judged with the view as it is", job.name, slot)
        return True

    async def reread(self, deadline: float, stopping: asyncio.Event) -> bool:
        """Wait until the bucket's new read is in, at most until `deadline`
        (monotonic) or until `stopping` is set; whether it is. One task waits for
        every slot waiting meanwhile (the thousands of a burst cost one each, not a
        timer each); it wakes on the read's swap (``on_delivered``)."""
        if self.view.following:
            return True
        task = self._reread
        if task is None or task.done():
            task = self._reread = self._tasks.spawn(self._until_following(stopping))
        left = deadline - self.clock.monotonic()
        if left > 0:
            await asyncio.wait((task,), timeout=left)
        return self.view.following

    async def _until_following(self, stopping: asyncio.Event) -> None:
        while not self.view.following and not stopping.is_set():
            await self._next_delivery(PROBE_LOOK)  # the new read's swap tells it

    async def _next_delivery(self, left: float) -> None:
        """Until the watch delivers something (an entry, or a full read's swap:
        ``on_delivered``), or at most `left` and ``PROBE_LOOK`` seconds (a delete of a
        key the view did not hold tells nobody)."""
        self._delivered.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._delivered.wait(), min(left, PROBE_LOOK))

    async def caught_up(self, instant: float, deadline: float) -> bool:
        """Whether the view holds every change the bucket stored before `instant`
        (server time, epoch s), waiting for it until `deadline` (monotonic).

        True at once when the watch delivered something stored after the instant
        (the stream's order: all before it came first). Else one probe, shared
        by every slot waiting meanwhile: this sidecar renews its presence (a
        write the watch delivers with the server's time) or, on a bucket
        without TTLs, asks the bucket's last sequence with the server's time
        and waits for the watch to deliver it. Either way the view is then
        whole up to a time of the server's clock, never this host's: a host
        whose clock runs ahead waits for the server to reach the instant.
        Costs nothing while the fleet writes presence more often than slots
        come; at most one request in flight per sidecar otherwise.
        """
        while self.view.last_time <= instant:
            if not self.view.synced or self.clock.monotonic() >= deadline:
                return False
            probe = self._probe
            if probe is None or probe.done():
                probe = self._probe = self._tasks.spawn(self._probe_once())
                probe.add_done_callback(_retrieved)
            left = max(0.0, deadline - self.clock.monotonic())
            try:
                # asyncio.wait leaves the shared probe running when this slot stops
                # waiting, as a shield would, without a shield's future for each of
                # the thousands of slots of a burst that wait on one probe.
                done, _ = await asyncio.wait((probe,), timeout=left)
                if not done:
                    raise TimeoutError(f"no answer within {left:.3f}s")
                whole_at = probe.result()
            except Exception as exc:  # NATS slow or away: judged with the view as it is
                log.debug("state bucket freshness probe: %r", exc)
                return self.view.last_time > instant
            if whole_at > instant:
                return True  # the view holds all the bucket had when it was asked
            if (behind := instant - whole_at) >= 0:
                # The server's clock has not reached the instant yet (this host's runs
                # ahead): ask again when it should have, not in a tight loop; far
                # ahead (a suspend, a wrong clock), judge now, the fate message decides.
                if behind > MAX_SERVER_BEHIND:
                    return False
                left = max(0.0, deadline - self.clock.monotonic())
                await asyncio.sleep(min(max(behind, PROBE_PAUSE), left))
        return True

    async def _probe_once(self) -> float:
        """One freshness probe: returns once the watch delivered everything the bucket
        held when it was asked, with the server's time up to which the view is
        whole (the presence write's own time, or STREAM.INFO's ``ts``)."""
        bucket = self.bucket()
        if bucket is None:
            return 0.0
        if bucket.ttl:
            key = instance_key(self.instance_id)
            keys = Keys(bucket, self.denied)
            if self.denied is not None and self.denied(keys.subject(key)):
                # NATS refuses this user the write: no answer would come; the view judges.
                raise PermissionDenied("publish", keys.subject(key))
            target = await asyncio.wait_for(
                keys.put(key, self.presence, PRESENCE_TTL), PROBE_TIMEOUT
            )
            whole_at: float | None = None
        else:
            asked = self.clock.wall()
            target, whole_at = await asyncio.wait_for(
                stream_now(jetstream_of(bucket.kv), bucket.spec.stream, PROBE_TIMEOUT),
                PROBE_TIMEOUT,
            )
            if whole_at is None:  # the server did not say its time: allow the most skew
                whole_at = asked - MAX_SERVER_BEHIND
        end = self.clock.monotonic() + PROBE_TIMEOUT
        while self.view.last_revision < target:
            left = end - self.clock.monotonic()
            if left <= 0:
                raise TimeoutError(f"the watch did not deliver revision {target}")
            await self._next_delivery(left)
        # After the presence write: its entry (or a later one) set last_time.
        return self.view.last_time if whole_at is None else whole_at


def _retrieved(future: asyncio.Future[float]) -> None:
    """A probe nobody waits for any more: its error is not "never retrieved"."""
    if not future.cancelled():
        future.exception()
