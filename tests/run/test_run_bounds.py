"""``jobs[].start_at``, ``end_at`` and ``max_runs``: the slot maths, the config keys,
the fleet-wide run count (compare-and-set on a real nats-server), and three real
sidecars that run only the slots inside the bounds, never one more than the cap,
and say why a job runs no more (``check``, ``status``, the page)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from nats.aio.client import Client as NATS

from sidecar.admin import page
from sidecar.config.load import parse_config
from sidecar.core.errors import ConfigError
from sidecar.run import runcap
from sidecar.store.bucketcheck import StateSpec
from sidecar.store.digests import job_hash
from sidecar.store.kv import Keys
from sidecar.store.state import ensure_bucket
from sidecar.when.slots import parse_calendar
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    base,
    cli_config,
    job,
    run_cli,
    sidecars,
    slots,
    wait_for,
)

UTC_ZONE = ZoneInfo("UTC")
REF = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SPEC = StateSpec("T_STATE", 1, 60.0)


def parse(jobs: list[dict[str, Any]]) -> Any:
    return parse_config({"nats": {"servers": "nats://127.0.0.1:4222"}, "jobs": jobs}, {})


def iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- slot maths, config


def test_start_and_end_bound_the_slots_both_ends_included() -> None:
    cal = parse_calendar("*/10 * * * * *", UTC_ZONE, start_ms=REF + 20_000, end_ms=REF + 50_000)
    assert cal.next_slot(REF - 1) == REF + 20_000  # no slot before start_at
    assert cal.runs(REF - 1, 10) == [REF + 20_000 + i * 10_000 for i in range(4)]
    assert cal.between(REF, REF + 3_600_000, 100) == cal.runs(REF - 1, 10)
    assert cal.previous_slot(REF + 20_000) is None
    assert cal.outside(REF + 50_000) is None
    assert cal.outside(REF + 60_000) == "after end_at 2026-01-01T00:00:50Z"
    assert not cal.ended(REF + 49_999) and cal.ended(REF + 50_000)
    assert cal.next_run(REF + 50_000) is None
    assert "start_at=" in cal.identity and "end_at=" in cal.identity


def test_config_reads_instants_in_the_jobs_timezone_and_names_bad_keys() -> None:
    berlin = parse(
        [
            {
                "name": "a",
                "schedule": "@every 1h",
                "timezone": "Europe/Berlin",
                "start_at": "2026-01-01T01:00:00",  # a wall time there: 00:00Z
                "end_at": datetime(2026, 1, 2, tzinfo=UTC),  # YAML's own timestamp
                "max_runs": 3,
            }
        ]
    ).jobs[0]
    assert berlin.schedule.start_ms == REF
    assert berlin.schedule.end_ms == REF + 86_400_000
    assert berlin.max_runs == 3
    day = parse([{"name": "a", "schedule": "* * * * *", "start_at": date(2026, 1, 1)}]).jobs[0]
    assert day.schedule.start_ms == REF
    plain = parse([{"name": "a", "schedule": "* * * * *"}]).jobs[0]
    capped = parse([{"name": "a", "schedule": "* * * * *", "max_runs": 5}]).jobs[0]
    assert plain.max_runs is None and job_hash(plain) != job_hash(capped)
    for extra, key, fragment in [
        ({"start_at": "tomorrow"}, "jobs[0].start_at", "ISO 8601"),
        ({"end_at": "2026-01-01T00:00:00.5Z"}, "jobs[0].end_at", "whole seconds"),
        (
            {"start_at": "2026-02-01T00:00:00Z", "end_at": "2026-01-01T00:00:00Z"},
            "jobs[0].end_at",
            "before start_at",
        ),
        ({"max_runs": 0}, "jobs[0].max_runs", ""),
        ({"end_at": 5}, "jobs[0].end_at", "ISO 8601"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse([{"name": "a", "schedule": "* * * * *", **extra}])
        assert info.value.key == key, extra
        assert fragment in str(info.value)


def test_the_page_says_why_a_job_runs_no_more() -> None:
    row = page.job_row({"name": "j", "ended": "max_runs 3 reached (3 runs counted)"})
    assert "ended" in row and "max_runs 3 reached" in row
    row = page.job_row({"name": "j", "ended": None, "max_runs": 3, "runs_counted": 1})
    assert "1 of max_runs 3 runs" in row


# ---------------------------------------------------------------- the count, real NATS


async def test_concurrent_winners_never_count_past_max_runs(nc: NATS) -> None:
    keys = Keys(await ensure_bucket(nc.jetstream(), SPEC))
    # 40 winners of 40 different slots race for a cap of 7.
    got = await asyncio.gather(
        *(runcap.take(keys, "j", REF + i * 1000, 7, f"i{i}", 0.0) for i in range(40))
    )
    numbers = [n for n in got if n is not None]
    assert sorted(numbers) == list(range(1, 8))
    last = await keys.last(runcap.count_key("j"))
    assert last is not None and last[1] is not None
    assert last[1]["runs"] == 7 and len(last[1]["slots"]) == 7
    # A winner asking again for a slot already counted (its answer lost) gets its number.
    first = last[1]["slots"][0]
    assert await runcap.take(keys, "j", first, 7, "again", 0.0) == 1
    # Full: a further slot is not counted.
    assert await runcap.take(keys, "j", REF + 99_000, 7, "late", 0.0) is None
    # Deleting the key starts the count again (the operator's reset).
    await keys.delete(runcap.count_key("j"), last[0])
    assert await runcap.take(keys, "j", REF + 99_000, 7, "after", 0.0) == 1


# ---------------------------------------------------------------- fleet behaviour


def _next_run(p: Sidecar, name: str) -> float | None:
    return p.metric("anarchon_job_next_run_timestamp_seconds", {"job": name})


def test_three_sidecars_run_only_inside_start_and_end_and_never_past_max_runs(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    start = int(datetime.now(UTC).timestamp()) + 15  # after every sidecar is up
    end = start + 3  # four one-second slots, both ends included
    config = base(
        nats_server,
        http_app,
        [
            job("window", start_at=iso(start), end_at=iso(end)),
            job("capped", max_runs=4),
            job("tick"),
            job("later", start_at=iso(start + 86_400)),
        ],
    )
    cfg = cli_config(tmp_path, config)
    checked = run_cli("check", "-c", cfg)
    assert checked.returncode == 0, checked.stderr
    assert f"start_at {iso(start)}: no slot before it" in checked.stdout
    assert f"end_at {iso(end)}: no slot after it is claimed" in checked.stdout
    window_next = checked.stdout.split("window:", 1)[1].split("capped:", 1)[0]
    assert window_next.count("next:") == 3 and iso(start)[11:19] in window_next
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        # Every sidecar has stopped claiming both jobs (next run 0: no alert fires) ...
        wait_for(
            lambda: all(_next_run(p, n) == 0 for p in procs for n in ("window", "capped")),
            40,
            what="both jobs done on every sidecar",
        )
        # ... and three more slots passed for the fleet: nothing more ran.
        seen = len(set(slots(http_app, "/jobs/tick")))
        wait_for(lambda: len(set(slots(http_app, "/jobs/tick"))) >= seen + 3, 20, what="ticks")
        view = json.loads(run_cli("status", "-c", cfg, "--json").stdout)
        table = run_cli("status", "-c", cfg).stdout
        said = [p.log() for p in procs]
        # The fleet page and its API, served by a sidecar, say the same.
        code, body = procs[1].get("/api/v1/jobs")
        assert code == 200, body
        served = {j["name"]: j for j in json.loads(body)["jobs"]}
        code, html = procs[1].get("/")
        assert code == 200
    jobs = {j["name"]: j for j in view["jobs"]}
    assert jobs["window"]["ended"] == f"end_at {iso(end)} passed"
    assert jobs["window"]["next_slot"] is None and jobs["window"]["next_slots"] == []
    assert jobs["capped"]["ended"].startswith("max_runs 4 reached (4 runs")
    assert jobs["capped"]["runs_counted"] == 4 and jobs["capped"]["max_runs"] == 4
    assert jobs["tick"]["ended"] is None and jobs["tick"]["next_slot"]
    assert f"window runs no more: end_at {iso(end)} passed" in table
    assert served["window"]["ended"] == jobs["window"]["ended"]
    assert served["capped"]["ended"] == jobs["capped"]["ended"]
    assert f'<span class="tag warn">ended</span> runs no more: end_at {iso(end)} passed' in html
    assert "capped runs no more: max_runs 4 reached" in table
    # A job whose start_at is ahead says so in its STATE and on a line of its own.
    assert jobs["later"]["not_started"] == f"no slot before start_at {iso(start + 86_400)}"
    row = next(line for line in table.splitlines() if line.startswith("later "))
    assert row.split()[1:3] == ["NOT", "STARTED"], row
    assert f"later not started: no slot before start_at {iso(start + 86_400)}" in table
    assert slots(http_app, "/jobs/later") == []
    assert all("job capped: no more runs: max_runs 4 reached" in log for log in said)
    window = slots(http_app, "/jobs/window")
    assert sorted(window) == [(start + i) * 1000 for i in range(4)], window
    capped = slots(http_app, "/jobs/capped")
    assert len(capped) == 4 and max(Counter(capped).values()) == 1, capped


def test_a_catch_up_burst_of_three_sidecars_runs_exactly_max_runs(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Missed slots caught up by three sidecars at once: winners of different slots
    count concurrently, and the fleet still runs exactly max_runs of them."""
    with sidecars(tmp_path, [("first", base(nats_server, http_app, [job("warm")]), {})]):
        wait_for(lambda: slots(http_app, "/jobs/warm"), 20, what="the stream in use")
    gone = datetime.now(UTC).timestamp()
    wait_for(lambda: datetime.now(UTC).timestamp() > gone + 8, 10, what="slots missed")
    # The job's own slots from the sidecars' start on are excluded for two minutes:
    # the missed ones are run by the catch-up alone. Else a regular run stored before
    # a loaded sidecar's catch-up read the job's last claim left it nothing missed
    # "since the last run" (CI: 5 regular runs, no catch-up).
    cut = datetime.now(UTC)
    quiet = f"{cut.isoformat()}/{(cut + timedelta(minutes=2)).isoformat()}"
    burst = job("burst", catchup="all", max_late="20s", max_runs=5, exclude=[quiet])
    config = base(nats_server, http_app, [burst, job("tick")])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(
            lambda: all(_next_run(p, "burst") == 0 for p in procs),
            40,
            what="burst done on every sidecar",
        )
        seen = len(set(slots(http_app, "/jobs/tick")))
        wait_for(lambda: len(set(slots(http_app, "/jobs/tick"))) >= seen + 3, 20, what="ticks")
        caught_up = sum("catching up" in p.log() and "job burst" in p.log() for p in procs)
        won = sum(p.metric("anarchon_claims_won_total", {"job": "burst"}) or 0 for p in procs)
        capped = sum(
            p.metric("anarchon_runs_skipped_total", {"job": "burst", "reason": "max_runs"}) or 0
            for p in procs
        )
        print(f"burst: {won:g} claims won, {capped:g} refused by the count")
    runs = slots(http_app, "/jobs/burst")
    assert caught_up >= 1
    assert len(runs) == 5 and max(Counter(runs).values()) == 1, runs
    triggers = Counter(
        r.headers["X-Anarchon-Trigger"] for r in http_app.requests_for("/jobs/burst")
    )
    assert triggers == {"catchup": 5}, triggers
    # Every slot won past the cap (if the view lagged) was refused by the count.
    assert won == 5 + capped, (won, capped)


