"""Lease traffic: requests per run and what the lease costs the claim path.

One connection, one nats-server, the stream and the state bucket as the
sidecar makes them. Each round times, in a random order:
- plain: ``Claimer.claim`` of a fresh slot (the path to the trigger without leases);
- run: the same claim, then ``Lease`` create of ``run.<job>.<slot>`` (the
  trigger would start here), then its delete (after the result);
- lock: the same with ``lock.<job>`` (``overlap: skip``), which a delete
  marker of the previous run always precedes.
The path to the trigger is claim + create; its ratio to plain is what leases
cost the claim path. Requests are counted on the connection (every JetStream
publish and API call is one request). Renewals: one lease held for a while
with a short TTL, renewed every ttl/3.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from typing import Any

import nats
from prometheus_client import CollectorRegistry

from bench.common import machine, nats_server, ratio, summary_ms, workdir, write_result
from sidecar.core.clock import Clock
from sidecar.obs.metrics import Metrics
from sidecar.run.claim import Claimer
from sidecar.run.lease import Lease
from sidecar.store.bucketcheck import StateSpec
from sidecar.store.kv import Keys
from sidecar.store.state import ensure_bucket
from sidecar.store.stream import StreamSpec, ensure_stream
from sidecar.when.attempts import lock_key, run_key

STREAM = "CRON"
PREFIX = "cron."
SLOT0 = 1_900_000_000_000


async def measure(url: str, rounds: int, warmup: int) -> dict[str, Any]:
    nc = await nats.connect(url)
    requests = 0
    real_request = nc.request

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal requests
        requests += 1
        return await real_request(*args, **kwargs)

    nc.request = counted  # type: ignore[method-assign]
    js = nc.jetstream()
    await ensure_stream(js, StreamSpec(STREAM, PREFIX, 300.0, 1000, None))
    bucket = await ensure_bucket(js, StateSpec("CRON_STATE", 1, 300.0))
    keys = Keys(bucket)
    clock = Clock()
    metrics = Metrics(CollectorRegistry())
    claimer = Claimer(nc, js, STREAM, PREFIX, "bench-1", clock)
    perf = time.perf_counter
    times: dict[str, list[float]] = {k: [] for k in ("plain", "run", "run_total", "lock")}
    times["lock_total"] = []
    reqs: dict[str, list[int]] = {"plain": [], "run": [], "lock": []}
    kv_msgs: dict[str, list[int]] = {"run": [], "lock": []}

    async def kv_seq() -> int:
        info = await js.stream_info(bucket.spec.stream)
        return int(info.state.last_seq)

    async def plain(slot: int) -> tuple[float, float]:
        t0 = perf()
        claim = await claimer.claim("plain", slot, clock.monotonic() + 5)
        t = perf() - t0
        assert claim.won
        return t, t

    # The revision of each key's delete marker, as the watch tells the sidecar.
    markers: dict[str, int] = {}

    async def leased(job: str, key: str, slot: int) -> tuple[float, float]:
        t0 = perf()
        claim = await claimer.claim(job, slot, clock.monotonic() + 5)
        assert claim.won
        value = {"job": job, "slot": slot, "attempt": 1, "token": claim.token, "instance": "b"}
        deadline = clock.monotonic() + 5
        lease = Lease(keys, key, value, 30.0, metrics, clock, deadline, markers.get(key, 0))
        async with lease:
            to_trigger = perf() - t0
        markers[key] = lease.released
        return to_trigger, perf() - t0

    kinds = {
        "plain": plain,
        "run": lambda slot: leased("run", run_key("run", slot, 1), slot),
        "lock": lambda slot: leased("lock", lock_key("lock"), slot),
    }
    try:
        for i in range(warmup + rounds):
            slot = SLOT0 + i * 1000
            order = list(kinds)
            random.shuffle(order)
            for kind in order:
                seq = await kv_seq() if kind != "plain" else 0
                before = requests
                to_trigger, whole = await kinds[kind](slot)
                used = requests - before
                if kind != "plain":
                    kv = await kv_seq() - seq
                if i >= warmup:
                    times[kind].append(to_trigger)
                    if kind != "plain":
                        times[f"{kind}_total"].append(whole)
                        kv_msgs[kind].append(kv)
                    reqs[kind].append(used)
        # Renewals: a lease of ttl 1.5 s held for 5 s.
        before = requests
        value = {"job": "run", "slot": 1, "attempt": 1, "token": "t", "instance": "b"}
        lease = Lease(keys, "run.run.1", value, 1.5, metrics, clock, clock.monotonic() + 5)
        async with lease:
            await asyncio.sleep(5.0)
        held = {"ttl_s": 1.5, "held_s": 5.0, "requests": requests - before}
        held["renewals"] = lease.renewals
    finally:
        await nc.close()
    out: dict[str, Any] = {k: summary_ms(v) for k, v in times.items()}
    for kind in ("run", "lock"):
        out[f"{kind}_ratio_p50"] = ratio(out[kind]["p50_ms"], out["plain"]["p50_ms"])
        out[f"{kind}_ratio_p99"] = ratio(out[kind]["p99_ms"], out["plain"]["p99_ms"])
        out[f"{kind}_kv_messages"] = sorted(set(kv_msgs[kind]))
    out["requests_per_run"] = {k: sorted(set(v)) for k, v in reqs.items()}
    out["renewals"] = held
    return out


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    with workdir("leases") as work, nats_server(work) as server:
        result = asyncio.run(measure(server.url, rounds, warmup=50))
    result["rounds"] = rounds
    result["machine"] = machine()
    write_result("leases", result)
    for kind in ("run", "lock"):
        print(
            f"to the trigger, {kind}: p50 {result[kind]['p50_ms']:.3f} ms vs plain claim "
            f"{result['plain']['p50_ms']:.3f} ms ({result[f'{kind}_ratio_p50']:.2f}x); p99 "
            f"{result[kind]['p99_ms']:.3f} vs {result['plain']['p99_ms']:.3f} "
            f"({result[f'{kind}_ratio_p99']:.2f}x); "
            f"with the delete {result[kind + '_total']['p50_ms']:.3f} ms p50"
        )
    print(f"requests per run (claim included): {result['requests_per_run']}")
    run, lock = result["run_kv_messages"], result["lock_kv_messages"]
    print(f"state bucket messages per run: run {run}, lock {lock}")
    print(f"renewals: {result['renewals']}")


if __name__ == "__main__":
    main()
