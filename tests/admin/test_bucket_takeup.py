"""Issue 49: thousands of state-bucket jobs are taken up a slice at a time.

A take-up round judges every changed ``job.`` key, yielding to the event loop
every ``SLICE``; the jobs it judged used to be started all at once at the
round's end, which held the loop for seconds with 100,000 jobs (a scrape of
/metrics took 25 s). Now each slice's jobs are started before the loop is
yielded. Real nats-server, real sidecar: the keys are in the bucket before the
sidecar starts, so one round takes them all up, and the first jobs are taken
up before the round reaches the last key (a hostile one, sorted last, said
when judged).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats

from sidecar.config.load import parse_config
from sidecar.store.state import ensure_bucket, state_spec
from tests.support import NatsServer, sidecars, wait_for

JOBS = 2000
TAKEN_UP = "taken up from the state bucket"
LAST = "job.zzz-last refused, not run"


def fill(url: str, config: dict[str, object]) -> None:
    """JOBS jobs a year from due, then a key that is not a job, sorted last."""

    async def put() -> None:
        nc = await nats.connect(url)
        try:
            kv = (await ensure_bucket(nc.jetstream(), state_spec(parse_config(config, {})))).kv
            values = {
                f"job.tenant-{i:05d}": {"name": f"tenant-{i:05d}", "schedule": "0 0 1 1 *"}
                for i in range(JOBS)
            }
            values["job.zzz-last"] = {"name": "zzz-last", "schedule": "nope"}
            items = [(k, json.dumps(v).encode()) for k, v in values.items()]
            for at in range(0, len(items), 500):
                await asyncio.gather(*(kv.put(k, v) for k, v in items[at : at + 500]))
        finally:
            await nc.close()

    asyncio.run(put())


def test_a_round_takes_its_jobs_up_a_slice_at_a_time(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    config: dict[str, object] = {
        "nats": {"servers": [nats_server.url]},
        "target": {"url": "http://127.0.0.1:9"},  # never called: nothing is due
        "bucket_jobs": {"max_jobs": JOBS + 10},
        "jobs": [{"name": "keep", "schedule": "0 0 1 1 *"}],
    }
    fill(nats_server.url, config)
    with sidecars(tmp_path, [("a", config, {})]) as (proc,):
        log = wait_for(
            lambda: (text := proc.log()).count(TAKEN_UP) == JOBS and LAST in text and text,
            120,
            what=f"{JOBS} jobs taken up and the last key judged",
        )
    said = log.index(LAST)
    # Jobs of the round's first slices were started before its last key was judged.
    assert log.count(TAKEN_UP, 0, said) > 0, "every job started at the round's end"
