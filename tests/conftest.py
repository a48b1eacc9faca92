"""Fixtures with real parts: a nats-server, recording apps, a work directory."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from hypothesis import settings
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from sidecar.config.jobset import JobSet
from sidecar.config.load import Config
from sidecar.core.clock import Clock
from sidecar.core.tasks import cancel_all
from sidecar.fleet.member import Fleet
from sidecar.obs.metrics import Metrics
from sidecar.run.claim import Claimer
from sidecar.run.context import Context
from sidecar.run.job_loop import Jobs
from sidecar.run.trigger import Trigger
from sidecar.run.wiring import wire
from sidecar.store.guard import StreamGuard
from tests.support import STARTED, MakeJobs, NatsServer, RecordingApp, log_excerpt

# Property tests: each asks for its examples with tests.support.examples(N), which
# the profile in use caps. "ci" (the default, what make test runs) caps them at
# 100; HYPOTHESIS_PROFILE=thorough lets each try all it asks for (up to 1000).
# The reliability scenarios keep their own counts: their figures are recorded.
settings.register_profile("ci", max_examples=100, deadline=None)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SERIAL_DIRS = ("reliability", "nemesis")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The reliability scenarios and the nemesis are serial too: their figures and
    margins are about timing (make test runs every serial test in its second pass)."""
    root = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(root).parts if item.path.is_relative_to(root) else ()
        if parts[:1] and parts[0] in SERIAL_DIRS:
            item.add_marker(pytest.mark.serial)


def pytest_runtest_setup(item: pytest.Item) -> None:
    STARTED.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test that started sidecars shows the end of their logs: a failure in
    CI, where nothing is left to look at, tells what each sidecar said."""
    report = yield
    if report.failed and STARTED:
        report.sections.append(("sidecar logs", log_excerpt(STARTED)))
    return report


@pytest.fixture(autouse=True)
def collector_as_it_was() -> Iterator[None]:
    """A daemon run in-process turns the collector on with its own young generation
    (sidecar/cli/settle.py): each test gives the next one the thresholds and the
    on/off it found."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A `nats-server -js` on a free loopback port with a temporary store."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    """A core NATS connection to `nats_server`."""
    conn = await nats.connect(nats_server.url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def make_jobs(nc: NATS) -> MakeJobs:
    """``async with make_jobs(config) as jobs``: one sidecar's ``Jobs`` on the test's
    nats-server, its parts made as the daemon makes them (sidecar/run/wiring.py): a
    fresh registry, the wall clock, connected, no signing. Nothing is started (the
    stream guard, the fleet's watch: the test starts what it needs). On exit it stops
    as the daemon does: stopping set, sleeps woken, runs and background tasks ended."""

    @contextlib.asynccontextmanager
    async def make(config: Config) -> AsyncIterator[Jobs]:
        metrics = Metrics(CollectorRegistry())
        clock = Clock()
        js = nc.jetstream()
        connected, stopping = asyncio.Event(), asyncio.Event()
        connected.set()
        job_set = JobSet(config.jobs)  # one set, as the daemon makes it
        guard = StreamGuard(config, metrics, clock, connected, jobs=job_set)
        fleet = Fleet(config, metrics, clock, jobs=job_set)
        spec, instance = guard.spec, config.instance_id
        claimer = Claimer(
            nc, js, spec.name, spec.prefix, instance, clock, config.nats.ack_timeout, None
        )
        ctx = Context.build(config, metrics, clock, js, claimer, guard, fleet, connected, stopping)
        async with Trigger(None, clock, instance) as trigger:
            jobs = wire(ctx, trigger)
            try:
                yield jobs
            finally:
                stopping.set()
                jobs.wake()
                await cancel_all([*jobs.runs, *jobs.background()])

    return make


@pytest.fixture
def http_app() -> Iterator[RecordingApp]:
    """A real HTTP app on loopback that records every request."""
    app = RecordingApp()
    app.start()
    try:
        yield app
    finally:
        app.stop()


@pytest.fixture
def unix_app(tmp_path: Path) -> Iterator[RecordingApp]:
    """A real HTTP app on a unix socket that records every request."""
    app = RecordingApp(socket_path=str(tmp_path / "app.sock"))
    app.start()
    try:
        yield app
    finally:
        app.stop()
