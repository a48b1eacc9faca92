"""What the fleet page and its API show, built and kept current.

Building 1,000 jobs' objects from scratch takes about 200 ms (their next
slots, mostly): a request builds only the objects it shows (``selected``: a
page of them, picked by name and problem first), in slices (the loop is
handed back every ``RENDER_SLICE``), and keeps them; after that only the
jobs that changed are built and rendered again. A job's runs are read from the stream at most
every ``HISTORY_REUSE`` seconds and served page by page (``runs_data``), the
stream's state at most every ``STREAM_REUSE`` seconds. The objects are those
of sidecar/admin/objects.py, as ``status --json`` shows them; sidecar/admin/api.py serves
them as JSON and HTML.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nats.js import JetStreamContext

from sidecar.admin import page
from sidecar.admin.actions import actions_key, actions_of
from sidecar.admin.jobcheck import PREFIX
from sidecar.admin.jobfilter import Selection, named, page_of, problems
from sidecar.admin.live import Live
from sidecar.admin.objects import (
    NEXT_RUNS,
    fleet_part,
    job_object,
    leases_by_job,
    problem_part,
    runners_of,
    stream_object,
)
from sidecar.config.load import Config
from sidecar.core.clock import Clock, parse_rfc3339
from sidecar.core.errors import SidecarError
from sidecar.obs.exposition import RENDER_SLICE
from sidecar.store.digests import mismatched_jobs
from sidecar.store.runs import read_history
from sidecar.store.state import Entry, View
from sidecar.store.stream import StreamState, state_of

if TYPE_CHECKING:
    from sidecar.admin.jobkeys import JobKeys
    from sidecar.fleet.member import Fleet
    from sidecar.store.guard import StreamGuard

log = logging.getLogger(__name__)

HISTORY_REUSE = 1.0
STREAM_REUSE = 2.0


@dataclass(frozen=True)
class _Now:
    """What one request's objects are built with (``PageData._now``)."""

    view: View
    ms: int
    mismatch: set[str]
    held: dict[str, str | None]
    runners: dict[str, list[str]]
    leases: dict[str, dict[str, Entry]]
    generation: int


