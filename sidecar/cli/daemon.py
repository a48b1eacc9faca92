"""The daemon: wiring and lifecycle of one sidecar; a bounded drain.

It connects, starts the admin server, the stream guard (sidecar/store/guard.py)
and one loop per job (sidecar/run/job_loop.py: a job's whole life), and stops them in
order. SIGTERM/SIGINT/SIGHUP: stop claiming, let running triggers finish
within ``shutdown_grace``, record their results, drain the connection, exit 0.
SIGHUP does not reload the config (nothing in it can change in place): it
stops the sidecar like SIGTERM, so a closed terminal or a reload sent by habit
never leaves a run in flight unrecorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from sidecar import __version__
from sidecar.admin.jobkeys import JobKeys
from sidecar.admin.lazy_page import LazyPage
from sidecar.admin.server import AdminServer
from sidecar.cli.settle import Settler, collector_on
from sidecar.config.addresses import is_remote
from sidecar.config.jobset import JobSet
from sidecar.config.load import Config, Secrets
from sidecar.core.clock import Clock
from sidecar.core.hostnames import skip_idna
from sidecar.core.tasks import TaskSet, cancel_all
from sidecar.fleet.member import Fleet
from sidecar.obs.metrics import Metrics
from sidecar.run.claim import Claimer
from sidecar.run.context import Context
from sidecar.run.job_loop import Jobs
from sidecar.run.trigger import Trigger
from sidecar.run.wiring import wire
from sidecar.store.connection import Connection, jetstream
from sidecar.store.guard import StreamGuard
from sidecar.store.stream import stream_spec

if TYPE_CHECKING:
    from sidecar.admin.actions import ManualRuns
    from sidecar.after.signing import Signer

__all__ = ["Daemon", "start", "stream_spec"]

log = logging.getLogger(__name__)

# On SIGTERM, how long a claim in flight may still take before it is abandoned.
CLAIM_DRAIN = 2.0
# Each of these drains and stops the sidecar; a second one is ignored.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# The start-up heap is collected and frozen once ready, or after this many
# seconds when NATS keeps the sidecar from being ready; looked at this often.
SETTLE_AFTER = 10.0
SETTLE_POLL = 0.01


@dataclass
class Daemon:
    """One sidecar: NATS connection, stream guard, job loops, admin server."""

    config: Config
    secrets: Secrets
    clock: Clock = field(default_factory=Clock)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    # The process is this daemon's (`start`): once stopped, it ignores the stop
    # signals until it exits. A daemon run in someone else's process (a test)
    # leaves them as it found them.
    owns_process: bool = False

    def __post_init__(self) -> None:
        self.metrics = Metrics(
            self.registry, self.config.metrics.per_job_histograms, wall=self.clock.wall
        )
        self.conn = Connection(self.config, self.secrets, self.metrics)
        self.spec = stream_spec(self.config)
        self.stopping = asyncio.Event()
        # The one set of this sidecar's jobs, the file's and the state bucket's
        # (sidecar/config/jobset.py): every part reads it, none keeps a copy.
        self.job_set = JobSet(self.config.jobs)
        denials = self.conn.denials
        self.guard = StreamGuard(
            self.config,
            self.metrics,
            self.clock,
            self.conn.connected,
            jobs=self.job_set,
            refused=denials.about,
        )
        self.fleet = Fleet(
            self.config,
            self.metrics,
            self.clock,
            jobs=self.job_set,
            denied=denials.denied,
            refused=denials.about,
        )
        self.conn.denials.known(
            self.spec.name,
            self.spec.prefix,
            self.fleet.spec.bucket,
            self.fleet.spec.stream,
            self.config.instance_id,
            *(job.name for job in self.config.jobs),
        )
        self.conn.on_reconnect.append(self.fleet.reconnected)
        # Jobs added at run time (the state bucket's job.<name> keys), beside the file's;
        # their runner made, its code loaded, on the first such key.
        self.bucket_jobs = JobKeys(self.config, self.metrics, self.fleet)
        self.jobs: Jobs | None = None
        # The stream guard's loop and the settling of memory, ended last.
        self.tasks = TaskSet("a daemon task", say=False)
        # The heap frozen again once the state bucket's jobs have grown the set.
        self.settler = Settler(self.job_set, self.tasks, busy=self._busy_within)
        self.stop_asked = 0.0  # clock.monotonic() of the first stop
        self.admin = AdminServer(
            self.registry, self.config.metrics.host, self.config.metrics.port, self.not_ready
        )
        # The fleet page and its API beside /metrics (admin.page): its code is
        # imported by its first request (sidecar/admin/lazy_page.py), not at start.
        self.page: LazyPage | None = None
        if self.config.admin.page:
            self.page = LazyPage(
                self.config, self.fleet, self.guard, self.clock, self.secrets, self.bucket_jobs
            )
            self.admin.app = self.page

    @property
    def runs(self) -> set[asyncio.Task[None]]:
        return self.jobs.runs if self.jobs is not None else set()

    # ------------------------------------------------------------------ lifecycle

    def not_ready(self) -> str | None:
        if self.stopping.is_set():
            return "shutting down"
        if not self.conn.connected.is_set():
            return "not connected to NATS"
        # A permissions refusal first: it is why the stream or the bucket is not there.
        return self.conn.denials.not_ready() or self.guard.not_ready() or self.fleet.not_ready()

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self.stopping.is_set():
            log.info("%s received", sig.name)
        self.stop()

    def stop(self) -> None:
        if not self.stopping.is_set():
            log.info("stopping: no new claims; draining running triggers")
            self.stop_asked = self.clock.monotonic()
            self.stopping.set()
            if self.jobs is not None:
                self.jobs.wake()

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT/SIGHUP; ConnectError when NATS is unreachable at start."""
        loop = asyncio.get_running_loop()
        # NATS and the app named by name are looked up without the idna codec (0.45 MiB).
        skip_idna(loop)
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        if self.page is not None:
            self.page.tokens.load()  # ConfigError naming admin.token_file: exit 2
        await self.admin.start()
        try:
            nc = await self.conn.connect()
            js = jetstream(nc, self.config)
            claimer = Claimer(
                nc,
                js,
                self.spec.name,
                self.spec.prefix,
                self.config.instance_id,
                self.clock,
                self.config.nats.ack_timeout,
                self.conn.wait_connected,
                on_unanswered=self.conn.unanswered,
            )
            self.guard.on_domain.append(lambda domain: _expect_domain(claimer, domain))
            signer = signer_of(self.config, self.secrets)
            async with Trigger(
                signer, self.clock, self.config.instance_id, self.config.target.max_in_flight
            ) as trigger:
                # What every part of a job's life needs, made once (sidecar/run/context.py).
                ctx = Context.build(
                    self.config,
                    self.metrics,
                    self.clock,
                    js,
                    claimer,
                    self.guard,
                    self.fleet,
                    self.conn.connected,
                    self.stopping,
                )
                jobs = wire(ctx, trigger)
                self.jobs = jobs
                if self.page is not None:

                    def manual_runs() -> ManualRuns:  # made with the page, on its first request
                        from sidecar.admin.actions import ManualRuns

                        return ManualRuns(
                            config=self.config,
                            jobs=self.job_set,
                            js=js,
                            claimer=claimer,
                            trigger=trigger,
                            clock=self.clock,
                            spawn=jobs.runs.spawn,
                            aftermath=jobs.aftermath,
                        )

                    self.page.attach(js, manual_runs)
                self.tasks.spawn(self.guard.run(js))
                self.bucket_jobs.start(jobs)
                self.fleet.start(js)
                self.conn.on_reconnect.append(jobs.reconnected)
                for job in self.config.jobs:
                    jobs.start(job)
                self.tasks.spawn(self._settle_memory())
                if self.stopping.is_set():  # a signal during start-up
                    jobs.wake()
                await self.stopping.wait()
                self.settler.disarm()
                # A claim still waiting for an answer (NATS down, say) gets a
                # moment, then is abandoned: the slot is skipped, never run.
                await self.bucket_jobs.stop()
                claiming = [*jobs.loops, *jobs.background()]
                if claiming:  # loops that ended (end_at) are no longer in the set
                    await asyncio.wait(claiming, timeout=CLAIM_DRAIN)
                await cancel_all([*claiming, *jobs.background()])
                if self.page is not None:
                    await self.page.stop()
                await self.drain()
                await jobs.aftermath.drain()  # pings and notifications of the last runs
                await self.fleet.stop(self.conn.connected.is_set())
                await self.tasks.cancel()
            await self.conn.close(drain=True)
            log.info("stopped")
            return 0
        finally:
            await self.admin.stop()
            await self.conn.close(drain=False)
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
                if self.owns_process:  # stopping already: a second signal must not kill the exit
                    signal.signal(sig, signal.SIG_IGN)

    async def _settle_memory(self) -> None:
        """Once ready (at most SETTLE_AFTER seconds after connecting): collect, freeze
        what start-up made, and let the collector run again.

        Everything made so far lives as long as the process: frozen, it stays out
        of the collector's full passes, which would otherwise walk all of it
        (about 8 ms) and now and then land on a slot's start. `run` turned the
        collector off (collector_off) while it loaded the config and made the jobs (its passes
        over the growing heap took about 20 ms of the time to ready with 1,000
        jobs), and this pass (20-30 ms) comes after ready, not before. The jobs the
        state bucket brings later are frozen in turn (sidecar/cli/settle.py), and
        the collector is turned on with a young generation of ``YOUNG``.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_AFTER
        try:
            while loop.time() < deadline and self.not_ready() is not None:  # noqa: ASYNC110
                await asyncio.sleep(SETTLE_POLL)  # readiness has no event to wait on
        finally:  # cancelled by an early stop, too: the collector is never left off
            gc.collect()
            gc.freeze()
            collector_on()
            self.settler.arm()

    def _busy_within(self, seconds: float) -> bool:
        """A slot handled or run now, or one due within `seconds` (sidecar/cli/settle.py)."""
        return self.jobs is not None and self.jobs.busy_within(seconds)

    async def drain(self) -> None:
        """Wait for running triggers up to the grace period; cancel the rest."""
        if not self.runs:
            return
        # The grace counts from the stop, not from the end of the claims' drain:
        # with NATS gone, both would otherwise add up.
        grace = self.config.shutdown_grace
        left = max(0.0, grace - (self.clock.monotonic() - self.stop_asked))
        log.info("waiting up to %.3gs for %d running trigger(s)", left, len(self.runs))
        _, pending = await asyncio.wait(set(self.runs), timeout=left)
        await cancel_all(pending)


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The collector off while `run` loads the config and makes the jobs: its passes
    over the growing heap only slow the start. The daemon collects, freezes and
    turns it on again once ready (Daemon._settle_memory); on again here whatever
    happens, with the thresholds it had, for whoever calls `run` in-process."""
    thresholds = gc.get_threshold()
    gc.disable()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.enable()


