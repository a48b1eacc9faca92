"""The baseline client: nats-py publishing claims with msg ids, N at a time, flat out.

Run as ``python -m bench.raw_publish URL CONCURRENCY SECONDS``; prints one JSON
object: publishes, seconds, cpu_seconds (this process). A process of its own so
that its CPU time is measured the way a sidecar's is.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import nats

from bench.wire import MSG_ID, PREFIX, STREAM, claim_body


async def publish_flat_out(url: str, concurrency: int, seconds: float) -> dict[str, float]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    body = claim_body("rawpub", 1_900_000_000_000, "f" * 32)
    subject = f"{PREFIX}rawpub.claims"
    run = time.time_ns()  # ids unique across runs on the same stream
    sent = 0

    async def one(i: int) -> None:
        await js.publish(subject, body, timeout=5.0, stream=STREAM, headers={MSG_ID: f"{run}:{i}"})

    await asyncio.gather(*(one(-k - 1) for k in range(concurrency)))  # warm up
    cpu0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await asyncio.gather(*(one(sent + k) for k in range(concurrency)))
        sent += concurrency
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await nc.close()
    return {"publishes": sent, "seconds": elapsed, "cpu_seconds": cpu}


def main() -> None:
    url, concurrency, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    print(json.dumps(asyncio.run(publish_flat_out(url, concurrency, seconds))))


if __name__ == "__main__":
    main()
