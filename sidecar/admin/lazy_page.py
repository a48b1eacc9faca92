"""The fleet page, loaded on its first request: a sidecar nobody looks at pays nothing.

The page's code (sidecar/admin/api.py and what it imports: the pages, their
data, the live feed, sessions, actions, the static files) is imported in a
thread and built by the first request that is not ``/metrics``, ``/healthz``
or ``/readyz`` (those never reach it), so the loop keeps its slots meanwhile.
Until then this keeps what the page would have seen since start: when each
instance's presence was last delivered (the fleet section's ``last_seen``).
The token file is read at start as before (a bad one still exits 2).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sidecar.admin.server import Answer, Request, Stream
from sidecar.admin.tokens import TokenFile

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from sidecar.admin.actions import ManualRuns
    from sidecar.admin.api import PageApp
    from sidecar.admin.jobkeys import JobKeys
    from sidecar.config.load import Config, Secrets
    from sidecar.core.clock import Clock
    from sidecar.fleet.member import Fleet
    from sidecar.store.guard import StreamGuard

INSTANCE = "instance."


def _page_class() -> type[PageApp]:
    from sidecar.admin.api import PageApp

    return PageApp


class LazyPage:
    """The routes of sidecar/admin/api.py for one sidecar, built when first asked."""

    def __init__(
        self,
        config: Config,
        fleet: Fleet,
        guard: StreamGuard,
        clock: Clock,
        job_secrets: Secrets | None,
        bucket_jobs: JobKeys,
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.guard = guard
        self.clock = clock
        self.secrets = job_secrets
        self.bucket_jobs = bucket_jobs
        self.tokens = TokenFile(config.admin.token_file)
        # When each instance's presence was last delivered by the watch (epoch s).
        self.seen: dict[str, float] = {}
        fleet.key_listeners.append(self._key, INSTANCE)
        self.app: PageApp | None = None
        self._js: JetStreamContext | None = None
        self._runs: Callable[[], ManualRuns] | None = None
        self._building = asyncio.Lock()

    def _key(self, key: str) -> None:
        if key.startswith(INSTANCE):
            self.seen[key[len(INSTANCE) :]] = time.time()

    def attach(self, js: JetStreamContext, runs: Callable[[], ManualRuns]) -> None:
        """Connected: the page reads from `js`; `runs` makes its run-now (once)."""
        self._js, self._runs = js, runs
        if self.app is not None:
            self.app.attach(js, runs())

    async def get(self) -> PageApp:
        """The page, built once."""
        async with self._building:
            if self.app is None:
                page_app = await asyncio.to_thread(_page_class)
                app = page_app(
                    self.config,
                    self.fleet,
                    self.guard,
                    self.clock,
                    self.secrets,
                    self.tokens,
                    bucket_jobs=self.bucket_jobs,
                )
                self.bucket_jobs.listeners.append(app.live.jobs_changed)
                self.fleet.key_listeners.remove(self._key)
                app.live.seen.update(self.seen)
                self.seen = app.live.seen
                if self._js is not None and self._runs is not None:
                    app.attach(self._js, self._runs())
                self.app = app
            return self.app

    async def __call__(self, req: Request) -> Answer | Stream | None:
        return await (await self.get())(req)

    async def stop(self) -> None:
        if self.app is not None:
            await self.app.live.stop()
