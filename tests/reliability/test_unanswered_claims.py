"""Claims that get no definite answer before their deadline still leave one fate per slot.

Three sidecars claim a job due every second (``max_late: 1s``); the nats-server
is frozen (SIGSTOP) from just after one slot for about three seconds, so the
claims of the next two slots go out into its sockets and get no answer before
slot + max_late: every sidecar gives them up (``anarchon_claim_errors_total``)
and none runs them. When the server resumes it stores what was waiting in its
sockets: one claim per slot, whose sidecar had given up on it. This is the
10,000-job burst's "no definite answer before the deadline" (bench/burst.py),
made small and deterministic.

What the stream must hold afterwards, for every slot of the window
(docs/GUARANTEES.md, "One fate per slot"): exactly one fate message (the claim
or skip record stored with ``<job>:<slot>``) and exactly one result for it; a
slot the app never got has a ``skipped`` result saying why; and ``history``
shows each such slot so, never ``running`` (a claim nobody runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tests.reliability.conftest import Figures
from tests.reliability.helpers import (
    claims_and_results,
    config,
    every_second,
    metric_sum,
    metric_total,
    next_second_ms,
    runs_by_slot,
    unclaimed_runs,
    wait_all_ran,
)
from tests.support import (
    NatsServer,
    RecordingApp,
    StoredMsg,
    cli_config,
    read_stream,
    run_cli,
    sidecars,
    wait_for,
)

JOB = "tick"
MAX_LATE = 1.0
# From this long after a slot's instant (its claims decided) the server is frozen ...
FREEZE_AFTER = 0.4
# ... until every sidecar gave up this many slots; well within the connections'
# stale-ping limit (about 6 s, sidecar/store/connection.py), so nobody reconnects.
FROZEN_SLOTS = 2
FREEZE_MAX = 4.5
TTL = 2.0
# The questions of the slots' fates are spread over this long (sidecar/run/unanswered.py).
SPREAD = 5.0


def process_state(pid: int) -> str:
    """The state letter of a process (``T`` when stopped), from procfs."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def fates(stored: list[StoredMsg], job: str, slots: range) -> dict[int, list[str]]:
    """What is wrong with each slot's fate in the stream (no entry: one fate, one result).

    A slot's fate message is the claim (or skip record) stored with ``<job>:<slot>``;
    its result is the result record carrying the same token.
    """
    claims, results = claims_and_results(stored)
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in claims:
        by_id[m.headers.get("Nats-Msg-Id", "")].append(m.data)
    results_of = Counter(m.data.get("token") for m in results)
    wrong: dict[int, list[str]] = {}
    for slot in slots:
        stored_claims = by_id.get(f"{job}:{slot}", [])
        problems = []
        if len(stored_claims) != 1:
            problems.append(f"{len(stored_claims)} fate messages")
        for claim in stored_claims:
            count = results_of[claim.get("token")]
            if count != 1:
                problems.append(f"{count} results for the claim of {claim.get('instance')}")
        if problems:
            wrong[slot] = problems
    return wrong


def test_claims_without_an_answer_by_the_deadline_leave_one_fate_per_slot(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    assert nats_server.proc is not None
    pid = nats_server.proc.pid
    job = every_second(JOB, jitter="0s", max_late=f"{MAX_LATE:g}s")
    # A short lease_ttl: the claim window's judges look at the stored claims that lost
    # (sidecar/run/claimwindow.py) within the test, and must not record them again.
    cfg = config([nats_server.url], http_app, [job], ack_timeout="300ms", lease_ttl=f"{TTL:g}s")
    with sidecars(tmp_path, [(f"s{i}", cfg, {}) for i in range(3)]) as running:
        start = next_second_ms() + 1000
        assert wait_all_ran(http_app, [JOB], start, start + 1000, timeout=15)

        freeze_at = next_second_ms() / 1000 + FREEZE_AFTER
        time.sleep(max(0.0, freeze_at - time.time()))
        os.kill(pid, signal.SIGSTOP)
        frozen_at = time.time()
        try:
            wait_for(lambda: process_state(pid) == "T", 2, what="nats-server stopped")
            # Every sidecar gave up the claims of the next slots: no answer by the deadline.
            wait_for(
                lambda: all(
                    metric_total(p, "anarchon_claim_errors_total") >= FROZEN_SLOTS for p in running
                ),
                FREEZE_MAX,
                interval=0.1,
                what=f"every sidecar to give up {FROZEN_SLOTS} claims",
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        thawed_at = time.time()
        end = next_second_ms(thawed_at) + 2000
        assert wait_all_ran(http_app, [JOB], end - 1000, end, timeout=15)
        window = range(start, end + 1, 1000)
        # Each slot's fate is in the stream once the sidecars have said it.
        with contextlib.suppress(AssertionError):  # asserted below, with what is wrong
            wait_for(
                lambda: not fates(read_stream(nats_server.url), JOB, window),
                20,
                interval=0.5,
                what="one fate and one result for every slot",
            )
        # Past the judges' look (lease_ttl after the questions' answers, and a margin).
        time.sleep(max(0.0, thawed_at + SPREAD + 3 * TTL - time.time()))
        errors = metric_sum(running, "anarchon_claim_errors_total")
        judged = metric_sum(running, "anarchon_runs_lost_total")
        unanswered = metric_sum(
            running, "anarchon_runs_skipped_total", {"job": JOB, "reason": "unanswered"}
        )
        codes = [p.terminate() for p in running]

    stored = read_stream(nats_server.url)
    wrong = fates(stored, JOB, window)
    ran = runs_by_slot(http_app, JOB)
    frozen = [s for s in window if frozen_at * 1000 < s < thawed_at * 1000 and not ran[s]]
    history = run_cli("history", JOB, "-c", cli_config(tmp_path, cfg), "--json", "--limit", "1000")
    assert history.returncode == 0, history.stderr
    shown = {row["slot"]: row for row in map(json.loads, history.stdout.splitlines())}
    figures.report(
        "unanswered-claims",
        frozen_s=round(thawed_at - frozen_at, 2),
        slots=len(window),
        not_run=len(frozen),
        claim_errors=int(errors),
        skipped_unanswered=int(unanswered),
        without_one_fate=len(wrong),
        doubles=sum(1 for n in ran.values() if n > 1),
        judged_lost=int(judged),
    )
    assert codes == [0, 0, 0]
    assert max(ran.values()) == 1, "a slot ran twice"
    assert not unclaimed_runs(stored, http_app.requests)
    assert len(frozen) >= FROZEN_SLOTS, (frozen, sorted(ran))
    assert not wrong, f"slots without exactly one fate and one result: {wrong}"
    # Counted once per slot, by the sidecar whose record is the slot's fate.
    assert unanswered == len(frozen), (unanswered, frozen)
    assert judged == 0, "a stored claim recorded by its sidecar was judged lost as well"
    for slot in window:
        row = shown.get(slot)
        assert row is not None, f"slot {slot} missing from history"
        if slot in frozen:
            assert row["status"] == "skipped", row
            assert "no definite answer" in (row.get("error") or ""), row
        else:
            assert row["status"] == "succeeded", row
