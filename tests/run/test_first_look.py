"""A slot due while a sidecar starts waits for its first look at the stream and
its first read of the state bucket.

A real sidecar process and nats-server; the first look (failpoint
``stream.check``) or the first read (``watch.read``) is made late on purpose,
as a loaded machine or a slow JetStream makes it. Before the fix, each slot
due meanwhile was skipped at once ("stream not checked yet", "state bucket not
read yet"): a ``run_on: every`` instance restarted just before a slot lost that
slot on its own app (CI: the fleet counted it missed, as ``away``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sidecar.config.load import parse_config
from tests.receivers import Receiver, receiver
from tests.support import NatsServer, job, sidecars, wait_for

LATE = 2.5  # the first look (or read) comes this long after the job's walk began
YEARLY = {"name": "keep", "schedule": "0 0 1 1 *"}


@pytest.mark.parametrize("point", ["stream.check", "watch.read"])
def test_slots_due_before_the_first_look_are_claimed_once_it_comes(
    tmp_path: Path, nats_server: NatsServer, point: str
) -> None:
    gen = receiver()
    app = next(gen)
    try:
        tick = job("tick", schedule="* * * * * *", run_on="every", max_late="20s")
        config = {"nats": {"servers": [nats_server.url]}, "target": {"url": app.url}}
        # The stream made beforehand: a slot before a stream's creation is never claimed.
        with sidecars(tmp_path, [("first", {**config, "jobs": [YEARLY]}, {})]):
            pass
        env = {"ANARCHON_FAILPOINTS": f"{point}=1*sleep({LATE})"}
        with sidecars(tmp_path, [("a", {**config, "jobs": [tick]}, env)]) as (a,):
            # Its sleep's line, and LATE after it the look (the log's local time).
            slept = next(x for x in a.log().splitlines() if f"failpoint {point}: sleep" in x)
            ready_at = datetime.fromisoformat(slept[:23].replace(",", ".")).timestamp() + LATE
            wait_for(
                lambda: any(s / 1000 > ready_at + 1 for s in slots_of(app)), 15, what="a run on"
            )
            got = Counter(slots_of(app))
            log = a.log()
        # Every slot due while it waited ran, once, claimed once the look came.
        before = sorted(s for s in got if s / 1000 < ready_at)
        assert len(before) >= 2, (before, ready_at, sorted(got), log)
        first, last = min(got), max(got)
        assert sorted(got) == list(range(first, last + 1000, 1000)), got
        assert max(got.values()) == 1, got
        assert "stream not checked yet" not in log, log
    finally:
        next(gen, None)


def slots_of(app: Receiver) -> list[int]:
    return [int(r.headers["X-Anarchon-Slot"]) for r in app.received("/jobs/tick")]


async def test_the_start_up_wait_ends_on_stop_and_for_good_after_its_limit(
    nats_server: NatsServer, make_jobs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, nothing started (no look, no read will come): a slot waiting is let
    go on stop, counted ``shutdown``; past STARTUP_LIMIT no slot waits any more (a
    bucket that cannot be opened holds no slot for ever)."""
    from sidecar.run import startup

    config = parse_config(
        {
            "nats": {"servers": [nats_server.url]},
            "jobs": [{"name": "tick", "schedule": "* * * * * *", "max_late": "60s"}],
        },
        {},
    )
    tick = config.jobs[0]

    def skipped(jobs: Any, reason: str) -> float:
        sample = jobs.metrics.registry.get_sample_value
        return sample("anarchon_claims_skipped_total", {"job": "tick", "reason": reason}) or 0

    monkeypatch.setattr(startup, "STARTUP_LIMIT", 0.5)
    async with make_jobs(config) as jobs:
        now = time.time()
        # Past the limit: let go at 0.5 s, not at half its window (30 s), and skipped.
        await asyncio.wait_for(jobs.attempt(tick, int(now) * 1000, now), 10)
        assert skipped(jobs, "stream") == 1
        # Never held again.
        begun = time.monotonic()
        await asyncio.wait_for(jobs.attempt(tick, int(now) * 1000 + 1000, time.time()), 10)
        assert time.monotonic() - begun < 0.4 and skipped(jobs, "stream") == 2
    monkeypatch.setattr(startup, "STARTUP_LIMIT", 60.0)
    async with make_jobs(config) as jobs:
        now = time.time()
        waiting = asyncio.create_task(jobs.attempt(tick, int(now) * 1000, now))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # waiting for the first look
        jobs.stopping.set()
        await asyncio.wait_for(waiting, 5)
        assert skipped(jobs, "shutdown") == 1 and skipped(jobs, "stream") == 0
