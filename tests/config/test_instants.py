"""An instant an operator types (sidecar/config/instants.py): ``--until``, ``--from``,
``at``'s time and the page's forms, as a table of examples and as properties
over every datetime in every offset (the commands and the page with them:
tests/cli/test_time_edges.py, tests/admin/test_time_edges.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.config.instants import instant_of, until_of
from sidecar.core.bounds import MAX_TIME_S
from sidecar.core.clock import in_range, parse_instant
from tests.support import examples

NOW = 1_796_227_910.0
PROPERTY_NOW = 1_780_000_000.0  # 2026-05-28
OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
# Every datetime in every offset, so both ends of the range in both directions.
AWARE = st.datetimes(min_value=datetime.min, max_value=datetime.max, timezones=OFFSETS)
SETTINGS = settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def text_of(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30m", NOW + 1800),
        ("2h", NOW + 7200),
        ("2026-12-04T12:00:00Z", datetime(2026, 12, 4, 12, tzinfo=UTC).timestamp()),
        ("2026-12-04T13:00:00+01:00", datetime(2026, 12, 4, 12, tzinfo=UTC).timestamp()),
        ("+1m30s", NOW + 90),
    ],
)
def test_until_takes_a_duration_or_an_rfc3339_time(text: str, expected: float) -> None:
    assert until_of(text, NOW) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("2026-12-04T12:00:00", "has no offset"),
        ("2020-01-01T00:00:00Z", "is in the past"),
        ("-5m", "is in the past"),
        ("soon", "neither an RFC 3339 time"),
        ("0s", "not in the future"),
    ],
)
def test_until_refuses_what_it_cannot_use(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        until_of(text, NOW)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2h", NOW - 7200),
        ("24h", NOW - 86400),
        ("0s", NOW),
        ("-30m", NOW - 1800),
        ("2026-12-04T12:00:00Z", datetime(2026, 12, 4, 12, tzinfo=UTC).timestamp()),
    ],
)
def test_backfill_instants_count_durations_back_from_now(text: str, expected: float) -> None:
    assert instant_of(text, NOW, back=True) == expected


@SETTINGS
@given(AWARE)
def test_an_rfc3339_time_is_an_instant_in_range_or_a_value_error(dt: datetime) -> None:
    text = text_of(dt)
    at = (dt - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()
    try:
        got = parse_instant(text)
    except ValueError as exc:
        assert not 0 <= at <= MAX_TIME_S, (text, exc)
        assert "out of range" in str(exc)
    else:
        assert in_range(got) and abs(got - at) < 1e-3


@SETTINGS
@given(AWARE)
def test_pause_until_is_a_future_instant_or_a_value_error(dt: datetime) -> None:
    text = text_of(dt)
    try:
        at = until_of(text, PROPERTY_NOW)
    except ValueError:
        return
    assert PROPERTY_NOW < at <= MAX_TIME_S


@SETTINGS
@given(st.integers(0, 10**12), st.sampled_from(["s", "m", "h", "d", "ms"]))
def test_pause_until_a_duration_is_an_instant_or_a_value_error(amount: int, unit: str) -> None:
    try:
        at = until_of(f"{amount}{unit}", PROPERTY_NOW)
    except ValueError:
        return
    assert PROPERTY_NOW < at <= MAX_TIME_S
