"""Contention: many sidecars race for every slot of many jobs; each slot runs exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.reliability.conftest import Figures
from tests.reliability.helpers import (
    claims_and_results,
    config,
    every_second,
    lateness,
    metric_sum,
    next_second_ms,
    tally,
    unclaimed_runs,
    wait_all_ran,
)
from tests.support import NatsServer, RecordingApp, read_stream, sidecars


def contention(
    tmp_path: Path,
    nats: NatsServer,
    app: RecordingApp,
    figures: Figures,
    scenario: str,
    n_sidecars: int,
    n_jobs: int,
    seconds: int,
) -> None:
    names = [f"j{i:02d}" for i in range(n_jobs)]
    cfg = config([nats.url], app, [every_second(name, jitter="500ms") for name in names])
    with sidecars(tmp_path, [(f"s{i}", cfg, {}) for i in range(n_sidecars)]) as running:
        start_ms = next_second_ms() + 1000  # every sidecar is ready by then
        end_ms = start_ms + (seconds - 1) * 1000
        # The window's slots must all have run; the deadline leaves max_late to spare.
        wait_all_ran(app, names, start_ms, end_ms, timeout=seconds + 15)
        won = metric_sum(running, "anarchon_claims_won_total")
        lost = metric_sum(running, "anarchon_claims_lost_total")
        errors = metric_sum(running, "anarchon_claim_errors_total")
        codes = [p.terminate() for p in running]
    result = tally(app, names, start_ms, end_ms)
    requests = list(app.requests)
    stored = read_stream(nats.url)
    unclaimed = unclaimed_runs(stored, requests)
    claimed_tokens = {m.data["token"] for m in claims_and_results(stored)[0]}
    late = lateness(app, names)
    winners = Counter(r.headers["X-Anarchon-Instance"] for r in requests)
    figures.report(
        scenario,
        sidecars=n_sidecars,
        jobs=n_jobs,
        seconds=seconds,
        slots=result.slots,
        runs=result.runs,
        doubles=len(result.doubles),
        misses=result.misses,
        claims=int(won + lost),
        claim_errors=int(errors),
        winners=len(winners),
        max_start_delay_s=round(max(late), 3),
    )
    assert codes == [0] * n_sidecars
    assert not result.doubles, f"slots ran twice: {result.doubles}"
    assert not result.missing, f"slots never ran: {result.missing[:20]}"
    assert not unclaimed, unclaimed[:20]
    # Every stored (won) claim triggered exactly one request: none lost, none extra.
    assert claimed_tokens == {r.headers["X-Anarchon-Run-Id"] for r in requests}
    assert len(requests) == len(claimed_tokens)
    # The race is real: more than one instance won slots.
    assert len(winners) >= 2, winners


def test_contention_fast(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    """5 sidecars x 10 jobs every second for 10 s."""
    contention(tmp_path, nats_server, http_app, figures, "contention-fast", 5, 10, 10)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_contention_long(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    """10 sidecars x 20 jobs every second for 60 s."""
    contention(tmp_path, nats_server, http_app, figures, "contention", 10, 20, 60)
