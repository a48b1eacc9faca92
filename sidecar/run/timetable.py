"""Every job's schedule on one timer: wait for a slot, then check, claim, run it.

A job waiting for its next slot is an entry of one heap (sidecar/core/timer.py),
not a task of its own: at 100,000 jobs that is the difference between a few
hundred MiB and idle CPU that grows with the jobs, and a flat cost. A job has
a task only while one of its slots is handled (``Jobs.attempt``: checked,
claimed, its run started); the run itself is a task of ``Jobs.runs``. The slot
after is armed when that task ends, so one job's slots are handled one after
the other, in order, as its own loop handled them before.

What each slot goes through is unchanged (docs/GUARANTEES.md): fired at the slot
plus a random jitter in [0, jitter]; skipped `late` past max_late; not claimed
after end_at or with max_runs reached (the slots pass unclaimed, said once);
a job of the state bucket removed ("retired") ends between two slots, and one
put again with new settings goes on from the slot its old walk waited for (a
slot whose time had come, not its jitter, is not dropped); on stop, a slot
whose time had come but whose jitter had not is counted ``shutdown``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from sidecar.core.clock import Clock
from sidecar.core.tasks import TaskSet
from sidecar.core.timer import Entry, Timer

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.obs.metrics import Metrics

log = logging.getLogger(__name__)


_KNOWN, _OVER, _PASSING, _RETIRED = 1, 2, 4, 8


class Walk(Entry):
    """One job's place in its schedule: the slot it waits for, and how it ends.

    Armed, it is its own entry in the timer's heap (``item`` is the walk itself,
    None when not armed): no second object a job (40 B at 100,000 jobs, issue 49)."""

    __slots__ = ("_flags", "done", "job", "previous", "slot")

    def __init__(self, job: JobConfig, slot: int) -> None:
        super().__init__(None)
        self.job = job
        self.slot = slot
        self.previous: int | None = None
        # known, over, passing, retired (below): four flags in one small int, one
        # slot instead of four (24 B a job at 100,000 jobs, issue 49).
        self._flags = 0
        # Made when someone waits for the walk's end (``retire``): none per job.
        self.done: asyncio.Future[None] | None = None

    def _flag(self, bit: int) -> bool:
        return bool(self._flags & bit)

    def _set(self, bit: int, on: bool) -> None:
        self._flags = self._flags | bit if on else self._flags & ~bit

    @property
    def known(self) -> bool:
        """`previous` is the schedule's slot before `slot`."""
        return self._flag(_KNOWN)

    @known.setter
    def known(self, on: bool) -> None:
        self._set(_KNOWN, on)

    @property
    def over(self) -> bool:
        """Waiting for a slot that is not claimed (max_runs)."""
        return self._flag(_OVER)

    @over.setter
    def over(self, on: bool) -> None:
        self._set(_OVER, on)

    @property
    def passing(self) -> bool:
        """The instant armed is the slot itself, passed unclaimed."""
        return self._flag(_PASSING)

    @passing.setter
    def passing(self, on: bool) -> None:
        self._set(_PASSING, on)

    @property
    def retired(self) -> bool:
        """Ended alone (a job removed from the state bucket)."""
        return self._flag(_RETIRED)

    @retired.setter
    def retired(self, on: bool) -> None:
        self._set(_RETIRED, on)


