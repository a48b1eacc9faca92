"""The state bucket's cost: a sidecar with 1,000 jobs beside an empty bucket and a full one.

Baseline: the sidecar (runtime-only venv) with 1,000 jobs, started beside a
state bucket holding nothing but its own presence. Measured: the same
sidecar beside a bucket holding 1,000 ``paused.*`` keys and 100 live
``instance.*`` keys (a large fleet), all of which its watch reads into its
view before it is ready. Reported: time to ready and RSS of both, and the
difference, which is what the watch and its view cost at that size. Issue
12's bound: ready in under 1 s, at most 1 MiB more RSS for the watch and
its view.

The cost of the fleet code itself (the bucket, the watch, presence) beside a
tree without it was measured once by hand (docs/PERFORMANCE.md): the tree
before it is not in this repository's working copy to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
from typing import Any

import nats
from nats.js.api import KeyValueConfig, StorageType

from bench import runtime
from bench.common import nats_server, workdir, write_result
from bench.footprint import sidecar

JOBS = 1000
PAUSED = 1000
INSTANCES = 100
REPEATS = 3


async def fill(url: str, bucket: str) -> None:
    """1,000 pauses of other schedulers' jobs and 100 live instances (no TTL: they stay)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            kv = await js.key_value(bucket)
        except Exception:
            kv = await js.create_key_value(
                KeyValueConfig(
                    bucket=bucket, history=1, storage=StorageType.FILE, limit_marker_ttl=300
                )
            )
        for i in range(PAUSED):
            await kv.put(f"paused.other-{i:04d}", json.dumps({"by": "bench"}).encode())
        jobs = {f"job-{i:04d}": "0123456789ab" for i in range(JOBS)}
        value = json.dumps({"version": "bench", "jobs": jobs}).encode()
        for i in range(INSTANCES):
            await kv.put(f"instance.peer-{i:03d}", value)
    finally:
        await nc.close()


async def empty(url: str, bucket: str) -> None:
    nc = await nats.connect(url)
    try:
        with contextlib.suppress(Exception):  # none yet
            await nc.jetstream().delete_key_value(bucket)
    finally:
        await nc.close()


def main() -> None:
    runtime.ensure()
    runs: dict[str, list[dict[str, float]]] = {"empty": [], "full": []}
    with workdir("state_view") as work, nats_server(work) as server:
        for rep in range(REPEATS):  # interleaved
            asyncio.run(empty(server.url, "CRON_STATE"))
            runs["empty"].append(sidecar(work, server, JOBS, rep, "empty"))
            asyncio.run(fill(server.url, "CRON_STATE"))
            runs["full"].append(sidecar(work, server, JOBS, rep, "full"))
    result: dict[str, Any] = {"jobs": JOBS, "paused_keys": PAUSED, "instances": INSTANCES}
    for kind, rows in runs.items():
        result[kind] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    result["view_rss_mib"] = result["full"]["rss_mib"] - result["empty"]["rss_mib"]
    result["ready_ratio"] = result["full"]["seconds"] / result["empty"]["seconds"]
    write_result("state_view", result)
    print(
        f"state view: ready {result['empty']['seconds']:.2f} s (empty bucket) / "
        f"{result['full']['seconds']:.2f} s (1,000 pauses, 100 instances), "
        f"RSS +{result['view_rss_mib']:.2f} MiB for the full view"
    )


if __name__ == "__main__":
    main()