class PageData:
    """The jobs' objects, the fleet part and the runs of one sidecar's page."""

    def __init__(
        self,
        config: Config,
        fleet: Fleet,
        guard: StreamGuard,
        clock: Clock,
        live: Live,
        *,
        bucket_jobs: JobKeys | None = None,
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.jobs = fleet.jobs  # the job set (sidecar/config/jobset.py)
        self.guard = guard
        self.clock = clock
        self.live = live
        self.js: JetStreamContext | None = None
        self._objs: dict[str, dict[str, Any]] = {}  # job objects, by name
        self._rows: dict[str, str] = {}  # their rows of the table, rendered
        self._next_ms: dict[str, int] = {}  # each object's next slot: stale after it
        self._built_with: tuple[set[str], dict[str, str | None], dict[str, list[str]]] | None = None
        self._generation = 0  # counts the times every object was dropped (_now)
        self._listed: tuple[tuple[int, int, int], list[dict[str, Any]]] | None = None
        self._stream: StreamState | None = None
        self._stream_at = 0.0
        self._history: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        # Where each job comes from (file or state bucket): the daemon's.
        self.bucket_jobs = bucket_jobs

    async def selected(self, sel: Selection) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The jobs `sel` picks (sidecar/admin/jobfilter.py) and what it left out.

        Names are picked first (the glob; "problems only" by ``problem_part``,
        without next slots), then the page of them, and only the page's
        objects are built: at 100,000 jobs a request costs its page, not
        100,000 objects (docs/PERFORMANCE.md).
        """
        now = await self._now()
        names: Sequence[str] = named(self.jobs.names, sel.globs)
        live = len(now.view.instances())
        if sel.problems:
            names = await self._troubled(names, now, live)
        part, picked = page_of(names, sel)
        objs = await self._objects(names[part], now)
        return [{**j, "problems": problems(j, live)} for j in objs], picked

    async def objects(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """The objects of the jobs `names` (those that exist), current, in the set's order."""
        wanted = set(names)
        now = await self._now()
        return await self._objects([n for n in self.jobs.names if n in wanted], now)

    async def _now(self) -> _Now:
        """What every object is built with now; objects built with other inputs are dropped.

        A job is built again when the feed or the bucket's watch said it
        changed, when its next slot has passed, while it runs (its "for how
        long"), and all of them when the instances' settings, the stream's
        coverage or who runs what changed.
        """
        self.live.ensure_started()
        if not self.live.loaded.is_set() and self.guard.connected.is_set():
            # Shown with what is known after that; events fill in the rest.
            # Not connected: at once (the page says NATS is unreachable).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.live.loaded.wait(), 5.0)
        view = self.fleet.view
        mismatch = mismatched_jobs(view.instances())
        held = dict(getattr(self.guard, "uncovered", None) or {})
        runners = runners_of(self.jobs.all, view)
        dirty = self.live.dirty
        self.live.dirty = set()
        if (mismatch, held, runners) != self._built_with:
            self._built_with = (mismatch, held, runners)
            self._objs.clear()
            self._rows.clear()
            self._generation += 1
        else:
            for name in dirty:
                self._objs.pop(name, None)
                self._rows.pop(name, None)
        now_ms = self.clock.wall_ms()
        return _Now(view, now_ms, mismatch, held, runners, leases_by_job(view), self._generation)

    async def _troubled(self, names: Sequence[str], now: _Now, live: int) -> list[str]:
        """The names among `names` of jobs with a problem (``problems``), in order."""
        out = []
        since = time.perf_counter()
        recent = self.live.recent
        for name in names:
            job = self.jobs.job(name)
            part = problem_part(job, now.view, recent, now.ms, now.mismatch, now.held, now.runners)
            if problems(part, live):
                out.append(name)
            if time.perf_counter() - since > RENDER_SLICE:
                await asyncio.sleep(0)
                since = time.perf_counter()
        return out

    async def _objects(self, names: Sequence[str], now: _Now) -> list[dict[str, Any]]:
        """The objects of `names`: those still current reused, the others built.

        Yields every RENDER_SLICE. An object built while the inputs changed
        (another request started a new generation) is returned, not kept.
        """
        out = []
        built = 0
        since = time.perf_counter()
        for name in names:
            obj = self._objs.get(name)
            if obj is None or obj["running"] or self._next_ms.get(name, 0) <= now.ms:
                obj = self._build(name, now)
                built += 1
                if now.generation == self._generation:
                    self._objs[name] = obj
                    self._rows.pop(name, None)
            out.append(obj)
            if time.perf_counter() - since > RENDER_SLICE:
                await asyncio.sleep(0)
                since = time.perf_counter()
        # How many were built of how many shown (tests/admin/test_page_scale.py reads it).
        log.debug("fleet page: %d of %d job objects built", built, len(names))
        return out

    def _build(self, name: str, now: _Now) -> dict[str, Any]:
        job = self.jobs.job(name)
        now_ms = now.ms
        upcoming = job.schedule.runs(now_ms, NEXT_RUNS)  # exclusions applied
        # None left (end_at passed): rebuilt only when its keys change.
        stale = upcoming[0] if upcoming else 2**62
        if job.schedule.start_ms is not None and job.schedule.start_ms > now_ms:
            stale = min(stale, job.schedule.start_ms)  # "not started" ends at start_at
        self._next_ms[name] = stale
        obj = job_object(
            job,
            now.view,
            self.live.recent,
            now_ms,
            now.mismatch,
            now.held,
            upcoming,
            now.runners,
            now.leases,
        )
        return self._with_source(obj)

    def _with_source(self, obj: dict[str, Any]) -> dict[str, Any]:
        """``source`` (file or bucket) and ``id``, as ``status --json`` has them."""
        origin = self.bucket_jobs.origin(obj["name"]) if self.bucket_jobs else ("file", None)
        obj["source"], obj["id"] = origin
        return obj

    def row(self, job: dict[str, Any]) -> str:
        """A job's row of the table, rendered once per change."""
        name = str(job["name"])
        html = self._rows.get(name)
        if html is None:
            html = self._rows[name] = page.job_row(job)
        return html

    def job_data(self, name: str) -> dict[str, Any]:
        """One job's object, fresh (one job is cheap); the shared ones stay as they are."""
        view = self.fleet.view
        mismatch = mismatched_jobs(view.instances())
        job = self.jobs.job(name)
        now_ms = self.clock.wall_ms()
        runners = runners_of(self.jobs.all, view)
        held = dict(getattr(self.guard, "uncovered", None) or {})
        obj = job_object(job, view, self.live.recent, now_ms, mismatch, held, runners=runners)
        return self._with_source(obj)

    async def _stream_state(self) -> StreamState | None:
        """The stream's state, read at most every STREAM_REUSE seconds (else the guard's)."""
        # Not connected: no request to wait out its timeout (the page answers at once).
        connected = self.guard.connected.is_set()
        if self.js is not None and connected and time.monotonic() - self._stream_at > STREAM_REUSE:
            self._stream_at = time.monotonic()
            try:
                info = await self.js.stream_info(self.guard.spec.name)
                self._stream = state_of(info)
            except Exception as exc:  # shown as the guard last saw it
                log.debug("fleet page: stream info: %r", exc)
                self._stream = None
        return self._stream or self.guard.stream_state

    async def fleet_data(self) -> dict[str, Any]:
        state = await self._stream_state()
        stream = stream_object(state, self.guard.answered_domain) if state is not None else None
        bucket = {
            "name": self.fleet.spec.bucket,
            "problem": self.fleet.bucket_problem,
            "keys": len(self.fleet.view.keys),
        }
        now_ms = self.clock.wall_ms()
        fleet = fleet_part(self.jobs.all, self.fleet.view, stream, bucket, now_ms, self.live.seen)
        listed = self._listing()
        return {**fleet, "bucket_jobs": listed, "served_by": self.config.instance_id}

    def _listing(self) -> list[dict[str, Any]]:
        """The bucket's job keys with their states (``status``'s ``bucket_jobs``): the
        jobs this sidecar runs are listed from their running entries, not judged
        again (sidecar/admin/bucket_jobs.py ``listing``; a job config's parse each
        was 3 s of a request at 30,000 jobs)."""
        if self.bucket_jobs is None:
            return []
        # Made again when a job key was written or removed, or the job set changed:
        # reading every key's value is most of its cost (0.4 s at 30,000 jobs).
        revs = [e.revision for k, e in self.fleet.view.keys.items() if k.startswith(PREFIX)]
        stamp = (len(revs), max(revs, default=0), len(self.jobs.names))
        if self._listed is None or self._listed[0] != stamp:
            self._listed = (stamp, self.bucket_jobs.listing())
        return self._listed[1]

    async def runs_data(self, name: str, limit: int, before: int | None) -> dict[str, Any]:
        cached = self._history.get(name)
        connected = self.js is not None and self.guard.connected.is_set()
        if cached is not None and (time.monotonic() - cached[0] < HISTORY_REUSE or not connected):
            runs = cached[1]  # not connected: what was read last, at once
        else:
            if self.js is None or not connected:
                raise SidecarError("NATS is unreachable: this sidecar is not connected")
            spec = self.guard.spec
            latest = self.clock.wall_ms() + round(self.config.nats.duplicate_window * 1000)
            hist = await read_history(self.js, spec.name, spec.prefix, name, latest)
            runs = [_run_object(r.as_dict(), r.seq) for r in hist.runs]
            if len(self._history) > 8:
                self._history.clear()
            self._history[name] = (time.monotonic(), runs)
        start = 0
        if before is not None:
            start = next((i + 1 for i, r in enumerate(runs) if r["fence"] == before), None) or next(
                (i for i, r in enumerate(runs) if r["fence"] < before), len(runs)
            )
        page_runs = runs[start : start + limit]
        more = start + limit < len(runs)
        return {
            "runs": page_runs,
            "next_before": page_runs[-1]["fence"] if more and page_runs else None,
        }

    def actions_data(self, name: str) -> list[dict[str, Any]]:
        entry = self.fleet.view.keys.get(actions_key(name))
        return actions_of(entry.value) if entry is not None else []


def _run_object(run: dict[str, Any], seq: int) -> dict[str, Any]:
    """A history run with its fence (the claim's sequence) and lateness."""
    late = None
    try:
        if run.get("started_at") and run.get("scheduled_at"):
            late = round(
                (parse_rfc3339(run["started_at"]) - parse_rfc3339(run["scheduled_at"])) * 1000
            )
    except (ValueError, OverflowError, OSError):  # hostile times: no lateness shown
        late = None
    return {**run, "fence": seq, "late_ms": late}
