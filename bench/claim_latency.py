"""Claim decision latency: Claimer.claim against a raw nats-py publish, interleaved.

One connection, one nats-server, one stream. Each round times, in a random
order:
- won: ``Claimer.claim`` of a fresh slot (publish, ack, decision);
- raw: ``js.publish`` of a claim-sized body with a fresh ``Nats-Msg-Id``;
- lost: ``Claimer.claim`` of a slot already claimed by another token
  (publish, duplicate ack on a first publish: lost, nothing read);
- raw lost: ``js.publish`` of an already stored msg id.
The ratio won/raw is the claim path's cost over the wire's floor.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from typing import Any

import nats

from bench.common import machine, nats_server, ratio, summary_ms, workdir, write_result
from bench.wire import PREFIX, STREAM, claim_body
from sidecar.core.clock import Clock
from sidecar.run.claim import MSG_ID, Claimer
from sidecar.store.stream import StreamSpec, ensure_stream

SLOT0 = 1_900_000_000_000


async def measure(url: str, rounds: int, warmup: int) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await ensure_stream(js, StreamSpec(STREAM, PREFIX, 300.0, 1000, None))
    clock = Clock()
    claimer = Claimer(nc, js, STREAM, PREFIX, "bench-1", clock)
    body = claim_body("raw", SLOT0, "f" * 32)
    times: dict[str, list[float]] = {"won": [], "raw": [], "lost": [], "raw_lost": []}
    perf = time.perf_counter

    async def won(slot: int) -> float:
        t0 = perf()
        claim = await claimer.claim("won", slot, clock.monotonic() + 5)
        t = perf() - t0
        assert claim.won and not claim.duplicate_acks
        return t

    async def raw(slot: int) -> float:
        t0 = perf()
        ack = await js.publish(
            f"{PREFIX}raw.claims", body, timeout=2.0, stream=STREAM, headers={MSG_ID: f"raw:{slot}"}
        )
        t = perf() - t0
        assert not ack.duplicate
        return t

    async def lost(slot: int) -> float:
        t0 = perf()
        claim = await claimer.claim("lost", slot, clock.monotonic() + 5)
        t = perf() - t0
        assert not claim.won and claim.duplicate_acks == 1
        return t

    async def raw_lost(slot: int) -> float:
        t0 = perf()
        ack = await js.publish(
            f"{PREFIX}rawlost.claims",
            body,
            timeout=2.0,
            stream=STREAM,
            headers={MSG_ID: f"rawlost:{slot}"},
        )
        t = perf() - t0
        # A first publish answered duplicate is decided without a read (issue 14).
        assert ack.duplicate
        return t

    kinds = {"won": won, "raw": raw, "lost": lost, "raw_lost": raw_lost}
    try:
        for i in range(warmup + rounds):
            slot = SLOT0 + i * 1000
            # Another instance's claims, stored before the timed part.
            for job in ("lost", "rawlost"):
                other = claim_body(job, slot, "0" * 32)
                await js.publish(
                    f"{PREFIX}{job}.claims", other, stream=STREAM, headers={MSG_ID: f"{job}:{slot}"}
                )
            order = list(kinds)
            random.shuffle(order)
            for kind in order:
                t = await kinds[kind](slot)
                if i >= warmup:
                    times[kind].append(t)
    finally:
        await nc.close()
    out: dict[str, Any] = {k: summary_ms(v) for k, v in times.items()}
    out["ratio_p50"] = ratio(out["won"]["p50_ms"], out["raw"]["p50_ms"])
    out["ratio_p99"] = ratio(out["won"]["p99_ms"], out["raw"]["p99_ms"])
    out["lost_ratio_p50"] = ratio(out["lost"]["p50_ms"], out["raw_lost"]["p50_ms"])
    out["lost_ratio_p99"] = ratio(out["lost"]["p99_ms"], out["raw_lost"]["p99_ms"])
    return out


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    with workdir("claim") as work, nats_server(work) as server:
        result = asyncio.run(measure(server.url, rounds, warmup=300))
    result["rounds"] = rounds
    result["machine"] = machine()
    write_result("claim_latency", result)
    print(
        f"claim won p50 {result['won']['p50_ms']:.3f} ms vs raw {result['raw']['p50_ms']:.3f} ms "
        f"({result['ratio_p50']:.2f}x); p99 {result['won']['p99_ms']:.3f} vs "
        f"{result['raw']['p99_ms']:.3f} ({result['ratio_p99']:.2f}x)"
    )
    lost, raw_lost = result["lost"], result["raw_lost"]
    print(
        f"claim lost p50 {lost['p50_ms']:.3f} ms vs raw {raw_lost['p50_ms']:.3f} ms "
        f"({result['lost_ratio_p50']:.2f}x)"
    )


if __name__ == "__main__":
    main()