def test_check_says_a_job_has_ended_and_where_its_runs_are_counted(tmp_path: Path) -> None:
    cfg = cli_config(
        tmp_path,
        {
            "nats": {"servers": "nats://127.0.0.1:1"},  # check connects to nothing
            "jobs": [
                {"name": "over", "schedule": "@every 1h", "end_at": "2026-01-01T00:00:00Z"},
                {"name": "capped", "schedule": "0 3 * * *", "max_runs": 10},
            ],
        },
    )
    done = run_cli("check", "-c", cfg)
    assert done.returncode == 0, done.stderr
    over = done.stdout.split("over:", 1)[1].split("capped:", 1)[0]
    assert "runs no more: end_at 2026-01-01T00:00:00Z passed" in over
    assert "next:" not in over
    assert "max_runs 10: counted fleet-wide in count.capped" in done.stdout


def test_slots_skipped_for_overlap_do_not_use_up_max_runs(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """max_runs counts runs that reach the app: a slot kept from running by
    ``overlap: skip`` (its run lease held) is not one of them."""
    http_app.delay["/jobs/long"] = 2.5  # each run spans the next two slots
    config = base(nats_server, http_app, [job("long", overlap="skip", max_runs=3)])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(
            lambda: all(_next_run(p, "long") == 0 for p in procs), 60, what="long done everywhere"
        )
        overlapped = sum(
            p.metric("anarchon_runs_skipped_total", {"job": "long", "reason": "overlap"}) or 0
            for p in procs
        )
    runs = slots(http_app, "/jobs/long")
    assert len(runs) == 3 and max(Counter(runs).values()) == 1, runs
    assert overlapped >= 2, overlapped
