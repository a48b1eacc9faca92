"""``resume --catchup`` settling a slot's fate (sidecar/run/catchupfate.py), one
sidecar's parts in-process (the ``make_jobs`` fixture) against a real nats-server.

docs/GUARANTEES.md, "One fate per slot", rule 5: a paused slot with no fate
message is settled (the taker publishes the slot's skip record itself) only
while a late record may still come. A slot looked at once the records' own
deadline has passed (the catch-up's earlier slots ran long, or waited) cannot
be settled any more: its record's claim would have no time left. It must then
be read once no record can come, and caught up, not dropped as "not settled".
"""

from __future__ import annotations

import asyncio
import json
import time

from sidecar.config.load import parse_config
from sidecar.core.clock import rfc3339
from sidecar.run.catchupfate import FATE_SETTLE, CatchUpFate, records_end
from tests.run.test_job_life import running
from tests.support import MakeJobs, NatsServer, RecordingApp, job, until

WINDOW, MAX_LATE = 12.0, 1.0


async def test_a_paused_slot_looked_at_after_its_records_deadline_is_still_caught_up(
    make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = parse_config(
        {
            "instance_id": "taker",
            "nats": {"servers": [nats_server.url], "duplicate_window": f"{WINDOW:g}s"},
            "target": {"url": http_app.url},
            "jobs": [job("work", schedule="0 0 1 1 *", jitter="0s", max_late=f"{MAX_LATE:g}s")],
        },
        {},
    )
    async with make_jobs(config) as jobs, running(jobs):
        work = config.job("work")
        kv = jobs.fleet.bucket.kv  # type: ignore[union-attr]
        now = time.time()
        await kv.put("paused.work", json.dumps({"by": "op", "at": rfc3339(now)}).encode())
        # A claim older than the slot in the stream (else its record may be trimmed).
        older = int(now) * 1000 - 1000
        assert (await jobs.claimer.claim("work", older, jobs.clock.monotonic() + 5)).won
        slot = int(now) * 1000 + 1000  # paused at its instant; no sidecar recorded it
        await until(lambda: jobs.fleet.blocked("work", slot) is not None, 5, "the pause seen")
        end = records_end(work, slot, WINDOW)
        # Between the records' deadline and `end`: no record can be asked for any more.
        await asyncio.sleep(end - FATE_SETTLE + 0.2 - time.time())
        assert (jobs.fleet.blocked("work", slot) or ("",))[0] == "paused"
        fate = CatchUpFate(jobs.ctx, jobs.unclaimed.recorder)
        why = await fate.refused(work, slot)
    assert why is None, f"paused slot {slot} not caught up: {why}"