class Timetable:
    """The walks of one sidecar's jobs, on one timer. What a slot goes through is
    the caller's (sidecar/run/job_loop.py): `attempt` it, skip it `late` (the slot to
    go on from), why it is `over` (end_at, max_runs; None: it may run), the
    job's `catch_up`."""

    def __init__(
        self,
        *,
        clock: Clock,
        stopping: asyncio.Event,
        metrics: Metrics,
        tasks: TaskSet,
        attempt: Callable[[JobConfig, int, float], Awaitable[None]],
        late: Callable[[JobConfig, int, float], int],
        over: Callable[[JobConfig, int], str | None],
        catch_up: Callable[[JobConfig], Coroutine[Any, Any, None]],
    ) -> None:
        self.clock = clock
        self.stopping = stopping
        self.metrics = metrics
        self.side_tasks = tasks
        self.attempt, self.late, self.over, self.catch_up = attempt, late, over, catch_up
        self.timer = Timer(clock, stopping, self._fired)
        # The next-run gauge keeps no series for a job waiting beyond its horizon: it
        # reads the walks instead (``next_run``, ``soon``).
        metrics.job_next_run_timestamp_seconds.follow(self)
        self.walks: dict[str, Walk] = {}
        # The largest jitter of any walk armed (never lowered): ``soon``'s reach.
        self.jitter = 0.0
        # The walks a task handles a slot of now: out of the heap, their slot come
        # (``soon``); a retirement waits for theirs, a stop leaves them to end it.
        self.handling: set[Walk] = set()
        # Per job: (slot, the schedule's slot before it), known before the slot's time.
        self.previous: dict[str, tuple[int, int | None]] = {}
        # Per job: why its walk said it claims no more slots (end_at, max_runs).
        self.said_over: dict[str, str] = {}
        # The tasks handling a slot now (the drain waits for them, bounded).
        self.tasks = TaskSet("a job loop", say=False)
        self._runner: asyncio.Task[None] | None = None

    def start(self, job: JobConfig, resume: int | None = None) -> None:
        """Walk `job`'s schedule until stop, or until ``retire(job.name)``.

        `resume`: the slot the job's previous walk waited for and did not handle
        (what ``retire`` returned: a job of the state bucket put again with new
        settings). A slot of the new schedule at or after it whose time has come
        is still handled (fired at once, within its max_late): the old walk was
        ended between that slot's time and its jitter, and a walk begun after
        "now" would drop it on every sidecar whose jitter had not come, a slot
        then claimed by nobody and recorded nowhere.
        """
        if self._runner is None:
            self._runner = self.side_tasks.spawn(self.timer.run())
        m = self.metrics
        now = self.clock.wall_ms()
        after = now if resume is None or resume > now else resume - 1
        walk = Walk(job, job.schedule.next_slot(after))
        self.walks[job.name] = walk
        if job.after is not None:  # no slots: its runs follow another job's (chains.py)
            m.job_next_run_timestamp_seconds.note(job.name, 0)
            return  # ends at stop or retirement
        if job.catchup != "none":
            self.side_tasks.spawn(self.catch_up(job))
        self._arm(walk)

    def next_slot(self, name: str) -> int | None:
        """The slot job `name`'s walk handles next (None: it walks no more)."""
        walk = self.walks.get(name)
        return walk.slot if walk is not None else None

    def next_run(self, name: str) -> float | None:
        """Unix time of job `name`'s next slot as its gauge says it (0: it runs no
        more, or after another job's; None: it walks no more)."""
        walk = self.walks.get(name)
        if walk is None:
            return None
        return 0.0 if walk.over or walk.job.after is not None else walk.slot / 1000

    def soon(self, limit: float) -> list[tuple[str, float]]:
        """The jobs whose next slot is at or before `limit` (Unix time): the next-run
        gauge shows them (sidecar/obs/next_run.py). Read from the timer's heap, not
        from every walk: an armed walk's instant is its slot plus at most the
        largest jitter, so the entries due by `limit` plus that jitter are all the
        walks there are to find (a scrape costs what it writes, issue 49); with
        the walks handling a slot, out of the heap meanwhile."""
        limit_ms = limit * 1000
        found: dict[str, float] = {}
        armed = [entry.item for entry in self.timer.due_by(limit + self.jitter)]
        for walk in [*armed, *self.handling]:
            if (
                isinstance(walk, Walk)
                and walk.slot <= limit_ms
                and not walk.over
                and walk.job.after is None
            ):
                found[walk.job.name] = walk.slot / 1000
        return list(found.items())

    def handles(self, name: str) -> bool:
        """Whether job `name`'s walk handles a slot now: ``retire`` waits for it."""
        walk = self.walks.get(name)
        return walk is not None and walk in self.handling

    async def retire(self, name: str) -> int | None:
        """End job `name`'s walk alone, between two slots (a job removed from the state
        bucket, or put again): at once, or once the slot in hand is handled. Its runs
        in flight go on (``Jobs.runs``). Returns the slot the walk waited for and did
        not handle (``start``'s `resume`), None when it had no walk or none to wait for."""
        walk = self.walks.get(name)
        if walk is None:
            return None
        walk.retired = True
        if walk in self.handling:
            walk.done = asyncio.get_running_loop().create_future()
            await walk.done
        else:
            self._end(walk)
        # A walk that ended for max_runs or end_at (``over``), or that follows
        # another job (``after``: no slots of its own), has no slot to go on from.
        return None if walk.over or walk.job.after is not None else walk.slot

    def wake(self) -> None:
        """On stop: end every walk (those handling a slot, once it is handled)."""
        self.timer.wake()
        if not self.stopping.is_set():
            return
        for walk in list(self.walks.values()):
            if walk not in self.handling:
                self._end(walk)

    def _gone(self, walk: Walk) -> bool:
        return self.stopping.is_set() or walk.retired

    def _end(self, walk: Walk) -> None:
        """The walk is over: no slot more is handled."""
        if walk.active:
            walk.cancel()
            if self.stopping.is_set() and not walk.over and self.clock.wall_ms() >= walk.slot:
                # Its time had come, its jitter not: the slot goes unclaimed.
                name = walk.job.name
                self.metrics.claims_skipped_total.labels(job=name, reason="shutdown").inc()
        if self.walks.get(walk.job.name) is walk:
            del self.walks[walk.job.name]
        if walk.done is not None and not walk.done.done():
            walk.done.set_result(None)

    def _arm(self, walk: Walk) -> None:
        """Wait for `walk`'s slot (the top of the old per-job loop)."""
        job = walk.job
        name = job.name
        if self._gone(walk):
            self._end(walk)
            return
        m = self.metrics
        if (over := self.over(job, walk.slot)) is not None:
            # end_at passed, or max_runs reached: no slot is claimed (nor counted
            # skipped: the job is done, not failing). Said once; no next run.
            m.job_next_run_timestamp_seconds.note(name, 0)
            if self.said_over.get(name) != over:
                self.said_over[name] = over
                log.info("job %s: no more runs: %s", name, over)
            if job.schedule.outside(walk.slot) is not None:
                walk.over = True
                return  # end_at: nothing after it ever runs; ended by stop
            # max_runs: the slots pass unclaimed (deleting count.<job> resets it).
            walk.over = walk.passing = True
            self._at(walk, walk.slot / 1000)
            return
        walk.over = walk.passing = False
        self.said_over.pop(name, None)
        if walk.known:  # X-Anarchon-Previous-Scheduled-At, known before the slot's time
            self.previous[name] = (walk.slot, walk.previous)
        m.job_next_run_timestamp_seconds.note(name, walk.slot / 1000)
        # ``soon`` looks this far past its limit for the walks armed after their slot.
        self.jitter = max(self.jitter, job.jitter)
        fire_at = walk.slot / 1000 + random.uniform(0.0, job.jitter)
        self._at(walk, fire_at)

    def _at(self, walk: Walk, wall: float) -> None:
        """Arm `walk` for wall-clock time `wall` (``_fired`` then)."""
        walk.item = walk
        self.timer.push(wall, walk)

    def _fired(self, item: object) -> None:
        """The timer's one callback: `item` is the walk whose instant came."""
        assert isinstance(item, Walk)
        if item.passing:
            self._passed(item)
        else:
            self._due(item)

    def _passed(self, walk: Walk) -> None:
        """A slot of a capped job passed unclaimed: wait for the next."""
        walk.previous, walk.slot, walk.known = (
            walk.slot,
            walk.job.schedule.next_slot(walk.slot),
            True,
        )
        self._arm(walk)

    def _due(self, walk: Walk) -> None:
        self.handling.add(walk)
        self.tasks.spawn(self._handle(walk))

    async def _handle(self, walk: Walk) -> None:
        """The slot's time (plus jitter) has come: skip it late, or attempt it."""
        job = walk.job
        try:
            if self._gone(walk):
                if self.stopping.is_set():
                    name = job.name
                    self.metrics.claims_skipped_total.labels(job=name, reason="shutdown").inc()
                return
            now = self.clock.wall()
            if now - walk.slot / 1000 > job.max_late:
                walk.slot = self.late(job, walk.slot, now)
                walk.previous, walk.known = job.schedule.previous_slot(walk.slot), True
            else:
                await self.attempt(job, walk.slot, now)
                walk.previous, walk.known = walk.slot, True
                walk.slot = job.schedule.next_slot(walk.slot)
        finally:
            self.handling.discard(walk)
            self._arm(walk)
