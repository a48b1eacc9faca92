"""The stream guard: keeps the stream set up and says which jobs it can hold.

It ensures the stream (create, or raise it back when someone weakened it)
every STREAM_REFRESH, and at once when JetStream's advisories say the stream
changed; then it judges, per job, whether the stream holds the job's claims
for ``jitter + max_late`` (``streamfit.coverage``). Readiness and each job's
right to claim (``blocked``) are read from it in memory; no claim waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from sidecar.config.jobset import Change, JobSet
from sidecar.config.load import Config, JobConfig
from sidecar.core import failpoints
from sidecar.core.backoff import Backoff
from sidecar.core.clock import Clock, rfc3339
from sidecar.core.errors import StreamConflict, StreamError, StreamNotFound, StreamNotRaised
from sidecar.core.natspy import connection_of
from sidecar.core.wire import TRANSIENT
from sidecar.obs.metrics import Metrics
from sidecar.store.permissions import Denial
from sidecar.store.stream import StreamState, ensure_stream, stream_spec
from sidecar.store.streamfit import coverage, placement_problem

log = logging.getLogger(__name__)

# How often the stream is checked (and raised back when someone weakened it):
# one stream_info call, whose cost does not depend on the number of messages.
STREAM_REFRESH = 10.0
# Between two tries while the stream cannot be set up.
STREAM_RETRY_START = 0.2
STREAM_RETRY_CAP = 30.0
# A problem that lasts is logged again at most this often (seconds).
REPEAT_LOG = 60.0


_UNKNOWN = object()


class StreamGuard:
    """The stream as this sidecar last saw it, and what it may claim on it."""

    def __init__(
        self,
        config: Config,
        metrics: Metrics,
        clock: Clock,
        connected: asyncio.Event,
        *,
        jobs: JobSet,
        refused: Callable[..., Denial | None] | None = None,
    ) -> None:
        self.config = config
        # The sidecar's job set (sidecar/config/jobset.py): a job put into it is
        # judged against the stream's last look.
        self.jobs = jobs
        self.jobs.subscribe(self._jobs_changed)
        self.metrics = metrics
        self.clock = clock
        self.connected = connected
        self.spec = stream_spec(config)
        self.stream_ready = False
        self.stream_problem = "stream not checked yet"
        # True from the first look's lasting verdict (the stream up, in conflict,
        # refused; not a timeout or a stream being made): a slot due while the
        # sidecar starts waits for it (sidecar/run/job_loop.py, ``attempt``).
        self.looked = False
        # The last refusal of a subject naming the stream (the daemon's Denials.about).
        self.refused = refused
        self._stream_logged = 0.0  # monotonic time of the last stream problem line
        self._raise_problem = ""
        self._raise_logged = 0.0
        self._stream_wake = asyncio.Event()  # set by a stream advisory
        self.stream_state: StreamState | None = None
        # The JetStream domain that answered: _UNKNOWN until asked once.
        self.domain: object = _UNKNOWN
        self.on_domain: list[Callable[[str | None], None]] = []
        self._placement_said: str | None = None
        # Per job: why the stream cannot hold its claims now (None: it can).
        # Empty until the first check: no job is claimed before it.
        self.uncovered: dict[str, str | None] = {}
        # The stream's settings ``uncovered`` was judged for (the job set's changes
        # are judged as they come: ``_jobs_changed``).
        self._covered_for: tuple[object, ...] | None = None

    def not_ready(self) -> str | None:
        """Why the stream keeps the sidecar from being ready; None when it does not."""
        if not self.stream_ready:
            return self.stream_problem
        weak = sorted(job for job, why in self.uncovered.items() if why)
        if weak:
            return f"the stream cannot hold the claims of {len(weak)} job(s): " + "; ".join(
                f"{job}: {self.uncovered[job]}" for job in weak[:5]
            )
        return None

    def blocked(self, job: JobConfig, slot: int) -> str | None:
        """Why a claim of `slot` must not be made now; None when it may.

        From the last stream check: the stream must hold the job's claims for
        jitter + max_late, and must be older than the slot (a claim made in a
        stream that was deleted and created again is forgotten).
        """
        if name_problem := self.uncovered.get(job.name, self.stream_problem):
            return name_problem
        state = self.stream_state
        if state is not None and state.created is not None and slot / 1000 < state.created:
            return (
                f"stream {state.name} was created at {rfc3339(state.created)}, after the slot: "
                "a claim made in the stream it replaced is forgotten"
            )
        return None

    async def run(self, js: JetStreamContext) -> None:
        """Ensure the stream, raise it back when weakened, judge what it holds.

        Every STREAM_REFRESH, or at once when an advisory says the stream
        changed. Readiness and each job's right to claim follow it.
        """
        await self._watch_advisories(connection_of(js))
        backoff = Backoff(STREAM_RETRY_START, STREAM_RETRY_CAP)
        while True:
            try:
                if not self.connected.is_set():
                    await self.connected.wait()
                if failpoints.ENABLED:
                    await failpoints.hit("stream.check")
                state = await ensure_stream(js, self.spec, self._on_raise)
            except StreamNotRaised as exc:
                # Judged as it is: jobs it holds are claimed, the others skipped.
                self._raise_failed(str(exc))
                assert isinstance(exc.state, StreamState)
                self._stream_up(exc.state)
                await self._stream_pause(STREAM_REFRESH)
                continue
            except StreamConflict as exc:
                self._stream_down(f"{exc}", forget=True)
                self.looked = True  # a lasting verdict: no slot waits for a better one
            except StreamNotFound:
                self._stream_down("stream missing; creating it again", forget=True)
                continue
            except (*TRANSIENT, StreamError) as exc:
                refusal = self.refused(self.spec.name) if self.refused else None
                if refusal is not None:  # said by the refusal's own line: not again
                    problem = (
                        f"stream not available: NATS refused {refusal.operation} to "
                        f"{refusal.subject!r} (a permissions violation; see "
                        "deploy/nats/permissions.conf)"
                    )
                    self._stream_down(problem, forget=False, quiet=True)
                    self.looked = True  # refused: lasting
                else:
                    self._stream_down(f"stream not available: {exc!r}", forget=False)
            except Exception as exc:  # never let readiness die silently
                log.exception("checking the stream failed")
                self._stream_down(f"stream check failed: {exc!r}", forget=False)
                self.looked = True
            else:
                backoff.reset()
                if self.domain is _UNKNOWN:
                    await self._which_jetstream(js, state)
                self._stream_up(replace(state, domain=self.answered_domain))
                await self._stream_pause(STREAM_REFRESH)
                continue
            await self._stream_pause(backoff.next())

    @property
    def answered_domain(self) -> str | None:
        return self.domain if isinstance(self.domain, str) else None

    async def _which_jetstream(self, js: JetStreamContext, state: StreamState) -> None:
        """Say once which JetStream answered; warn when a leaf's own one may have."""
        try:
            info = await js.account_info()
        except Exception as exc:  # asked again at the next check
            log.debug("JetStream account info: %r", exc)
            return
        domain = info.domain or None
        self.domain = domain
        for hook in self.on_domain:
            hook(domain)
        log.info(
            "JetStream answered: domain %s, stream %s in cluster %s (leader %s, replicas %d)",
            domain or "(none)",
            state.name,
            state.cluster or "(none)",
            state.leader or "-",
            state.replicas,
        )
        if domain and self.config.nats.domain is None:
            log.warning(
                "the JetStream that answered has domain %r and nats.domain is not set: at a "
                "leaf node that may be the leaf's own JetStream rather than the hub's, and a "
                "fleet split over two streams runs slots twice. Set nats.domain to the hub's "
                "domain, or to %r if this one is meant",
                domain,
                domain,
            )

    async def _stream_pause(self, seconds: float) -> None:
        """Sleep until the next check, or until an advisory says the stream changed."""
        self._stream_wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stream_wake.wait(), seconds)

    async def _watch_advisories(self, nc: NATS | None) -> None:
        """Wake the stream check when JetStream announces a change of our stream.

        Best effort: an account without the right to these subjects is checked
        every STREAM_REFRESH as before.
        """
        if nc is None:
            return

        async def on_advisory(msg: object) -> None:
            self._stream_wake.set()

        try:
            await nc.subscribe(f"$JS.EVENT.ADVISORY.STREAM.*.{self.spec.name}", cb=on_advisory)
        except Exception as exc:
            log.debug("no stream advisories: %r", exc)

    def _raise_failed(self, why: str) -> None:
        now = self.clock.monotonic()
        if why != self._raise_problem or now - self._raise_logged > REPEAT_LOG:
            log.warning("%s; using the stream as it is", why)
            self._raise_problem, self._raise_logged = why, now

    def _on_raise(self, before: StreamState | None) -> None:
        """The stream had to be raised: by someone else lowering it, when we had seen it."""
        if self.stream_state is not None and before is not None:
            self.metrics.stream_raised_total.inc()

    def _stream_down(self, problem: str, forget: bool, quiet: bool = False) -> None:
        """Not ready; with `forget`, no job may claim until the stream is seen again.
        `quiet`: the problem was said already (a permissions refusal)."""
        now = self.clock.monotonic()
        if not quiet and (
            self.stream_ready
            or problem != self.stream_problem
            or now - self._stream_logged > REPEAT_LOG
        ):
            log.warning("%s", problem)
            self._stream_logged = now
        self.stream_ready = False
        self.stream_problem = problem
        if forget:
            self.stream_state = None
            self.uncovered = {}
            self._covered_for = None
            self._set_covered()

    def _stream_up(self, state: StreamState) -> None:
        before = self.stream_state
        if before is not None and before.created != state.created:
            log.warning(
                "stream %s was deleted and created again (now created at %s): slots "
                "scheduled before that are not claimed",
                state.name,
                rfc3339(state.created or 0),
            )
        if not self.stream_ready:
            log.info(
                "stream %s ready: history_size=%d duplicate_window=%gs replicas=%d",
                state.name,
                state.history_size,
                state.duplicate_window,
                state.replicas,
            )
        placement = placement_problem(state, self.spec)
        if placement != self._placement_said:
            if placement:
                log.warning("%s; the sidecar does not move streams (nats stream edit)", placement)
            self._placement_said = placement
        # What ``covers`` reads of the stream unchanged since the last look (the
        # usual case, every refresh), nothing is judged again: with 100,000 jobs
        # that pass was most of an idle sidecar's CPU (issue 49).
        key = (
            state.name,
            tuple(state.subjects),
            state.duplicate_window,
            state.max_age,
            state.history_size,
        )
        if self._covered_for == key:
            self.stream_state = state
            self.stream_ready = True
            self._gauges(state)
            return
        uncovered = coverage(state, self.spec, self.jobs.all)
        self._covered_for = key
        for job, why in uncovered.items():
            if why and why != self.uncovered.get(job):
                log.error(
                    "job %s: not claimed while %s; raise it, or lower the job's jitter "
                    "and max_late",
                    job,
                    why,
                )
            elif not why and self.uncovered.get(job):
                log.info("job %s: the stream holds its claims again; claiming", job)
        self.stream_state = state
        self.uncovered = uncovered
        self.stream_ready = True
        self._set_covered()
        self.looked = True
        self._gauges(state)

    def _gauges(self, state: StreamState) -> None:
        m = self.metrics
        m.stream_messages.set(state.messages)
        m.stream_bytes.set(state.bytes)
        m.stream_history_size.set(state.history_size)
        m.stream_duplicate_window_seconds.set(state.duplicate_window)
        m.stream_replicas.set(state.replicas)

    def _jobs_changed(self, change: Change) -> None:
        """Jobs put into the set are judged against the stream's last look (the next
        look, up to STREAM_REFRESH away, judges them again): not "not checked yet"."""
        for name in change.removed:
            self.uncovered.pop(name, None)
        if change.put and self.stream_state is not None:
            why = coverage(self.stream_state, self.spec, change.put)
            self.uncovered.update((job.name, why.get(job.name)) for job in change.put)
            self._set_covered(change.put)

    def _set_covered(self, jobs: Iterable[JobConfig] | None = None) -> None:
        covers = self.metrics.stream_covers_job
        for job in self.jobs.all if jobs is None else jobs:
            ok = job.name in self.uncovered and not self.uncovered[job.name]
            # Held and never not held: no series to keep (docs/METRICS.md).
            if not ok or covers.written(job.name):
                covers.labels(job=job.name).set(1 if ok else 0)