def _expect_domain(claimer: Claimer, domain: str | None) -> None:
    """From now on every claim's ack must name this JetStream domain."""
    claimer.domain = domain
    claimer.check_domain = True


def signer_of(config: Config, secrets: Secrets) -> Signer | None:
    """The trigger's signer, or None; signing's code is loaded only with a secret."""
    if not secrets.signing_secret:
        return None
    from sidecar.after.signing import signer_for

    return signer_for(config, secrets)


async def start(config: Config, secrets: Secrets, clock: Clock) -> int:
    """`anarchon-sidecar run`: say what starts and what is risky, then run until stopped."""
    if clock.offset:
        log.warning("wall clock shifted by %gs (ANARCHON_CLOCK_OFFSET)", clock.offset)
    signer = signer_of(config, secrets)
    log.info(
        "anarchon-sidecar %s starting: instance=%s jobs=%d stream=%s signing=%s",
        __version__,
        config.instance_id,
        len(config.jobs),
        config.nats.stream,
        signer.describe() if signer else "off",
    )
    remote = [job.name for job in config.jobs if is_remote(job.request.url)]
    if remote and signer is None:
        log.warning(
            "job(s) %s trigger a remote app without a signature: anyone who can reach it "
            "can trigger them too; set target.signing_secret_file (SECURITY.md)",
            ", ".join(remote),
        )
    loop = type(asyncio.get_running_loop())
    if not loop.__module__.startswith("asyncio"):  # ANARCHON_EVENT_LOOP
        log.info("event loop: %s.%s", loop.__module__, loop.__name__)
    return await Daemon(config, secrets, clock, owns_process=True).run()
