"""A job of the state bucket put again (``job update``) at the moment its slot fires.

Three real sidecars on a real nats-server. A job's slot fires at its time plus
a random jitter; a sidecar that takes up the job's new settings between the
slot's time and its own jitter ends the old walk before the slot was claimed.
The new walk must still handle that slot (it is in the new schedule too): a
walk started at "the next slot after now" dropped it on every sidecar whose
jitter had not come, so the slot was run by nobody and recorded nowhere.
And no slot runs twice (the old walk's claims and the new walk's are the same
``<job>:<slot>`` ids).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nats

from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    base,
    read_stream,
    sidecars,
    slots,
    wait_for,
)

# A file job that never comes due during a test: the config needs one.
YEARLY = {"name": "keep", "schedule": "0 0 1 1 *"}
# Slots every 20 s, each fired up to 15 s after its time: the new settings land in
# the first few hundred ms, before any sidecar's jitter came (about 95 % of the time).
JITTER = 15.0
EVERY_20 = "*/20 * * * * *"
EVERY_10 = "*/10 * * * * *"  # holds every slot of EVERY_20


def dyn(schedule: str) -> dict[str, Any]:
    return {"name": "dyn", "id": "dyn", "schedule": schedule, "jitter": f"{JITTER:g}s",
            "max_late": "20s"}  # fmt: skip


def put_job(url: str, value: dict[str, Any]) -> None:
    """Write ``job.dyn`` as ``job add/update`` would, without a process's start-up
    (the write must land within a few hundred ms of the slot's time)."""

    async def put() -> None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value("CRON_STATE")
            await kv.put("job.dyn", json.dumps(value).encode())
        finally:
            await nc.close()

    asyncio.run(put())


def schedule_of(p: Sidecar) -> str:
    return p.log().rsplit("job dyn (id dyn) taken up from the state bucket: ", 1)[-1]


def claims(url: str) -> Counter[int]:
    return Counter(int(m.data["slot"]) for m in read_stream(url) if m.subject == "cron.dyn.claims")


def test_a_job_put_again_as_its_slot_fires_still_runs_that_slot_once(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [YEARLY])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        put_job(nats_server.url, dyn(EVERY_20))
        wait_for(
            lambda: all(schedule_of(p).startswith(EVERY_20) for p in procs),
            10,
            what="dyn taken up by all three",
        )
        changed: list[int] = []
        for schedule in (EVERY_10, EVERY_20):
            # A slot of both schedules far enough ahead for the take-up above.
            slot = (int(time.time()) // 20 + 1) * 20 + (20 if time.time() % 20 > 15 else 0)
            wait_for(lambda s=slot: time.time() >= s + 0.05, 45, what="the slot's time")
            put_job(nats_server.url, dyn(schedule))
            landed = time.time() - slot
            wait_for(
                lambda s=schedule: all(schedule_of(p).startswith(s) for p in procs),
                10,
                what=f"{schedule} taken up by all three",
            )
            print(f"slot {slot}: new settings put {landed:.2f}s after its time")
            changed.append(slot * 1000)
        # Past the last slot's jitter and lateness: its claims all came.
        end = changed[-1] / 1000 + JITTER + 5
        wait_for(lambda: time.time() > end, 60, what="the last slot's window")
        ran = Counter(slots(http_app, "/jobs/dyn"))
        claimed = claims(nats_server.url)
    for slot in changed:
        assert ran[slot] == 1, f"slot {slot} ran {ran[slot]} times (claims: {claimed[slot]})"
    assert max(ran.values()) == 1, ran
