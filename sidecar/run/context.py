"""What every part of a job's life needs, in one object built once.

The daemon (sidecar/cli/daemon.py) builds one ``Context`` when it has a
connection, and sidecar/run/wiring.py hands it to each part of a job's life
(catch-up, skips, backfills, one-off runs, due attempts, lost runs), instead
of each taking the same eight to ten arguments. It holds shared services
only, never a part's own state: a part keeps what is its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.core.sleeper import Sleeper
from sidecar.core.tasks import TaskSet
from sidecar.store.kv import Keys

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from sidecar.config.jobset import JobSet
    from sidecar.config.load import Config
    from sidecar.core.clock import Clock
    from sidecar.fleet.member import Fleet
    from sidecar.obs.metrics import Metrics
    from sidecar.run.claim import Claimer
    from sidecar.store.guard import StreamGuard
    from sidecar.store.stream import StreamSpec


class BucketKeys:
    """``keys()``: the state bucket's key writer; None while unknown or unfit for leases."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._keys: Keys | None = None

    def __call__(self) -> Keys | None:
        bucket = self.fleet.bucket
        if not self.fleet.leases_ok or bucket is None:
            return None
        if self._keys is None:
            self._keys = Keys(bucket, self.fleet.denied)
        return self._keys


@dataclass(frozen=True)
class Context:
    """The services of one sidecar that the parts of a job's life share."""

    config: Config
    metrics: Metrics
    clock: Clock
    js: JetStreamContext
    claimer: Claimer
    guard: StreamGuard
    fleet: Fleet
    connected: asyncio.Event  # set while NATS is connected
    stopping: asyncio.Event  # set once: the sidecar drains, nothing new starts
    sleeper: Sleeper  # precise sleeps until an instant, woken at once on stop
    keys: Callable[[], Keys | None]  # the state bucket's writer, when it can hold leases
    # Catch-up, skip, backfill and one-off tasks: the drain awaits them.
    tasks: TaskSet
    # The sidecar's jobs, the file's and the state bucket's (sidecar/config/jobset.py):
    # every part looks a job up here, none keeps a copy.
    jobs: JobSet

    @classmethod
    def build(
        cls,
        config: Config,
        metrics: Metrics,
        clock: Clock,
        js: JetStreamContext,
        claimer: Claimer,
        guard: StreamGuard,
        fleet: Fleet,
        connected: asyncio.Event,
        stopping: asyncio.Event,
    ) -> Context:
        """The context of one sidecar: its sleeper, key writer and task set made here;
        its job set is the one the fleet and the stream guard were given."""
        if guard.jobs is not fleet.jobs:
            raise ValueError("the stream guard and the fleet must share one job set")
        return cls(
            config=config,
            metrics=metrics,
            clock=clock,
            js=js,
            claimer=claimer,
            guard=guard,
            fleet=fleet,
            connected=connected,
            stopping=stopping,
            sleeper=Sleeper(clock, stopping),
            keys=BucketKeys(fleet),
            tasks=TaskSet("a catch-up, skip, backfill or one-off task"),
            jobs=fleet.jobs,
        )

    @property
    def spec(self) -> StreamSpec:
        """The stream the claims and results go to."""
        return self.guard.spec

    @property
    def instance_id(self) -> str:
        return self.config.instance_id
