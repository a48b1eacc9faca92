"""Catch-up's wait for the stream and the view (sidecar/run/catchup.py).

In process, on a real nats-server through conftest's ``make_jobs``; the whole
path, sidecars down and up again, is tests/fleet/test_fleet.py.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from sidecar.config.load import JobConfig, parse_config
from sidecar.run.catchup import CatchUp
from tests.support import NatsServer


async def test_a_sidecar_ready_after_the_oldest_missed_slot_expired_catches_up_the_newer(
    nats_server: NatsServer, make_jobs: Any
) -> None:
    """Ready a few seconds late (a loaded machine, a slow stream check): the oldest
    missed slot is past max_late by then, the newest are not, and those are claimed.
    The wait ended at the oldest's deadline, and nothing was caught up."""
    config = parse_config(
        {
            "nats": {"servers": [nats_server.url]},
            "jobs": [
                {"name": "tick", "schedule": "* * * * * *", "catchup": "all", "max_late": "4s"}
            ],
        },
        {},
    )
    claimed: list[tuple[int, float]] = []

    async def attempt(job: JobConfig, slot: int, now: float, *rest: Any) -> None:
        claimed.append((slot, now))

    async with make_jobs(config) as jobs:
        ctx = jobs.ctx
        assert not ctx.guard.stream_ready and not ctx.fleet.view.synced
        start = time.time()
        first = (int(start) + 1) * 1000  # the loop's next slot: every earlier one missed
        catch_up = CatchUp(ctx, attempt, lambda job: first)

        async def ready_later() -> None:
            await asyncio.sleep(2.0)
            ctx.guard.stream_ready = True
            ctx.fleet.view.synced = True

        readied = asyncio.create_task(ready_later())
        await asyncio.wait_for(catch_up(config.jobs[0]), 10)
        await readied
    assert claimed, "nothing caught up"
    for slot, at in claimed:
        assert start - 4 <= slot / 1000 < first / 1000, (slot, start)
        assert at - slot / 1000 <= 4.0, ("claimed past max_late", slot, at)
    # The slots that expired while it waited were not claimed.
    assert min(s for s, _ in claimed) / 1000 >= start - 4 + 2.0 - 0.1, claimed


async def test_a_claim_of_the_next_slot_stored_before_the_read_hides_nothing(
    nats_server: NatsServer, make_jobs: Any
) -> None:
    """A loaded sidecar (or a fleet reconnecting just before a slot): another ran the
    slot the loop handles next before this catch-up read the job's newest claim.
    That claim says nothing of the slots before it: each is claimed (those that
    ran are duplicates). A newest claim among them still says they ran."""
    from tests.run.test_job_life import running

    config = parse_config(
        {
            "nats": {"servers": [nats_server.url]},
            "jobs": [
                {"name": "tick", "schedule": "* * * * * *", "catchup": "all", "max_late": "5s"},
                {
                    "name": "newest",
                    "schedule": "* * * * * *",
                    "catchup": "all",
                    "max_late": "5s",
                    "overlap": "replace",
                    "cancel": {"grace": "1s"},
                },
            ],
        },
        {},
    )
    job, newest_only = config.jobs
    attempted: list[int] = []

    async def attempt(job: JobConfig, slot: int, now: float, *rest: Any) -> None:
        attempted.append(slot)

    async with make_jobs(config) as jobs, running(jobs):
        ctx = jobs.ctx
        first = (int(time.time()) + 1) * 1000
        deadline = ctx.clock.monotonic() + 5
        await ctx.claimer.claim(job.name, first, deadline)  # the loop's slot, run already
        await CatchUp(ctx, attempt, lambda job: first)(job)
        assert attempted, "the slots before the loop's were not claimed"
        assert all(first - 5000 <= s < first for s in attempted), (attempted, first)
        assert len(attempted) >= 3, attempted
        # overlap: replace: an older slot claimed after the newer would stop its run.
        attempted.clear()
        await ctx.claimer.claim(newest_only.name, first, deadline)
        await CatchUp(ctx, attempt, lambda job: first)(newest_only)
        assert attempted == [], attempted
        # ... nor once the loop handled a newer slot while it caught up (a fresh job:
        # nothing stored, every candidate missed; the loop moves on at the first).
        fresh = replace(newest_only, name="fresh")
        walk = {"next": first}

        async def moved_on(job: JobConfig, slot: int, now: float, *rest: Any) -> None:
            attempted.append(slot)
            walk["next"] = first + 1000

        await CatchUp(ctx, moved_on, lambda job: walk["next"])(fresh)
        assert len(attempted) == 1, attempted
        # The newest claim is the newest candidate's: nothing missed, no claim.
        attempted.clear()
        await ctx.claimer.claim(job.name, first - 1000, deadline)
        await CatchUp(ctx, attempt, lambda job: first)(job)
        assert attempted == [], attempted
