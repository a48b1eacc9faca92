"""What keeps the fleet page live: one feed per sidecar, however many viewers.

Two sources, both already one per sidecar: the state bucket's watch
(sidecar/fleet/member.py tells every key it delivers: pauses, leases, presence,
actions) and one ordered consumer on ``<prefix>>`` that follows what the
stream stores (claims and results of every implementation sharing it; what
the stream refused as a duplicate never shows). It is started by the first
viewer, not at start-up: a sidecar nobody looks at pays nothing.

Viewers get server-sent events, coalesced every ``FLUSH_EVERY``: one event
names the jobs that changed (or says ``all``), so a viewer fetches only those
rows. A viewer that does not keep up (its queue of ``QUEUE`` events is full)
is dropped; its browser reconnects and reloads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from sidecar.admin.recent import TAIL_MAX, TAIL_PER_JOB, Recent, read_pass
from sidecar.core.backoff import Backoff
from sidecar.core.natspy import delivered_nothing
from sidecar.core.tasks import TaskSet
from sidecar.when.attempts import lease_job

if TYPE_CHECKING:
    from sidecar.config.load import Config
    from sidecar.fleet.member import Fleet

log = logging.getLogger(__name__)

FLUSH_EVERY = 0.25
QUEUE = 64
PING_EVERY = 15.0
WATCHDOG_EVERY = 5.0
# After the feed failed (NATS away, the stream missing), it starts again this long after.
FEED_RETRY = 2.0
MANY = 50  # more changed jobs than this in one flush: "all"


class Live:
    """The recent runs of every job, kept current, and the viewers' event streams."""

    def __init__(self, config: Config, fleet: Fleet) -> None:
        self.config = config
        self.stream = config.nats.stream
        self.prefix = config.nats.prefix
        self.recent = Recent(self.prefix)
        self.loaded = asyncio.Event()
        self.viewers: set[asyncio.Queue[bytes | None]] = set()
        self._jobs = fleet.jobs  # the job set (sidecar/config/jobset.py)
        # Counts every change seen: objects built before the last one are stale.
        self.version = 0
        # Jobs changed since the page last rebuilt them (it empties this).
        self.dirty: set[str] = set(self._jobs)
        # When each instance's presence was last delivered by the watch (epoch s).
        self.seen: dict[str, float] = {}
        self._changed: set[str] = set()
        self._fleet_changed = False
        self._tasks = TaskSet("the live feed", say=False)
        self._js: JetStreamContext | None = None
        self._sub: object | None = None
        fleet.key_listeners.append(self._key)

    # ------------------------------------------------------------------ lifecycle

    def attach(self, js: JetStreamContext) -> None:
        self._js = js

    def ensure_started(self) -> None:
        """Start following the stream (once); the first viewer calls this."""
        if self._tasks or self._js is None:
            return
        self._tasks.spawn(self._follow(self._js))
        self._tasks.spawn(self._flush_loop())

    async def stop(self) -> None:
        for queue in list(self.viewers):
            _offer(queue, None)
        await self._tasks.cancel()
        await self._unsubscribe()

    # ------------------------------------------------------------------ the feed

    async def _follow(self, js: JetStreamContext) -> None:
        """Fill the recent runs, then follow every message the stream stores."""
        backoff = Backoff(FEED_RETRY, FEED_RETRY)
        while True:
            try:
                info = await js.stream_info(self.stream)
                if not self.loaded.is_set():
                    last = int(info.state.last_seq)
                    if info.state.messages:
                        await read_pass(
                            js,
                            self.stream,
                            self.prefix,
                            self.recent,
                            ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT),
                        )
                    tail = min(TAIL_MAX, TAIL_PER_JOB * max(1, len(self._jobs)))
                    start = max(int(info.state.first_seq), last - tail + 1, 1)
                else:
                    start = self.recent.last_seq + 1
                await self._subscribe(js, start)
                if int(info.state.messages) == 0 or start > int(info.state.last_seq):
                    self.loaded.set()
                behind = 0
                while True:
                    await asyncio.sleep(WATCHDOG_EVERY)
                    info = await js.stream_info(self.stream)
                    # Messages of other subjects also raise last_seq: a silent
                    # feed is restarted from where it was, which costs little.
                    behind = behind + 1 if int(info.state.last_seq) > self.recent.last_seq else 0
                    if behind >= 2:
                        break
                await self._unsubscribe()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away or the stream missing: try again
                log.debug("fleet page feed: %r", exc)
                await self._unsubscribe()
                await backoff.sleep()

    async def _subscribe(self, js: JetStreamContext, start: int) -> None:
        async def on_msg(msg: Msg) -> None:
            meta = msg.metadata
            job = self.recent.add(meta.sequence.stream, msg.subject, msg.data)
            self.version += 1
            if meta.num_pending == 0:
                self.loaded.set()
            if job is not None and job in self._jobs:
                self.dirty.add(job)
                if self.loaded.is_set():
                    self._changed.add(job)

        self._sub = sub = await js.subscribe(
            f"{self.prefix}>",
            stream=self.stream,
            cb=on_msg,
            ordered_consumer=True,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start
            ),
        )
        if await delivered_nothing(sub):
            self.loaded.set()

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()  # type: ignore[attr-defined]
            except Exception as exc:  # the connection is gone: nothing to undo
                log.debug("fleet page feed: unsubscribe: %r", exc)

    def jobs_changed(self) -> None:
        """The config's jobs changed (a job of the state bucket came or went)."""
        self.version += 1
        self._fleet_changed = True
        self._changed.update(self._jobs)
        self.dirty.update(self._jobs)

    def _key(self, key: str) -> None:
        """A key the state bucket's watch delivered ("" after a re-sync)."""
        self.version += 1
        if key.startswith("instance."):
            self.seen[key[len("instance.") :]] = time.time()
        if not key or key.startswith("instance."):
            self._fleet_changed = True
            if not key:
                self._changed.update(self._jobs)
                self.dirty.update(self._jobs)
            return
        head, _, rest = key.partition(".")
        if head == "conc":  # a concurrency slot: the fleet's held/limit, of no one job
            self._fleet_changed = True
            return
        job = lease_job(key) if head in ("run", "lock") else rest.split(".", 1)[0]
        if job is not None and job in self._jobs:
            self._changed.add(job)
            self.dirty.add(job)

    # ------------------------------------------------------------------ viewers

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY)
            if not (self._changed or self._fleet_changed) or not self.viewers:
                self._changed.clear()
                self._fleet_changed = False
                continue
            changed = sorted(self._changed)
            event: dict[str, object] = {"fleet": self._fleet_changed}
            if len(changed) > MANY:
                event["all"] = True
            else:
                event["jobs"] = changed
            self._changed.clear()
            self._fleet_changed = False
            chunk = f"event: change\ndata: {json.dumps(event)}\n\n".encode()
            for queue in list(self.viewers):
                if not _offer(queue, chunk):
                    self.viewers.discard(queue)
                    _offer(queue, None, force=True)

    async def events(self) -> AsyncIterator[bytes]:
        """One viewer's event stream: a retry hint, then changes, pings in between."""
        self.ensure_started()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE)
        self.viewers.add(queue)
        try:
            yield b"retry: 2000\nevent: hello\ndata: {}\n\n"
            while True:
                try:
                    chunk = await asyncio.wait_for(queue.get(), PING_EVERY)
                except TimeoutError:
                    chunk = b": ping\n\n"
                if chunk is None:
                    return
                yield chunk
        finally:
            self.viewers.discard(queue)


def _offer(queue: asyncio.Queue[bytes | None], item: bytes | None, force: bool = False) -> bool:
    """Put without waiting; False when full. ``force`` makes room (for the end marker)."""
    try:
        queue.put_nowait(item)
        return True
    except asyncio.QueueFull:
        if force:
            try:
                queue.get_nowait()
                queue.put_nowait(item)
            except (asyncio.QueueEmpty, asyncio.QueueFull):
                pass
        return False
