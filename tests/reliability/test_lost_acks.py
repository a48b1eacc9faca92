"""Lost and late claim acks: a proxy between one sidecar and NATS drops or holds them.

The sidecar's claim is stored but its ack never comes (or comes after
ack_timeout); it asks again with the same msg id and token, gets a duplicate
ack, reads the stored claim, finds its own token and runs the slot, once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.reliability.conftest import Figures
from tests.reliability.helpers import (
    claims_and_results,
    config,
    every_second,
    metric_total,
    slot_of,
    unclaimed_runs,
)
from tests.reliability.proxy import AckProxy
from tests.support import NatsServer, RecordingApp, read_stream, sidecars, wait_for

DROP = 4
DELAY = 4


def test_lost_and_late_claim_acks(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    proxy = AckProxy(nats_server.port, drop=DROP, delay=DELAY, hold=1.2).start()
    try:
        job = every_second("tick", jitter="0s")
        direct = config([nats_server.url], http_app, [job])
        victim = config([proxy.url], http_app, [job], ack_timeout="500ms")
        procs = [
            # The others 0.5 s behind, so the victim's claim is usually stored first; its
            # ack is what gets lost. (Not the victim ahead: a sidecar judges a slot once the
            # server's clock has reached it, docs/GUARANTEES.md "One fate per slot".)
            ("victim", victim, {}),
            ("other1", direct, {"ANARCHON_CLOCK_OFFSET": "-0.5"}),
            ("other2", direct, {"ANARCHON_CLOCK_OFFSET": "-0.5"}),
        ]
        with sidecars(tmp_path, procs) as running:
            wait_for(lambda: len(proxy.tampered) == DROP + DELAY, 30, what="acks tampered")
            tampered = proxy.tampered
            tampered_slots = {int(msg_id.split(":")[1]) for msg_id in tampered}
            wait_for(
                lambda: tampered_slots <= {slot_of(r) for r in http_app.requests},
                15,
                what="the tampered slots to run",
            )
            duplicate_acks = metric_total(running[0], "anarchon_claim_duplicate_acks_total")
            codes = [p.terminate() for p in running]
    finally:
        proxy.stop()

    stored = read_stream(nats_server.url)
    unclaimed = unclaimed_runs(stored, http_app.requests)
    claims, results = claims_and_results(stored)
    stored_by_slot = {m.data["slot"]: m.data for m in claims}
    runs = Counter(slot_of(r) for r in http_app.requests)
    runner = {slot_of(r): r.headers["X-Anarchon-Instance"] for r in http_app.requests}
    victim_first = [s for s in tampered_slots if stored_by_slot[s]["instance"] == "victim"]
    recognised = [s for s in victim_first if runs[s] == 1 and runner[s] == "victim"]
    result_of = {m.data["token"]: m.data for m in results}
    figures.report(
        "lost-acks",
        dropped=len(proxy.dropped),
        delayed=len(proxy.delayed),
        hold_s=proxy.hold,
        ack_timeout_s=0.5,
        victim_stored_first=len(victim_first),
        recognised_own_win=len(recognised),
        app_requests_per_slot=max(runs.values()),
        victim_duplicate_acks=int(duplicate_acks),
    )
    assert codes == [0, 0, 0]
    assert not unclaimed, unclaimed
    assert max(runs.values()) == 1, "a slot ran twice"
    # Every tampered slot ran exactly once, by whoever's claim was stored.
    for slot in tampered_slots:
        assert runs[slot] == 1, slot
        assert runner[slot] == stored_by_slot[slot]["instance"], slot
    # The victim's retries found its own stored claims: won, not lost.
    assert len(victim_first) >= (DROP + DELAY) // 2, stored_by_slot
    assert recognised == victim_first
    assert duplicate_acks >= len(victim_first)
    for slot in victim_first:
        assert result_of[stored_by_slot[slot]["token"]]["status"] == "succeeded"
