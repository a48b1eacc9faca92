"""What the fleet page and its API show, built and kept current.

Building 1,000 jobs' objects from scratch takes about 200 ms (their next
slots, mostly): it is done once, in slices (the loop is handed back every
``RENDER_SLICE``); after that only the jobs that changed are built and
rendered again (``jobs_data``). A job's runs are read from the stream at most
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
from typing import TYPE_CHECKING, Any

from nats.js import JetStreamContext

from sidecar.admin import page
from sidecar.admin.actions import actions_key, actions_of
from sidecar.admin.jobfilter import Selection, select
from sidecar.admin.live import Live
from sidecar.admin.objects import NEXT_RUNS, fleet_part, job_object, runners_of, stream_object
from sidecar.config.load import Config
from sidecar.core.clock import Clock, parse_rfc3339
from sidecar.core.errors import SidecarError
from sidecar.obs.exposition import RENDER_SLICE
from sidecar.store.runs import read_history
from sidecar.store.state import View, mismatched_jobs
from sidecar.store.stream import StreamState, state_of

if TYPE_CHECKING:
    from sidecar.admin.jobkeys import JobKeys
    from sidecar.fleet.member import Fleet
    from sidecar.store.guard import StreamGuard

log = logging.getLogger(__name__)

HISTORY_REUSE = 1.0
STREAM_REUSE = 2.0


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
        self._list: list[dict[str, Any]] = []
        self._running: set[str] = set()
        self._soonest = 0  # the earliest next slot of any job: objects are stale after it
        self._built_with: tuple[set[str], dict[str, str | None], dict[str, list[str]]] | None = None
        self._jobs_pending: asyncio.Future[list[dict[str, Any]]] | None = None
        self._stream: StreamState | None = None
        self._stream_at = 0.0
        self._history: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        # Where each job comes from (file or state bucket): the daemon's.
        self.bucket_jobs = bucket_jobs

    async def jobs_data(self) -> list[dict[str, Any]]:
        """Every job's object, current; only the jobs that changed are built again.

        A job is built again when the feed or the bucket's watch said it
        changed, when its next slot has passed, while it runs (its "for how
        long"), and all of them when the instances' settings or the stream's
        coverage changed. The rest are reused: with 1,000 jobs a page load
        costs the few that changed, not 1,000 schedules' next slots. The
        building is shared by concurrent requests and yields every
        RENDER_SLICE.
        """
        if self._jobs_pending is None:
            self._jobs_pending = asyncio.ensure_future(self._build_jobs())
        return await asyncio.shield(self._jobs_pending)

    async def selected(self, sel: Selection) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The jobs `sel` picks (sidecar/admin/jobfilter.py) and what it left out."""
        jobs = await self.jobs_data()
        return select(jobs, sel, len(self.fleet.view.instances()))

    async def _build_jobs(self) -> list[dict[str, Any]]:
        try:
            self.live.ensure_started()
            if not self.live.loaded.is_set() and self.guard.connected.is_set():
                # Shown with what is known after that; events fill in the rest.
                # Not connected: at once (the page says NATS is unreachable).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.live.loaded.wait(), 5.0)
            view = self.fleet.view
            mismatch = mismatched_jobs(view.instances())
            held = self._held()
            now_ms = self.clock.wall_ms()
            dirty = self.live.dirty
            self.live.dirty = set()
            runners = runners_of(self.jobs.all, view)
            if (mismatch, held, runners) != self._built_with:
                dirty = set(self.jobs.names)
                self._built_with = (mismatch, held, runners)
            if not dirty and not self._running and now_ms < self._soonest:
                return self._list  # nothing changed, no next slot passed: no walk at all
            since = time.perf_counter()
            for job in self.jobs.all:
                old = self._objs.get(job.name)
                if (
                    old is not None
                    and job.name not in dirty
                    and not old["running"]
                    and self._next_ms.get(job.name, 0) > now_ms
                ):
                    continue
                self._objs[job.name] = self._build(job.name, view, now_ms, mismatch, held, runners)
                self._rows.pop(job.name, None)
                if time.perf_counter() - since > RENDER_SLICE:
                    await asyncio.sleep(0)
                    since = time.perf_counter()
            self._list = [self._objs[name] for name in self.jobs.names]
            self._running = {j["name"] for j in self._list if j["running"]}
            self._soonest = min(self._next_ms.values(), default=now_ms)
            return self._list
        finally:
            self._jobs_pending = None

    def _build(
        self,
        name: str,
        view: View,
        now_ms: int,
        mismatch: set[str],
        held: dict[str, str | None],
        runners: dict[str, list[str]],
    ) -> dict[str, Any]:
        job = self.jobs.job(name)
        upcoming = job.schedule.runs(now_ms, NEXT_RUNS)  # exclusions applied
        # None left (end_at passed): rebuilt only when its keys change.
        stale = upcoming[0] if upcoming else 2**62
        if job.schedule.start_ms is not None and job.schedule.start_ms > now_ms:
            stale = min(stale, job.schedule.start_ms)  # "not started" ends at start_at
        self._next_ms[name] = stale
        obj = job_object(job, view, self.live.recent, now_ms, mismatch, held, upcoming, runners)
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

    def _held(self) -> dict[str, str | None]:
        uncovered = getattr(self.guard, "uncovered", None) or {}
        return {name: uncovered.get(name) for name in self.jobs.names}

    def job_data(self, name: str) -> dict[str, Any]:
        """One job's object, fresh (one job is cheap); the shared ones stay as they are."""
        view = self.fleet.view
        mismatch = mismatched_jobs(view.instances())
        job = self.jobs.job(name)
        now_ms = self.clock.wall_ms()
        runners = runners_of(self.jobs.all, view)
        held = self._held()
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
        listed = self.bucket_jobs.listing() if self.bucket_jobs is not None else []
        return {**fleet, "bucket_jobs": listed, "served_by": self.config.instance_id}

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
