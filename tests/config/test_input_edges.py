"""Input at the edges (issue 48): digits other than ASCII, and instants out of range.

Python's ``\\d``, ``int()`` and ``float()`` read other scripts' digits (Arabic-Indic ``30m`` is
30m to them); every time and duration of the config is ASCII digits only. An
instant the sidecar cannot name (docs/CONFIG.md: 1970 to the end of 9999) is a
config error naming the key, never an OverflowError.
"""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

import pytest

from sidecar.config.fields import parse_duration
from sidecar.config.load import parse_config
from sidecar.core.errors import ConfigError, ScheduleError
from sidecar.when.schedule import parse_schedule
from sidecar.when.slots import parse_exclusion

ARABIC_30 = "\u0663\u0660"  # ٣٠
UTC = ZoneInfo("UTC")


def error_of(**job: Any) -> ConfigError:
    data = {"jobs": [{"name": "sync", "schedule": "*/5 * * * *", **job}]}
    with pytest.raises(ConfigError) as info:
        parse_config(data, {})
    return info.value


@pytest.mark.parametrize(
    "text", [f"{ARABIC_30}m", f"1h{ARABIC_30}m", f"{ARABIC_30}s", "\uff13\uff10s", "1.\u0665s"]
)
def test_durations_take_ascii_digits_only(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(text, "jobs[0].jitter")
    assert info.value.key == "jobs[0].jitter"
    assert error_of(jitter=text).key == "jobs[0].jitter"


@pytest.mark.parametrize(
    "expr", [f"@every {ARABIC_30}m", f"@every 1h offset {ARABIC_30}m", "@every \u0661d"]
)
def test_intervals_take_ascii_digits_only(expr: str) -> None:
    with pytest.raises(ScheduleError):
        parse_schedule(expr, UTC)
    assert error_of(schedule=expr).key == "jobs[0].schedule"


@pytest.mark.parametrize(
    "text",
    [
        "\u0662\u0660\u0662\u0666-12-24",
        "2026-12-24T00:00:00Z/PT\u0666H",
        "2026-12-24T08:00:00.\u0665Z/PT6H",
    ],
)
def test_exclusions_and_instants_take_ascii_digits_only(text: str) -> None:
    with pytest.raises(ValueError):
        parse_exclusion(text, UTC)
    assert error_of(exclude=[text]).key == "jobs[0].exclude[0]"
    if not (start := text.split("/")[0]).isascii():
        assert error_of(start_at=start).key == "jobs[0].start_at"


@pytest.mark.parametrize(
    "text",
    [
        "9999-12-31T23:59:59-14:00",  # year 10000 in UTC: astimezone overflowed
        "0001-01-01T00:00:00+14:00",  # year 0 in UTC
        "1969-12-31T23:59:59Z",
    ],
)
@pytest.mark.parametrize("key", ["start_at", "end_at"])
def test_start_and_end_out_of_range_name_the_range(key: str, text: str) -> None:
    err = error_of(**{key: text})
    assert err.key == f"jobs[0].{key}"
    assert "9999-12-31T23:59:59.999Z" in err.message


def test_start_at_after_the_last_slot_is_a_config_error() -> None:
    err = error_of(start_at="9999-12-31T23:59:59Z")  # hourly: no slot left before 10000
    assert err.key == "jobs[0].start_at"
    assert "10000-01-01" in err.message


@pytest.mark.parametrize("anchor", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"])
def test_an_interval_from_out_of_range_names_the_range(anchor: str) -> None:
    err = error_of(schedule=f"@every 1h from {anchor}")
    assert err.key == "jobs[0].schedule"
    assert "9999-12-31T23:59:59.999Z" in err.message


def test_an_interval_ends_before_the_year_10000() -> None:
    every = parse_schedule("@every 1h from 9999-12-31T23:00:00Z", UTC)
    last = every.next_slot(0)
    with pytest.raises(ScheduleError, match="10000-01-01"):
        every.next_slot(last)
    # A one-off's check on such a schedule: not an instant of it, never a ScheduleError.
    from sidecar.when.atkey import on_schedule

    assert on_schedule(every.next_slot, last + 1000) is False
    assert on_schedule(every.next_slot, last) is True
