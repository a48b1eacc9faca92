"""The state bucket's watch: keeps one sidecar's View in step with the bucket.

One watch of the whole bucket feeds the View (sidecar/store/state.py). It is
restarted (a full re-sync) after a reconnect and whenever the watchdog finds
the watch still short of the sequence the bucket had at the previous check,
two checks in a row: nats-py's ordered consumer can stall without noticing
(nats-io/nats.py#510). The watchdog also tells the Fleet when the bucket's
settings change, or when the bucket is deleted or made again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from nats.js.errors import NotFoundError

from sidecar.core import failpoints
from sidecar.core.backoff import Backoff
from sidecar.core.natspy import jetstream_of, read_initial
from sidecar.core.tasks import TaskSet
from sidecar.store.bucketcheck import BucketFacts, facts_of
from sidecar.store.digests import BUCKET_PREFIX
from sidecar.store.state import BUCKET_REPLACED, UNSEEN, Bucket, Removal, View
from sidecar.when.attempts import is_lease_key

log = logging.getLogger(__name__)

# Watchdog: how often the bucket's last sequence is compared with the view's.
WATCHDOG_EVERY = 3.0
# After the watch failed (NATS away or slow), it starts again this long after.
WATCH_RETRY = 1.0
# Keys a re-read does not hand to the key listeners one at a time: the "" after
# it stands for them (every listener of them re-reads them all on ""). Instance
# keys: one at a time would compare every instance's jobs once per instance.
# Job keys: a job set of 100,000 read at the start would be 100,000 calls of
# each listener before the sidecar is ready (docs/PERFORMANCE.md "100,000 jobs").
TOLD_BY_FULL_READ = ("instance.", BUCKET_PREFIX)


class Stall:
    """The watchdog's verdict: the watch is stalled when, two looks in a row, it has
    not delivered what the bucket held at the look before.

    Not "the bucket is ahead of the view now": a bucket written all the time (a
    hundred sidecars' presence and leases) nearly always has its newest write on
    the way, and every sidecar would re-read the whole bucket every few seconds.
    """

    def __init__(self, delivered: int) -> None:
        self.target = delivered  # the bucket's last sequence at the previous look
        self.behind = 0

    def look(self, last_seq: int, delivered: int) -> bool:
        self.behind = self.behind + 1 if delivered < self.target else 0
        self.target = last_seq
        return self.behind >= 2


class Watch:
    """Keeps a View in step with the bucket: one watch, re-synced when it may be stale."""

    def __init__(
        self, bucket: Bucket, view: View, on_changed: Callable[[], None] | None = None
    ) -> None:
        self.bucket = bucket
        self.view = view
        self._watcher: Any = None
        self._pump: asyncio.Task[None] | None = None
        self._tasks = TaskSet("the watch", say=False)
        self._resync = asyncio.Event()
        # Called when the watchdog sees the bucket's settings change, or the bucket
        # deleted or made again (its creation time changed): the Fleet checks it.
        self.on_changed = on_changed
        self._facts: BucketFacts | None = None
        self.replaced = False  # the bucket went away since the last full read

    def resync(self) -> None:
        """Start a fresh watch (after a reconnect, or when the watchdog says so)."""
        self._resync.set()

    async def run(self) -> None:
        """Watch until cancelled; the watchdog restarts a silent or stale watch."""
        backoff = Backoff(WATCH_RETRY, WATCH_RETRY)
        while True:
            try:
                await self._start()
                stall = Stall(self.view.last_revision)
                while not self._resync.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._resync.wait(), WATCHDOG_EVERY)
                    if self._resync.is_set():
                        break
                    info = await self._info()
                    facts = facts_of(info)
                    if facts != self._facts:
                        self._bucket_changed(facts)
                        break
                    if stall.look(int(info.state.last_seq), self.view.last_revision):
                        log.warning("state bucket watch fell behind; re-reading the bucket")
                        break
            except asyncio.CancelledError:
                await self._stop()
                raise
            except Exception as exc:  # NATS away or slow: try again shortly
                log.debug("state bucket watch: %r", exc)
                self.view.following = False  # read again once it answers (_stop, _start)
                await backoff.sleep()
            await self._stop()

    async def _info(self) -> Any:
        """The bucket's stream info; a missing bucket is a change the Fleet is told of."""
        try:
            return await jetstream_of(self.bucket.kv).stream_info(self.bucket.spec.stream)
        except NotFoundError:
            if not self.replaced:
                log.warning("state bucket %s disappeared", self.bucket.spec.bucket)
                self._bucket_changed(None)
            raise

    def _bucket_changed(self, facts: BucketFacts | None) -> None:
        old = self._facts
        if facts is None or (old is not None and facts.created != old.created):
            self.replaced = True
            if facts is not None:
                log.warning(
                    "state bucket %s was deleted and made again under this sidecar; "
                    "re-reading it and checking its settings",
                    self.bucket.spec.bucket,
                )
        self._facts = facts
        if self.on_changed is not None:
            self.on_changed()

    async def _start(self) -> None:
        self._resync.clear()
        if failpoints.ENABLED:
            await failpoints.hit("watch.read")
        info = await self._info()
        facts = facts_of(info)
        if self._facts is not None and facts.created != self._facts.created:
            self._bucket_changed(facts)
        self._facts = facts
        fresh = View(on_change=None, keep_markers=True, on_unknown=self.view.on_unknown)
        watcher = await self.bucket.kv.watchall()
        self._watcher = watcher
        # The initial values make the fresh view (what is queued already is taken
        # without a task and a timer each; an early end marker is not trusted).
        await read_initial(watcher, fresh.apply_entry, 10.0)
        # Every change stored up to the last sequence asked before the watch began is
        # in what it read (a key's value then, or a later one). Not the sequence asked
        # after the read: the changes stored meanwhile wait for _follow, and the fate
        # probe would take the view as holding them (tests/store/test_watch_revision.py).
        fresh.last_revision = max(fresh.last_revision, int(info.state.last_seq))
        changed = set(self.view.keys) ^ set(fresh.keys) | {
            k for k in fresh.keys if k in self.view.keys and self.view.keys[k] != fresh.keys[k]
        }
        replaced, self.replaced = self.replaced, False
        gone = [
            Removal(key, entry, *fresh.markers.get(key, (None, None)))
            for key, entry in self.view.keys.items()
            if key not in fresh.keys
        ]
        # A lease taken again meanwhile (another token): its end was not seen, an
        # expiry or a release; the judges look for its run's result (UNSEEN).
        gone += [
            Removal(key, entry, UNSEEN, None)
            for key, entry in self.view.keys.items()
            if is_lease_key(key)
            and key in fresh.keys
            and fresh.keys[key].value.get("token") != entry.value.get("token")
        ]
        if replaced:
            # Every key of the old bucket vanished without a marker; a key of the
            # same name in the new one (another holder's lock) is not the old one.
            gone = [
                Removal(key, entry, BUCKET_REPLACED, None)
                for key, entry in self.view.keys.items()
                if key not in fresh.keys
                or fresh.keys[key].value.get("token") != entry.value.get("token")
            ]
        for key, timeline in fresh.timelines.items():
            self.view.reread(key, timeline)
        self.view.last_time = max(self.view.last_time, fresh.last_time)
        self.view.keys = fresh.keys
        self.view._jobs_seen = fresh._jobs_seen
        self.view._presence_hash = fresh._presence_hash
        self.view.presence_generation += 1
        self.view.lock_markers = fresh.lock_markers
        self.view.last_revision = fresh.last_revision
        self.view.synced = self.view.following = True
        if self.view.on_delivered is not None:  # the revision moved without an entry
            self.view.on_delivered()
        if self.view.on_removed is not None:
            for removal in gone:
                self.view.on_removed(removal)
        if self.view.on_change is not None:
            for key in sorted(k for k in changed if not k.startswith(TOLD_BY_FULL_READ)):
                self.view.on_change(key)
            self.view.on_change("")
        self._pump = self._tasks.spawn(self._follow(watcher))

    async def _follow(self, watcher: Any) -> None:
        async for entry in watcher:
            if entry is None:
                continue
            self.view.apply_entry(entry)

    async def _stop(self) -> None:
        self.view.following = False
        await self._tasks.cancel()
        self._pump = None
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()
            self._watcher = None
