"""``resume --catchup`` settling a slot's fate (sidecar/run/catchupfate.py), one
sidecar's parts in-process (the ``make_jobs`` fixture) against a real nats-server.

docs/GUARANTEES.md, "One fate per slot", rule 5: a paused slot with no fate
message is settled (the taker publishes the slot's skip record itself, the one
every sidecar makes) while a late record may still come, then caught up. A
slot looked at once the records' own deadline has passed (the catch-up's
earlier slots ran long, or waited) cannot be settled any more: its record's
claim would have no time left. It must then be read once no record can come,
and caught up, not dropped as "not settled". A slot the job's calendar
excludes is recorded ``excluded`` by every sidecar, paused or not: settled so,
never caught up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sidecar.config.load import JobConfig, parse_config
from sidecar.core.clock import rfc3339
from sidecar.run.catchupfate import FATE_SETTLE, CatchUpFate, records_end
from sidecar.run.job_loop import Jobs
from tests.fleet.test_catchup_late_record import fates
from tests.run.test_job_life import running
from tests.support import (
    MakeJobs,
    NatsServer,
    RecordingApp,
    base,
    cli_config,
    job,
    read_stream,
    run_cli,
    sidecars,
    until,
    wait_for,
)

WINDOW, MAX_LATE = 12.0, 1.0


@asynccontextmanager
async def paused_taker(
    make_jobs: MakeJobs, nats_server: NatsServer, app: RecordingApp, **extra: Any
) -> AsyncIterator[tuple[Jobs, JobConfig, int]]:
    """A sidecar's parts with job ``work`` paused before its slot (returned, about
    one to two seconds ahead), no sidecar recording it, and a claim older than it in the
    stream (else its record may have been trimmed: never caught up)."""
    config = parse_config(
        {
            "instance_id": "taker",
            "nats": {"servers": [nats_server.url], "duplicate_window": f"{WINDOW:g}s"},
            "target": {"url": app.url},
            "jobs": [
                job(
                    "work",
                    **{
                        "schedule": "0 0 1 1 *",
                        "jitter": "0s",
                        "max_late": f"{MAX_LATE:g}s",
                        **extra,
                    },
                )
            ],
        },
        {},
    )
    async with make_jobs(config) as jobs, running(jobs):
        kv = jobs.fleet.bucket.kv  # type: ignore[union-attr]
        now = time.time()
        await kv.put("paused.work", json.dumps({"by": "op", "at": rfc3339(now)}).encode())
        older = int(now) * 1000 - 1000
        assert (await jobs.claimer.claim("work", older, jobs.clock.monotonic() + 5)).won
        slot = int(now) * 1000 + 2000
        await until(lambda: jobs.fleet.blocked("work", slot) is not None, 5, "the pause seen")
        yield jobs, config.job("work"), slot


async def fate_of(nats_server: NatsServer, slot: int) -> list[Any]:
    stored = await asyncio.to_thread(read_stream, nats_server.url)
    return [m.data.get("skipped") for m in fates(stored, "work", slot)]


async def test_a_paused_slot_without_a_record_is_settled_and_caught_up_at_once(
    make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    async with paused_taker(make_jobs, nats_server, http_app) as (jobs, work, slot):
        await asyncio.sleep(slot / 1000 + MAX_LATE + FATE_SETTLE - time.time())
        why = await CatchUpFate(jobs.ctx, jobs.unclaimed.recorder).refused(work, slot)
        done = time.time()
    assert why is None, f"paused slot {slot} not caught up: {why}"
    # Settled, not waited for until no record can come (records_end).
    assert done < records_end(work, slot, WINDOW) - 2, "the catch-up waited for nothing"
    assert await fate_of(nats_server, slot) == ["paused"]


async def test_a_paused_slot_looked_at_after_its_records_deadline_is_still_caught_up(
    make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """It failed before the fix: "its fate could not be settled; not run"."""
    async with paused_taker(make_jobs, nats_server, http_app) as (jobs, work, slot):
        end = records_end(work, slot, WINDOW)
        # Between the records' deadline and `end`: no record can be asked for any more.
        await asyncio.sleep(end - FATE_SETTLE + 0.2 - time.time())
        assert (jobs.fleet.blocked("work", slot) or ("",))[0] == "paused"
        why = await CatchUpFate(jobs.ctx, jobs.unclaimed.recorder).refused(work, slot)
    assert why is None, f"paused slot {slot} not caught up: {why}"
    assert await fate_of(nats_server, slot) == []


async def test_an_excluded_slot_of_a_paused_job_is_settled_excluded_never_caught_up(
    make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """The job loop records an excluded slot ``excluded`` before it looks at the
    pause (sidecar/run/job_loop.py); the settling record must be the same. It
    failed before the fix: settled ``paused``, and caught up."""
    now = time.time()
    hours = f"{datetime.fromtimestamp(now - 60, UTC).isoformat()}/"
    hours += datetime.fromtimestamp(now + 60, UTC).isoformat()
    async with paused_taker(make_jobs, nats_server, http_app, exclude=[hours]) as (
        jobs,
        work,
        slot,
    ):
        assert work.schedule.excluded(slot) is not None
        await asyncio.sleep(slot / 1000 + MAX_LATE + FATE_SETTLE - time.time())
        why = await CatchUpFate(jobs.ctx, jobs.unclaimed.recorder).refused(work, slot)
    assert why == "it was skipped (excluded)", why
    assert await fate_of(nats_server, slot) == ["excluded"]


async def test_a_catchup_slot_waited_for_when_the_sidecar_stops_is_left_to_the_fleet(
    make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """The taker (this sidecar's own backfill part) waits for the slot's decision
    window (here about 10 s); it stops meanwhile (a rolling update). Nothing of the
    slot was claimed: the slot goes back to the backfill's pending slots for another
    sidecar, not counted done and lost. It failed before the fix: "not caught up:
    the sidecar is stopping", and gone."""
    from sidecar.config.model import Secrets
    from sidecar.ops import skipops
    from sidecar.run.backfill import backfill_key

    every = {"schedule": "* * * * * *", "max_late": "10s"}
    async with paused_taker(make_jobs, nats_server, http_app, **every) as (jobs, work, _):
        kv = jobs.fleet.bucket.kv  # type: ignore[union-attr]
        slot = int(time.time()) * 1000 - 1000  # its window closes 10 s from now

        async def value() -> dict[str, Any]:
            data: dict[str, Any] = json.loads((await kv.get(backfill_key("work"))).value or b"{}")
            return data

        await skipops.backfill(jobs.config, Secrets(), work, [slot], "op", False, False, "catchup")
        deadline = time.time() + 5
        while not (await value()).get("running"):
            assert time.time() < deadline, "the slot was not taken"
            await asyncio.sleep(0.05)
        jobs.stopping.set()  # the sidecar stops while the catch-up waits
        deadline = time.time() + 5
        while (left := await value()).get("running"):
            assert time.time() < deadline, f"the slot is still taken: {left}"
            await asyncio.sleep(0.05)
    assert http_app.requests_for("/jobs/work") == []
    assert left.get("pending") == [slot] and left.get("done", 0) == 0, left


async def test_a_taker_whose_view_is_behind_does_not_settle_with_what_it_shows(
    make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """The taker's watch stalls before the operator's ``skip`` of the slot is stored:
    its view shows the slot only paused. The fleet's sidecar, whose view is whole,
    records it ``skip``, and that record lands late (after the catch-up looked).
    The taker must not settle the slot ``paused`` from a view it cannot vouch for
    up to the slot's instant (docs/GUARANTEES.md rule 3): it failed before the fix,
    the slot settled ``paused`` and caught up, the ``skip`` record a duplicate."""
    import dataclasses

    from sidecar.run.skips import skip_record_id

    async with paused_taker(make_jobs, nats_server, http_app) as (jobs, work, slot):
        kv = jobs.fleet.bucket.kv  # type: ignore[union-attr]
        await jobs.fleet.stop()  # the taker's watch stalls here (a stop may take 2 s)
        slot = max(slot, (int(time.time()) + 2) * 1000)  # paused too: a yearly job
        await kv.put(
            "skip.work",
            json.dumps({"slots": [slot], "by": "op", "at": rfc3339(time.time())}).encode(),
        )
        assert slot / 1000 - time.time() > 0.2  # stored before the slot's instant
        await asyncio.sleep(slot / 1000 + MAX_LATE + FATE_SETTLE - time.time())
        refused = asyncio.ensure_future(
            CatchUpFate(jobs.ctx, jobs.unclaimed.recorder).refused(work, slot)
        )
        await asyncio.sleep(1.0)  # the catch-up has looked (and settled, before the fix)
        # Then the record of the sidecar that judged the slot lands, late.
        other = dataclasses.replace(jobs.claimer, instance="fleet")
        await other.claim(
            "work",
            slot,
            jobs.clock.monotonic() + 5,
            msg_id=skip_record_id("work", slot),
            extra={"skipped": "skip"},
        )
        why = await asyncio.wait_for(refused, 20)
    assert await fate_of(nats_server, slot) == ["skip"]
    assert why == "it was skipped (skip)", why


def test_paused_slots_no_sidecar_saw_are_caught_up_by_a_sidecar_started_after_resume(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Every sidecar down while the job was paused: its slots have no record at all.
    The one started after ``resume --catchup`` never saw the pause (its view has only
    the pause's delete, stored after them): it cannot settle them, waits until no
    record can come (a short ``nats.duplicate_window`` here) and catches each up once."""
    name = "gone"
    spec = job(name, schedule="*/2 * * * * *", jitter="200ms", max_late="2s")
    config = base(nats_server, http_app, [spec])
    config["nats"]["duplicate_window"] = "8s"
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [("s1", config, {})]):
        wait_for(lambda: http_app.requests_for(f"/jobs/{name}"), 20, what="a run")
    pausing = time.time()
    assert run_cli("pause", name, "-c", cfg).returncode == 0
    paused = time.time()
    wait_for(lambda: time.time() > paused + 4.5, 6, what="two slots paused, nobody up")
    asked = time.time()
    done = run_cli("resume", name, "-c", cfg, "--catchup")
    assert done.returncode == 0, done.stderr
    resumed = time.time()
    # The paused slots: each command takes its own time (a second on a loaded
    # machine), and a slot that fell while one ran may be on either side: `pause`
    # stamps its instant before it connects, `resume` queues up to its own now. The
    # slots between the commands are sure, those while they ran either way.
    surely = set(range(int(paused) // 2 * 2000 + 2000, int(asked * 1000) + 1, 2000))
    possible = set(range(int(pausing) // 2 * 2000 + 2000, int(resumed * 1000) + 1, 2000))

    def caught_up() -> list[int]:
        return sorted(
            int(r.headers["X-Anarchon-Slot"])
            for r in http_app.requests_for(f"/jobs/{name}")
            if r.headers.get("X-Anarchon-Trigger") == "catchup"
        )

    def within() -> bool:
        return surely <= set(caught_up()) <= possible

    with sidecars(tmp_path, [("s2", config, {})]):
        wait_for(within, 20, what=f"{sorted(surely)} caught up")
        if surely != possible:  # a slot while a command ran: a little later, or never
            with contextlib.suppress(AssertionError):
                wait_for(lambda: set(caught_up()) == possible, 4, what="every slot caught up")
    assert len(surely) >= 2 and within()
    assert len(caught_up()) == len(set(caught_up())), caught_up()  # each once
