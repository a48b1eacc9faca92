"""claim.candidates with real sidecar processes: per slot only k claim, every slot runs once,
and a slot whose candidates are killed or frozen still runs, within max_late.

Claim publishes are counted on the wire: a plain NATS subscription on
``cron.*.claims`` receives every claim published (stored or duplicate), and one on
``$JS.API.>`` every JetStream API request (stream reads, lease writes are KV
publishes and not among them).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nats
import pytest

from sidecar.fleet.candidates import rank
from tests.reliability.conftest import Figures
from tests.reliability.helpers import (
    config,
    every_second,
    lateness,
    metric_sum,
    next_second_ms,
    runs_by_slot,
    tally,
    unclaimed_runs,
    wait_all_ran,
)
from tests.support import NatsServer, RecordingApp, Sidecar, read_stream, sidecars, wait_for


class WireCount:
    """Claim publishes per (job, slot) and JetStream API requests, seen by a subscriber."""

    def __init__(self, url: str, prefix: str = "cron.") -> None:
        self.url = url
        self.prefix = prefix
        self.claims: Counter[tuple[str, int]] = Counter()
        self.api = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),))

    async def _run(self) -> None:
        import json

        nc = await nats.connect(self.url)
        self._stop = asyncio.Event()

        async def on_claim(msg: Any) -> None:
            try:
                body = json.loads(msg.data)
                self.claims[(str(body["job"]), int(body["slot"]))] += 1
            except (ValueError, KeyError, TypeError):
                pass

        async def on_api(msg: Any) -> None:
            self.api += 1

        await nc.subscribe(f"{self.prefix}*.claims", cb=on_claim)
        await nc.subscribe("$JS.API.>", cb=on_api)
        await nc.flush()
        self._ready.set()
        await self._stop.wait()
        await nc.drain()

    def __enter__(self) -> WireCount:
        self._thread.start()
        assert self._ready.wait(10), "wire counter did not connect"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._loop.close()

    def per_slot(self, jobs: list[str], start_ms: int, end_ms: int) -> list[int]:
        return [
            self.claims[(job, slot)] for job in jobs for slot in range(start_ms, end_ms + 1, 1000)
        ]


def candidates_job(name: str, k: int, **extra: Any) -> dict[str, Any]:
    # jitter 300ms + fallback 700ms + ack_timeout 2s < max_late 5s
    return every_second(name, claim={"candidates": k, "fallback": "700ms"}, **extra)


def wait_fleet(procs: list[Sidecar], n: int, timeout: float = 30.0) -> None:
    """Every sidecar sees every one in its fleet view (their presence keys)."""
    wait_for(
        lambda: all(p.metric("anarchon_fleet_instances") == n for p in procs),
        timeout,
        interval=0.2,
        what=f"every sidecar to see {n} instances",
    )


def check_once(app: RecordingApp, names: list[str], start_ms: int, end_ms: int, url: str) -> Any:
    result = tally(app, names, start_ms, end_ms)
    assert not result.doubles, f"slots ran twice: {result.doubles}"
    assert not result.missing, f"slots never ran: {result.missing[:20]}"
    assert not unclaimed_runs(read_stream(url), list(app.requests))
    return result


@pytest.mark.parametrize("k", [1, 2])
def test_contention_with_candidates(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures, k: int
) -> None:
    """6 sidecars x 5 per-second jobs for 10 s: 0 doubles, 0 misses, about k claims a slot."""
    n, seconds = 6, 10
    names = [f"c{i}" for i in range(5)]
    cfg = config([nats_server.url], http_app, [candidates_job(name, k) for name in names])
    with (
        sidecars(tmp_path, [(f"s{i}", cfg, {}) for i in range(n)]) as running,
        WireCount(nats_server.url) as wire,
    ):
        wait_fleet(running, n)
        start_ms = next_second_ms() + 1000
        end_ms = start_ms + (seconds - 1) * 1000
        api_before = wire.api
        assert wait_all_ran(http_app, names, start_ms, end_ms, timeout=seconds + 15)
        time.sleep(1.5)  # the last slots' fallbacks (jitter + fallback) are over
        api = wire.api - api_before
        seen = metric_sum(running, "anarchon_claims_deferred_total", {"outcome": "seen"})
        fallback = metric_sum(running, "anarchon_claims_deferred_total", {"outcome": "fallback"})
        codes = [p.terminate() for p in running]
    result = check_once(http_app, names, start_ms, end_ms, nats_server.url)
    per_slot = wire.per_slot(names, start_ms, end_ms)
    mean = sum(per_slot) / len(per_slot)
    winners = Counter(r.headers["X-Anarchon-Instance"] for r in http_app.requests)
    figures.report(
        f"candidates-k{k}",
        sidecars=n,
        jobs=len(names),
        slots=result.slots,
        runs=result.runs,
        doubles=len(result.doubles),
        misses=result.misses,
        claims_per_slot=round(mean, 2),
        claims_per_slot_max=max(per_slot),
        api_requests_per_slot=round(api / len(per_slot), 2),
        deferred_seen=int(seen),
        deferred_fallback=int(fallback),
        max_start_delay_s=round(max(lateness(http_app, names)), 3),
    )
    assert codes == [0] * n
    # Each slot: its k candidates, and now and then a fallback (a lease seen late).
    assert min(per_slot) >= 1
    assert mean <= k + 0.5, per_slot
    assert seen >= (n - k) * len(per_slot) * 0.8, (seen, fallback)
    # The work still spreads over the fleet.
    assert len(winners) >= 3, winners


@contextmanager
def one_job_fleet(
    tmp_path: Path, nats_server: NatsServer, app: RecordingApp, n: int, k: int
) -> Iterator[list[Sidecar]]:
    cfg = config([nats_server.url], app, [candidates_job("f", k)])
    with sidecars(tmp_path, [(f"s{i}", cfg, {}) for i in range(n)]) as running:
        wait_fleet(running, n)
        yield running


def _slot_with_candidates(names: list[str], k: int, after_ms: int) -> tuple[int, list[str]]:
    slot = after_ms
    return slot, rank("f", slot, names, k)


@pytest.mark.parametrize(("k", "how"), [(1, "kill"), (2, "kill"), (1, "stop")])
def test_candidates_gone_at_the_slot(
    tmp_path: Path,
    nats_server: NatsServer,
    http_app: RecordingApp,
    figures: Figures,
    k: int,
    how: str,
) -> None:
    """The slot's k candidates are killed (SIGKILL) or frozen (SIGSTOP) 300 ms before
    its time, while their presence keys still name them live: the others claim it after
    jitter + fallback, it runs once, within max_late. A frozen candidate thawed 2 s
    later claims the slot too: a duplicate, it does not run it again."""
    n = 5
    with one_job_fleet(tmp_path, nats_server, http_app, n, k) as running:
        by_name = {p.name: p for p in running}
        slot = next_second_ms() + 2000
        chosen = rank("f", slot, list(by_name), k)
        start_ms = next_second_ms()
        while time.time() < slot / 1000 - 0.3:
            time.sleep(0.01)
        sig = signal.SIGKILL if how == "kill" else signal.SIGSTOP
        for name in chosen:
            proc = by_name[name].proc
            assert proc is not None
            proc.send_signal(sig)
        gone_at = time.time()
        # The slots after it run too (each of its presence keys lives on up to 15 s).
        end_ms = slot + 6000
        ok = wait_all_ran(http_app, ["f"], slot, end_ms, timeout=15)
        if how == "stop":
            time.sleep(max(0.0, slot / 1000 + 2.0 - time.time()))
            for name in chosen:
                proc = by_name[name].proc
                assert proc is not None
                proc.send_signal(signal.SIGCONT)
            time.sleep(2.0)  # its late claim of the slot is made (and loses)
        alive = [p for p in running if p.name not in chosen or how == "stop"]
        fallback = metric_sum(alive, "anarchon_claims_deferred_total", {"outcome": "fallback"})
    assert ok, f"slots not run: {tally(http_app, ['f'], slot, end_ms).missing}"
    check_once(http_app, ["f"], max(start_ms, slot - 1000), end_ms, nats_server.url)
    runs = runs_by_slot(http_app, "f")
    assert runs[slot] == 1
    request = next(r for r in http_app.requests if int(r.headers["X-Anarchon-Slot"]) == slot)
    delay = request.at - slot / 1000
    runner = request.headers["X-Anarchon-Instance"]
    figures.report(
        f"candidates-gone-k{k}-{how}",
        sidecars=n,
        candidates=",".join(chosen),
        gone_before_slot_s=round(slot / 1000 - gone_at, 3),
        runner=runner,
        start_delay_s=round(delay, 3),
        fallbacks=int(fallback),
    )
    assert runner not in chosen
    # jitter (300ms) + fallback (700ms) + the claim; max_late is 5 s.
    assert 0.7 <= delay < 5.0, delay
    assert fallback >= 1


def test_rolling_change_of_candidates(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    """Half the fleet with candidates on (k=1), half still off, as in the middle of a
    rolling change: every slot runs once; a slot costs the 2 old replicas' claims and
    at most the one candidate's among the new (when it is one of the new)."""
    seconds = 8
    names = ["r0", "r1"]
    on = config([nats_server.url], http_app, [candidates_job(name, 1) for name in names])
    off = config([nats_server.url], http_app, [every_second(name) for name in names])
    fleet = [("new0", on, {}), ("new1", on, {}), ("old0", off, {}), ("old1", off, {})]
    with sidecars(tmp_path, fleet) as running, WireCount(nats_server.url) as wire:
        wait_fleet(running, 4)
        start_ms = next_second_ms() + 1000
        end_ms = start_ms + (seconds - 1) * 1000
        assert wait_all_ran(http_app, names, start_ms, end_ms, timeout=seconds + 15)
        time.sleep(1.5)
        codes = [p.terminate() for p in running]
    result = check_once(http_app, names, start_ms, end_ms, nats_server.url)
    per_slot = wire.per_slot(names, start_ms, end_ms)
    every = ["new0", "new1", "old0", "old1"]
    expected = [
        2 + sum(1 for i in rank(job, slot, every, 1) if i.startswith("new"))
        for job in names
        for slot in range(start_ms, end_ms + 1, 1000)
    ]
    figures.report(
        "candidates-rolling",
        sidecars=4,
        slots=result.slots,
        doubles=len(result.doubles),
        misses=result.misses,
        claims_per_slot=round(sum(per_slot) / len(per_slot), 2),
        expected_per_slot=round(sum(expected) / len(expected), 2),
    )
    assert codes == [0] * 4
    # A fallback claim now and then (a lease seen late) is allowed, not more.
    assert sum(per_slot) <= sum(expected) + len(per_slot) // 4, (per_slot, expected)
    assert all(n >= e for n, e in zip(per_slot, expected, strict=True)), (per_slot, expected)
