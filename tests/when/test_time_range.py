"""Every instant the docs accept is handled: an instant, or a usage error (exit 2, HTTP 400).

datetime names years 1 to 9999 in any offset from -14:00 to +14:00, and
``9999-12-31T23:59:59-14:00`` is in the year 10000 in UTC: converting it
overflowed (``pause --until`` and the page's pause ended in a traceback or a
dropped connection; so did ``backfill --from 0001-01-01T00:00:00+14:00`` and
the eighth ``skip --count 1000`` of a yearly job). Property-based tests walk
the whole range for each input; the real ones check the exit codes and the
HTTP status against a real nats-server.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import cast
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.config.instants import until_of
from sidecar.config.load import JobConfig
from sidecar.core.bounds import MAX_SLOT_MS, MAX_TIME_S
from sidecar.core.clock import in_range, parse_instant
from sidecar.core.errors import ScheduleError
from sidecar.when.backfillrange import backfill_slots
from sidecar.when.slots import parse_calendar, parse_exclusion
from tests.admin.test_page import TOKEN, request
from tests.support import (
    NatsServer,
    RecordingApp,
    base,
    cli_config,
    job,
    run_cli,
    sidecars,
    wait_for,
)

OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
# Every datetime in every offset, so both ends of the range in both directions.
AWARE = st.datetimes(min_value=datetime.min, max_value=datetime.max, timezones=OFFSETS)
ZONES = st.sampled_from(
    [ZoneInfo(z) for z in ("UTC", "Pacific/Kiritimati", "Etc/GMT+12", "America/New_York")]
)
SCHEDULES = st.sampled_from(["0 0 1 1 *", "* * * * *", "*/7 * * * * *", "0 3 29 2 *"])
NOW = 1_780_000_000.0  # 2026-05-28
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EDGES = ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"]
LAST = "9999-12-31T23:59:59.999Z"  # the last instant in range: accepted


def text_of(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


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
        at = until_of(text, NOW)
    except ValueError:
        return
    assert NOW < at <= MAX_TIME_S


@SETTINGS
@given(st.integers(0, 10**12), st.sampled_from(["s", "m", "h", "d", "ms"]))
def test_pause_until_a_duration_is_an_instant_or_a_value_error(amount: int, unit: str) -> None:
    try:
        at = until_of(f"{amount}{unit}", NOW)
    except ValueError:
        return
    assert NOW < at <= MAX_TIME_S


@SETTINGS
@given(st.dates(min_value=date.min, max_value=date.max), ZONES)
def test_every_date_is_an_exclusion(day: date, tz: ZoneInfo) -> None:
    exclusion = parse_exclusion(day.isoformat(), tz)
    assert exclusion.start_ms < exclusion.end_ms
    assert 22 * 3_600_000 <= exclusion.end_ms - exclusion.start_ms <= 26 * 3_600_000


@SETTINGS
@given(AWARE, AWARE | st.integers(1, 10**7).map(lambda s: f"PT{s}S"), ZONES, st.booleans())
def test_every_interval_is_an_exclusion_or_a_value_error(
    start: datetime, end: datetime | str, tz: ZoneInfo, naive: bool
) -> None:
    first = start.replace(tzinfo=None).isoformat() if naive else text_of(start)
    second = end if isinstance(end, str) else text_of(end)
    try:
        exclusion = parse_exclusion(f"{first}/{second}", tz)
    except ValueError:
        return
    assert exclusion.start_ms < exclusion.end_ms


@SETTINGS
@given(SCHEDULES, ZONES, st.integers(0, MAX_SLOT_MS), st.integers(1, 1000))
def test_runs_are_slots_in_range_or_a_schedule_error(
    expr: str, tz: ZoneInfo, after: int, count: int
) -> None:
    calendar = parse_calendar(expr, tz, exclude=["9999-12-31", "1970-01-01"])
    try:
        runs = calendar.runs(after, count)
    except ScheduleError:
        return
    assert len(runs) == count and all(after < s <= MAX_SLOT_MS + 14 * 3_600_000 for s in runs)


@SETTINGS
@given(SCHEDULES, ZONES, st.integers(0, MAX_SLOT_MS), st.integers(0, MAX_SLOT_MS))
def test_backfill_slots_are_slots_or_a_value_error(expr: str, tz: ZoneInfo, a: int, b: int) -> None:
    spec = cast(JobConfig, SimpleNamespace(name="j", schedule=parse_calendar(expr, tz)))
    try:
        found = backfill_slots(spec.schedule, min(a, b), max(a, b))
    except ValueError:
        return
    assert all(min(a, b) <= s <= max(a, b) for s in found)


# ------------------------------------------------------------------- real processes


def test_edge_times_are_usage_errors_on_the_command_line(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("yearly", schedule="0 0 1 1 *")])
    cfg = cli_config(tmp_path, config)
    for until in EDGES:
        done = run_cli("pause", "yearly", "-c", cfg, "--until", until)
        assert done.returncode == 2, done.stderr
        assert "out of range" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("pause", "yearly", "-c", cfg, "--until", LAST)
    assert done.returncode == 0 and "9999-12-31" in done.stdout, done.stderr
    for edge in EDGES:
        for args in (("--from", edge, "--to", "2026-01-01T00:00:00Z"), ("--from", edge)):
            done = run_cli("backfill", "yearly", "-c", cfg, *args, "--to", edge)
            assert done.returncode == 2, done.stderr
            assert "Traceback" not in done.stderr
    # About 8,000 years of a yearly job are left: the eighth 1,000 does not fit.
    codes = []
    for _ in range(9):
        done = run_cli("skip", "yearly", "-c", cfg, "--count", "1000")
        assert "Traceback" not in done.stderr, done.stderr
        codes.append(done.returncode)
        if done.returncode:
            break
    assert codes[-1] == 2 and set(codes[:-1]) == {0}, codes
    assert "fewer than 1000 runs" in done.stderr


def test_edge_times_are_400_on_the_page_api(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"alice:{TOKEN}\n")
    config = base(nats_server, http_app, [job("yearly", schedule="0 0 1 1 *", jitter="1s")])
    config["admin"] = {"token_file": str(token_file)}
    good = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    with sidecars(tmp_path, [("s0", config, {})]) as procs:
        for until in EDGES:
            body = json.dumps({"until": until}).encode()
            code, _, answer = request(procs[0], "/api/v1/jobs/yearly/pause", "POST", body, good)
            assert code == 400, answer
            assert b"out of range" in answer
        body = json.dumps({"until": LAST}).encode()
        code, _, answer = request(procs[0], "/api/v1/jobs/yearly/pause", "POST", body, good)
        # Float seconds hold that far ahead to some 30 us: the last millisecond may show .998.
        assert code == 200, answer
        assert json.loads(answer)["pause"]["until"].startswith("9999-12-31T23:59:59.99"), answer
        codes = []
        for _ in range(9):
            body = json.dumps({"count": 1000}).encode()
            code, _, answer = request(procs[0], "/api/v1/jobs/yearly/skip", "POST", body, good)
            codes.append(code)
            if code != 200:
                break
        assert codes[-1] == 400 and set(codes[:-1]) == {200}, (codes, answer)
        assert b"fewer than 1000 runs" in answer
        wait_for(lambda: procs[0].get("/readyz")[0] == 200, 5, what="still ready")
    assert "OverflowError" not in procs[0].log() and "Traceback" not in procs[0].log()
