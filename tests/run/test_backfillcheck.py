"""The checks of a ``backfill.<job>`` value (sidecar/run/backfillcheck.py), pure.

Whatever the key holds, the check answers (accepted, or HostileBackfill
saying why) and nothing that reads the value raises anything else.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.cli.status_text import schedule_status_lines
from sidecar.config.load import parse_config
from sidecar.core.clock import rfc3339
from sidecar.run.backfill import done_of, running_of, slot_list
from sidecar.run.backfillcheck import HostileBackfill, check_backfill, decode_backfill
from tests.support import examples

NOW = 1_780_000_000.0  # 2026-05-28T20:26:40Z, on the minute + 40 s
JOB = parse_config(
    {
        "nats": {"servers": ["nats://127.0.0.1:4222"]},
        "target": {"url": "http://127.0.0.1:8080"},
        "jobs": [{"name": "m", "schedule": "* * * * *", "exclude": ["2026-05-27"]}],
    },
    {},
).jobs[0]
MINUTE = 60_000
LAST = int(NOW // 60) * MINUTE  # the last slot before NOW


def value(**extra: Any) -> dict[str, Any]:
    return {
        "pending": [LAST - 2 * MINUTE, LAST - MINUTE],
        "running": None,
        "tag": "b",
        "trigger": "backfill",
        "by": "ops@host",
        "at": rfc3339(NOW - 1),
        "done": 0,
        **extra,
    }


def test_what_the_command_writes_is_accepted() -> None:
    check_backfill(JOB, value(), NOW)
    running = {"slot": LAST - 3 * MINUTE, "instance": "s0", "at": rfc3339(NOW)}
    check_backfill(JOB, value(running=running, tag="b1780000000", trigger="catchup"), NOW)
    check_backfill(JOB, value(pending=[]), NOW)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"pending": [LAST + 3_600_000]}, "in the future"),
        ({"pending": [LAST - 30_000]}, "not an instant of the job's schedule"),
        ({"pending": [-MINUTE]}, "not a time in range"),
        ({"pending": [10**20]}, "not a time in range"),
        ({"pending": [True]}, "not a time in range"),
        ({"pending": [LAST - 24 * 60 * MINUTE]}, "excluded"),
        ({"pending": [LAST, LAST]}, "twice"),
        ({"pending": [LAST - m * MINUTE for m in range(1001, 0, -1)]}, "at most 1000"),
        ({"running": {"slot": 10**20, "instance": "x", "at": rfc3339(NOW)}}, "not a time"),
        ({"running": {"slot": LAST}}, "running is not"),
        ({"tag": "x"}, "tag"),
        ({"trigger": "scheduled"}, "trigger"),
        ({"at": rfc3339(NOW + 3600)}, "at is in the future"),
        ({"at": "0001-01-01T00:00:00+14:00"}, "out of range"),
        ({"done": "x"}, "done"),
        ({"by": ""}, "by"),
        ({"note": 1}, "unknown field"),
    ],
)
def test_anything_else_is_hostile_saying_why(change: dict[str, Any], why: str) -> None:
    with pytest.raises(HostileBackfill, match=why):
        check_backfill(JOB, value(**change), NOW)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)
FIELD = st.sampled_from(["pending", "running", "tag", "trigger", "by", "at", "done"])


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(FIELD, JSON) | JSON, st.dictionaries(FIELD, JSON))
def test_no_value_makes_a_reader_fail(raw: Any, overlay: dict[str, Any]) -> None:
    for candidate in (raw, {**value(), **overlay}):
        data = json.dumps(candidate).encode()
        try:
            decoded = decode_backfill(data)
            check_backfill(JOB, decoded, NOW)
        except HostileBackfill:
            pass
        shown = candidate if isinstance(candidate, dict) else None
        job = {
            "name": "m",
            "backfill_pending": len(slot_list(shown)),
            "backfill_running": running_of(shown),
            "backfill_done": done_of(shown),
        }
        schedule_status_lines(job)  # what `status` prints of it
