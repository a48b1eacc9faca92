"""A slot's fate, the pure parts: the view's timeline of pause/skip changes judged at a
slot's instant, what ``skip`` keeps, and what ``resume --catchup`` may run.

The fleet-wide proof (three sidecars, operators around the instants, 200
rounds each) is tests/reliability/test_fate.py.
"""

from __future__ import annotations

import json
from typing import Any

from sidecar.core.wire import claim_msg_id
from sidecar.run.backfill import fate_verdict
from sidecar.run.skips import skip_record_id
from sidecar.store.state import TIMELINE_MAX, View

T = 1_800_000_000.0  # server time, epoch s


def put(view: View, key: str, value: dict[str, Any] | None, at: float, rev: list[int]) -> None:
    rev[0] += 1
    data = None if value is None else json.dumps(value).encode()
    view.apply(key, data, rev[0], value is None, "DEL" if value is None else None, at)


def test_a_change_applies_to_slots_after_it_was_stored_never_before() -> None:
    view, rev = View(synced=True), [0]
    put(view, "paused.j", {"by": "a"}, T + 10.0, rev)
    put(view, "paused.j", None, T + 20.0, rev)  # resume: a delete marker
    assert view.at_instant("paused.j", T + 9.999) == (True, None)  # created while watched
    assert view.at_instant("paused.j", T + 10.0) == (True, None)  # stored at the instant: not
    assert view.at_instant("paused.j", T + 10.001) == (True, {"by": "a"})
    assert view.at_instant("paused.j", T + 20.0) == (True, {"by": "a"})
    assert view.at_instant("paused.j", T + 20.001) == (True, None)
    assert view.last_time == T + 20.0


def test_what_a_fresh_read_cannot_tell_is_not_known() -> None:
    """A view that first saw the key at t (a start, a re-read) knows nothing before t."""
    view, rev = View(synced=False), [0]
    put(view, "skip.j", {"slots": [1]}, T + 5.0, rev)
    assert view.at_instant("skip.j", T + 4.0) == (False, None)
    assert view.at_instant("skip.j", T + 6.0) == (True, {"slots": [1]})
    assert view.at_instant("skip.other", T) == (True, None)  # never seen: absent


def test_the_timeline_is_bounded_and_keeps_the_last_change_before_its_horizon() -> None:
    view, rev = View(synced=True), [0]
    view.keep_seconds = 10.0
    for i in range(200):
        put(view, "skip.j", {"slots": [i]}, T + i, rev)
    timeline = view.timelines["skip.j"]
    assert len(timeline) <= TIMELINE_MAX
    assert timeline[0][0] <= T + 199 - 10.0  # the value in force at the horizon is kept
    assert view.at_instant("skip.j", T + 195.5) == (True, {"slots": [195]})


def test_a_skip_record_is_the_slots_own_claim_id() -> None:
    assert skip_record_id("j", 1000) == claim_msg_id("j", 1000, "tok", manual=False) == "j:1000"


def claims(*bodies: dict[str, Any]) -> list[tuple[int, str, bytes]]:
    return [
        (i + 1, "cron.j.claims", json.dumps({"job": "j", **b}).encode())
        for i, b in enumerate(bodies)
    ]


def test_resume_catchup_runs_a_paused_slot_never_one_that_ran() -> None:
    msgs = claims(
        {"slot": 1000, "token": "a"},
        {"slot": 2000, "token": "b", "skipped": "paused"},
        {"slot": 3000, "token": "c", "skipped": "skip"},
        {"slot": 4000, "token": "d", "backfill": "b"},  # a backfill run is not a fate
        {"slot": 5000, "token": "e", "attempt": 2},  # a retry is not either
    )
    assert fate_verdict(msgs, "cron.", "j", 1000) == "it ran (or was claimed) as scheduled"
    assert fate_verdict(msgs, "cron.", "j", 2000) is None
    assert fate_verdict(msgs, "cron.", "j", 3000) == "it was skipped (skip)"
    assert fate_verdict(msgs, "cron.", "j", 4000) is None  # no fate, older claims kept
    assert fate_verdict(msgs, "cron.", "j", 5000) is None
    # Nothing stored before the slot any more: its record may have been trimmed.
    assert fate_verdict(msgs[2:], "cron.", "j", 1500) == (
        "its record may have been trimmed from the stream"
    )
    assert fate_verdict([], "cron.", "j", 1500) is None
