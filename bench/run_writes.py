"""The JetStream writes of a burst's runs alone, and the client CPU they cost.

``python -m bench.run_writes [RUNS]`` (default 10,000): against a nats-server of
its own, RUNS runs' writes as a sidecar makes them (sidecar/store/kv.py's run
lease create, sidecar/run/record.py's result, the lease's delete), 256 runs at
a time (``target.max_in_flight``'s default), in this process. Prints (and
writes ``bench/results/run_writes.json``) the process CPU time and the wall
time they took: the cost of the write path itself (sidecar/store/pipe.py),
apart from the rest of a run and from the watch that receives the writes
(docs/PERFORMANCE.md "The burst"). Run it with PYTHONPATH at another tree to
measure that tree's code.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import nats

from bench.common import machine, nats_server, workdir, write_result
from sidecar.core.wire import SUCCEEDED, ResultRecord
from sidecar.run.record import publish_result
from sidecar.store.bucketcheck import StateSpec
from sidecar.store.kv import Keys
from sidecar.store.state import ensure_bucket
from sidecar.store.stream import StreamSpec, ensure_stream

RUNS = 10_000
AT_ONCE = 256
STREAM = StreamSpec("CRON", "cron.", 300.0, 1000, None)


async def measure(url: str, runs: int) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await ensure_stream(js, STREAM)
        keys = Keys(await ensure_bucket(js, StateSpec("BENCH_STATE", 1, 60.0)))
        room = asyncio.Semaphore(AT_ONCE)

        async def run(i: int) -> None:
            async with room:
                value = {"job": f"j{i}", "slot": 1000, "token": f"t{i}", "instance": "b0"}
                revision = await keys.create(f"run.j{i}.1000", value, 30.0)
                record = ResultRecord(f"j{i}", 1000, f"t{i}", "b0", SUCCEEDED, "", "", 1, 200, None)
                assert await publish_result(js, STREAM.name, STREAM.prefix, record)
                await keys.delete(f"run.j{i}.1000", revision)

        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.gather(*(run(i) for i in range(runs)))
        return {
            "runs": runs,
            "cpu_s": time.process_time() - cpu,
            "wall_s": time.monotonic() - wall,
        }
    finally:
        await nc.close()


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else RUNS
    with workdir("run-writes") as work, nats_server(work) as server:
        result = asyncio.run(measure(server.url, runs))
    result["machine"] = machine()
    print(
        f"{runs} runs' writes (lease create, result, lease delete), {AT_ONCE} at a time: "
        f"client CPU {result['cpu_s']:.2f} s, wall {result['wall_s']:.2f} s",
        flush=True,
    )
    write_result("run_writes", result)


if __name__ == "__main__":
    main()
