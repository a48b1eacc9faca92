"""``@every`` intervals: pure slot maths, the config rules, and three real sidecars
on a real nats-server running an interval's slots once each, anchored to the
epoch (or ``offset``/``from``), never to when a process started."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from sidecar.config.load import parse_config
from sidecar.core.errors import ConfigError, ScheduleError
from sidecar.when.schedule import Interval, parse_schedule
from sidecar.when.slots import parse_calendar
from tests.support import (
    NatsServer,
    RecordingApp,
    base,
    cli_config,
    job,
    run_cli,
    sidecars,
    slots,
    wait_for,
)

UTC_ZONE = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")
REF = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def parse(jobs: list[dict[str, Any]], **top: Any) -> Any:
    return parse_config({"nats": {"servers": "nats://127.0.0.1:4222", **top}, "jobs": jobs}, {})


# ---------------------------------------------------------------- slot maths


def test_every_is_anchored_to_the_epoch_whatever_the_instant_asked_from() -> None:
    sched = parse_schedule("@every 90m", UTC_ZONE)
    assert isinstance(sched, Interval)
    step = 90 * 60_000
    for after in (0, REF - 1, REF + 1, REF + 12_345_678, 1_999_999_999_999):
        slot = sched.next_slot(after)
        assert slot % step == 0 and after < slot <= after + step
    assert sched.slots(REF - 1, 3) == [REF, REF + step, REF + 2 * step]
    assert sched.min_interval_ms() == sched.interval_floor_ms() == step


def test_offset_shifts_the_grid_like_a_temporal_interval_phase() -> None:
    sched = parse_schedule("@every 1h offset 15m", UTC_ZONE)
    assert sched.slots(REF, 2) == [REF + 15 * 60_000, REF + 75 * 60_000]
    # Whitespace and the job's timezone change nothing: intervals are absolute time.
    assert parse_schedule("  @every  1h   offset 15m ", BERLIN).slots(REF, 2) == sched.slots(REF, 2)


def test_from_starts_the_grid_at_an_instant_with_no_slot_before() -> None:
    sched = parse_schedule("@every 7s from 2026-01-01T00:00:03Z", UTC_ZONE)
    assert sched.next_slot(0) == REF + 3000  # nothing before the anchor
    assert sched.slots(REF + 3000, 2) == [REF + 10_000, REF + 17_000]
    # Without an offset, the instant is a wall time in the job's timezone (CET: +1h).
    local = parse_schedule("@every 1d from 2026-01-01T06:00:00", BERLIN)
    assert local.next_slot(0) == REF + 5 * 3_600_000


def test_an_interval_across_dst_keeps_its_period_in_absolute_time() -> None:
    # 2026-03-29 01:00Z Berlin springs forward: an hourly interval does not care.
    cal = parse_calendar("@every 1h", BERLIN)
    spring = 1_774_746_000_000  # 2026-03-29T01:00:00Z
    run = cal.slots(spring - 3 * 3_600_000, 6)
    assert all(b - a == 3_600_000 for a, b in itertools.pairwise(run))


def test_intervals_mix_with_cron_exclusions_spread_and_previous_slot() -> None:
    cal = parse_calendar(
        ["@every 20m", "0 * * * *"],
        UTC_ZONE,
        job="mix",
        exclude=["2026-01-01T00:40:00Z/PT1M"],
    )
    # :00 is shared by both (one slot); :40 is excluded from runs but is a slot.
    assert cal.slots(REF - 1, 4) == [REF, REF + 1_200_000, REF + 2_400_000, REF + 3_600_000]
    assert cal.runs(REF - 1, 3) == [REF, REF + 1_200_000, REF + 3_600_000]
    assert cal.previous_slot(REF + 1_200_000) == REF
    yearly = parse_calendar("@every 365d", UTC_ZONE)
    first = yearly.next_slot(REF)
    assert yearly.previous_slot(first) == first - 365 * 86_400_000
    assert cal.min_interval_ms() == 1_200_000
    assert "'@every' (an interval)" in cal.unportable()
    spread = parse_calendar("@every 10m", UTC_ZONE, job="s", spread=60.0)
    assert spread.slots(REF - 1, 1)[0] % 600_000 == spread.offset_ms


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("@every", "expected '@every <interval>'"),
        ("@every 90", "not an interval"),
        ("@every 500ms", "not an interval"),
        ("@every 0s", "at least 1s"),
        ("@every 366d", "at most 365d"),
        ("@every 1h offset 1h", "shorter than the interval"),
        ("@every 1h from yesterday", "not an ISO 8601"),
        ("@every 1h from 2026-01-01T00:00:00.5Z", "whole seconds"),
        ("@every 1h sometimes 5m", "expected '@every <interval>'"),
    ],
)
def test_bad_intervals_say_why(expr: str, fragment: str) -> None:
    with pytest.raises(ScheduleError) as info:
        parse_schedule(expr, UTC_ZONE)
    assert fragment in str(info.value)


def test_config_names_the_key_and_applies_the_window_rules_to_the_interval() -> None:
    with pytest.raises(ConfigError) as info:
        parse([{"name": "a", "schedule": ["* * * * *", "@every 5x"]}])
    assert info.value.key == "jobs[0].schedule[1]"
    # spread must stay below the interval
    with pytest.raises(ConfigError) as info:
        parse([{"name": "a", "schedule": "@every 30s", "spread": "30s"}])
    assert info.value.key == "jobs[0].spread" and "shortest interval (30s)" in str(info.value)
    # history_size x interval must cover jitter + max_late (the duplicate memory rule)
    with pytest.raises(ConfigError) as info:
        parse([{"name": "a", "schedule": "@every 1s", "max_late": "5s"}], history_size=4)
    assert info.value.key == "nats.history_size" and "shortest interval 1s" in str(info.value)
    # jitter + max_late must stay below the duplicate window, whatever the schedule
    with pytest.raises(ConfigError) as info:
        parse([{"name": "a", "schedule": "@every 1h", "max_late": "10m"}])
    assert info.value.key == "jobs[0].jitter"
    ok = parse([{"name": "a", "schedule": "@every 90m offset 5m"}]).jobs[0]
    assert ok.schedule.identity == "@every 90m offset 5m"


# ---------------------------------------------------------------- fleet behaviour


def test_three_sidecars_run_each_interval_slot_once_on_the_epoch_grid(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(
        nats_server,
        http_app,
        [
            job("ev", schedule="@every 3s offset 1s"),
            job("mixed", schedule=["@every 2s", "*/3 * * * * *"], timezone="Asia/Kolkata"),
        ],
    )
    cfg = cli_config(tmp_path, config)
    checked = run_cli("check", "-c", cfg)
    assert checked.returncode == 0, checked.stderr
    assert "schedule '@every 3s offset 1s': Every 3s, counted from the Unix epoch + 1s" in (
        checked.stdout
    )
    nexts = [ln for ln in checked.stdout.splitlines() if ln.strip().startswith("next:")][:3]
    assert len(nexts) == 3
    # Started one after the other: a grid counted from each process's start would differ.
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]):
        wait_for(lambda: len(set(slots(http_app, "/jobs/ev"))) >= 6, 40, what="six ev runs")
        wait_for(lambda: len(set(slots(http_app, "/jobs/mixed"))) >= 8, 20, what="mixed runs")
        done = run_cli("status", "-c", cfg, "--json")
        assert done.returncode == 0, done.stderr
        view = next(j for j in json.loads(done.stdout)["jobs"] if j["name"] == "ev")
        assert view["schedules"] == [
            {"cron": "@every 3s offset 1s", "text": "Every 3s, counted from the Unix epoch + 1s"}
        ]
        nxt = datetime.fromisoformat(view["next_slot"].replace("Z", "+00:00"))
        assert nxt.timestamp() % 3 == 1
        table = run_cli("status", "-c", cfg).stdout
        assert "ev: schedule '@every 3s offset 1s'" in table
    ev = slots(http_app, "/jobs/ev")
    assert max(Counter(ev).values()) == 1, "an interval slot ran twice"
    assert all(s % 3000 == 1000 for s in ev), ev
    # No hole: consecutive slots of the grid, from the first run to the last.
    ordered = sorted(ev)
    assert ordered == list(range(ordered[0], ordered[-1] + 1, 3000)), ordered
    mixed = slots(http_app, "/jobs/mixed")
    assert max(Counter(mixed).values()) == 1
    assert all(s % 2000 == 0 or s % 3000 == 0 for s in mixed)
    assert any(s % 2000 == 0 and s % 3000 != 0 for s in mixed)
    assert any(s % 3000 == 0 and s % 2000 != 0 for s in mixed)


def test_catchup_latest_runs_a_missed_interval_slot_once(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """A fleet started just after a slot of a long interval catches that slot up."""
    # The stream exists first: a slot dated before its creation is never claimed.
    with sidecars(tmp_path, [("first", base(nats_server, http_app, [job("warm")]), {})]):
        wait_for(lambda: slots(http_app, "/jobs/warm"), 20, what="the stream in use")
    anchor = int(datetime.now(UTC).timestamp()) + 1  # after the stream's creation
    wait_for(lambda: datetime.now(UTC).timestamp() > anchor + 1.5, 5, what="the slot passed")
    stamp = datetime.fromtimestamp(anchor, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = base(
        nats_server,
        http_app,
        [job("hourly", schedule=f"@every 1h from {stamp}", catchup="latest", max_late="1m")],
    )
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]):
        wait_for(lambda: slots(http_app, "/jobs/hourly"), 30, what="the caught-up slot")
        request = http_app.requests_for("/jobs/hourly")[0]
        assert request.headers["X-Anarchon-Trigger"] == "catchup"
    assert slots(http_app, "/jobs/hourly") == [anchor * 1000]


def test_the_history_rule_sees_a_union_gap_shorter_than_either_schedule() -> None:
    # :00 of every hour and 30 s after it: 30 s apart, though neither repeats within a minute.
    cal = parse_calendar(["0 * * * *", "@every 1h offset 30s"], UTC_ZONE)
    assert cal.interval_floor_ms() <= cal.min_interval_ms() == 30_000
    with pytest.raises(ConfigError) as info:
        parse(
            [{"name": "a", "schedule": ["0 * * * *", "@every 1h offset 30s"], "max_late": "1m"}],
            history_size=2,
        )
    assert info.value.key == "nats.history_size" and "shortest interval 30s" in str(info.value)
    # A union with an interval that begins later is sampled from its beginning.
    late = parse_calendar(["0 * * * *", "@every 1h from 2031-01-01T00:00:10Z"], UTC_ZONE)
    assert late.min_interval_ms() == 10_000
