"""The schedules operators have, with three real sidecars and a real nats-server.

Several expressions a job, a stable spread, exclusions, nth weekday, a timed
pause, skip/unskip: each checked where the app and the stream see it, plus
the config rules that name the key.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest

from sidecar.config.load import parse_config
from sidecar.core.clock import parse_rfc3339, rfc3339
from sidecar.core.errors import ConfigError
from sidecar.when.slots import spread_offset_ms
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    base,
    cli_config,
    job,
    read_stream,
    run_cli,
    sidecars,
    slots,
    wait_for,
    write_config,
)


def total(procs: list[Sidecar], name: str, labels: dict[str, str]) -> float:
    return sum(p.metric(name, labels) or 0 for p in procs)


def history(cfg: str, name: str, limit: int = 200) -> list[dict[str, Any]]:
    done = run_cli("history", name, "-c", cfg, "--json", "--limit", str(limit))
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def status(cfg: str) -> dict[str, Any]:
    done = run_cli("status", "-c", cfg, "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def job_status(cfg: str, name: str) -> dict[str, Any]:
    return next(j for j in status(cfg)["jobs"] if j["name"] == name)


def iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- config rules


def parse(jobs: list[dict[str, Any]]) -> Any:
    return parse_config({"nats": {"servers": "nats://127.0.0.1:4222"}, "jobs": jobs}, {})


@pytest.mark.parametrize(
    ("extra", "key", "fragment"),
    [
        ({"schedule": []}, "jobs[0].schedule", "one expression or a list"),
        ({"schedule": ["* * * * *", "61 * * * *"]}, "jobs[0].schedule[1]", "bad minute"),
        ({"schedule": ["* * * * *", 5]}, "jobs[0].schedule[1]", ""),
        ({"spread": "500ms"}, "jobs[0].spread", "at least 1s"),
        ({"schedule": "*/5 * * * *", "spread": "5m"}, "jobs[0].spread", "shortest interval"),
        ({"exclude": "2026-12-24"}, "jobs[0].exclude", "a list"),
        ({"exclude": ["2026-12-24", "2026-02-30"]}, "jobs[0].exclude[1]", "not a date"),
        ({"exclude": ["2026-12-24T10:00Z/PT0S"]}, "jobs[0].exclude[0]", "ends before"),
    ],
)
def test_config_errors_name_the_key(extra: dict[str, Any], key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse([{"name": "a", "schedule": "* * * * *", **extra}])
    assert info.value.key == key
    assert fragment in str(info.value)


def test_a_plain_job_keeps_its_identity() -> None:
    """A job without the new keys hashes (config mismatch) and claims as before."""
    from sidecar.store.digests import job_hash

    plain = parse([{"name": "a", "schedule": "*/5 * * * *"}]).jobs[0]
    assert plain.schedule.identity == "*/5 * * * *"
    assert job_hash(plain) == "ff7627db2e33"  # pinned: what main computes for a plain job
    spread = parse([{"name": "a", "schedule": "*/5 * * * *", "spread": "1m"}]).jobs[0]
    assert job_hash(spread) != job_hash(plain)


def test_check_lists_every_expression_in_words_and_warns_for_the_reference(
    tmp_path: Path,
) -> None:
    cfg = write_config(
        tmp_path / "c.yaml",
        {
            "nats": {"servers": "nats://127.0.0.1:1"},  # check connects to nothing
            "jobs": [
                {
                    "name": "report",
                    "schedule": ["0 9 * * 1#2", "0 0 L * *"],
                    "timezone": "Europe/Berlin",
                    "spread": "10m",
                    "exclude": ["2026-12-24"],
                },
                {"name": "plain", "schedule": "*/5 * * * *"},
            ],
        },
    )
    done = run_cli("check", "-c", str(cfg))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    offset = spread_offset_ms("report", 600) // 1000
    assert "schedule '0 9 * * 1#2': At 09:00 on the second Monday of the month" in out
    assert "schedule '0 0 L * *': At 00:00 on the last day of every month" in out
    assert f"spread 600s: every slot {offset}s later (from the job name)" in out
    assert "excluded: 2026-12-24" in out
    warning = [line for line in out.splitlines() if "reference backend" in line]
    assert len(warning) == 1 and "'#' (nth weekday), 'L' (last)" in warning[0]
    assert "schedule '*/5 * * * *': Every 5 minutes" in out
    # next runs are in the job's timezone, moved by the spread, never on an excluded day
    nexts = [line for line in out.splitlines() if line.strip().startswith("next:")][:3]
    assert all(("CET" in n or "CEST" in n) and "-12-24 " not in n for n in nexts)
    assert all(f":{offset // 60 % 60:02d}:{offset % 60:02d} " in n for n in nexts), nexts


# ---------------------------------------------------------------- fleet behaviour


def test_union_spread_and_exclusions_across_three_sidecars(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    spread_name = "spready"
    offset = spread_offset_ms(spread_name, 7)
    assert offset != 0  # the test needs a moved slot
    now = datetime.now(UTC).timestamp()
    ex_start = int(now) + 25  # after every sidecar's loop has started, even on a loaded host
    ex_text = f"{iso(ex_start)}/{iso(ex_start + 3)}"  # three one-second slots
    config = base(
        nats_server,
        http_app,
        [
            job("both", schedule=["*/2 * * * * *", "*/3 * * * * *"]),
            job(spread_name, schedule="*/10 * * * * *", spread="7s"),
            job("excl", exclude=[ex_text]),
        ],
    )
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(
            lambda: (
                slots(http_app, f"/jobs/{spread_name}")
                and [s for s in slots(http_app, "/jobs/excl") if s / 1000 >= ex_start + 4]
            ),
            60,
            what="a spread run and runs after the exclusion",
        )
        wait_for(lambda: len(set(slots(http_app, "/jobs/both"))) >= 10, 20, what="union runs")
        wait_for(
            lambda: (
                total(procs, "anarchon_runs_skipped_total", {"job": "excl", "reason": "excluded"})
                == 3
            ),
            10,
            what="three excluded slots recorded",
        )
        view = job_status(cfg, "both")
        assert [s["cron"] for s in view["schedules"]] == ["*/2 * * * * *", "*/3 * * * * *"]
        assert all(s["text"] for s in view["schedules"])
        assert view["schedule_lines"][1] == "schedule '*/3 * * * * *': Every 3 seconds"
        assert view["next_run_local"].endswith(" UTC")
        table = run_cli("status", "-c", cfg).stdout
        assert "both: schedule '*/2 * * * * *': Every 2 seconds" in table
        assert "both: schedule '*/3 * * * * *': Every 3 seconds" in table
        assert "both: next run " in table
        # One claim per replica per slot: a shared instant is one slot, not two claims.
        won = total(procs, "anarchon_claims_won_total", {"job": "both"})
        lost = total(procs, "anarchon_claims_lost_total", {"job": "both"})
        both = slots(http_app, "/jobs/both")
        excl_skips = total(
            procs, "anarchon_claims_skipped_total", {"job": "excl", "reason": "excluded"}
        )
    assert abs(won - len(both)) <= 1, (won, len(both))  # one may be in flight
    assert lost <= 2 * won + 3, (won, lost)
    assert max(Counter(both).values()) == 1
    assert all((s // 1000) % 2 == 0 or (s // 1000) % 3 == 0 for s in both)
    assert any((s // 1000) % 6 == 0 for s in both), "a shared instant ran"
    # Spread: the slot id, X-Anarchon-Slot and Scheduled-At are the moved instant.
    for req in http_app.requests_for(f"/jobs/{spread_name}"):
        slot = int(req.headers["X-Anarchon-Slot"])
        assert slot % 10_000 == offset, (slot, offset)
        assert req.headers["X-Anarchon-Scheduled-At"] == rfc3339(slot / 1000)
    # Exclusion: nothing ran inside, each slot recorded skipped once.
    excl = slots(http_app, "/jobs/excl")
    inside = [ex_start * 1000 + i * 1000 for i in range(3)]
    assert not set(excl) & set(inside)
    assert excl_skips == 9
    records = [r for r in history(cfg, "excl") if r["status"] == "skipped"]
    assert sorted(r["slot"] for r in records) == inside
    assert all(r["error"] == f"excluded: {ex_text}" for r in records)
    # Each skip record is the slot's own fate message: the id a run of it would have.
    stored = read_stream(nats_server.url)
    records_ids = [
        m.headers.get("Nats-Msg-Id") for m in stored if m.data.get("skipped") == "excluded"
    ]
    assert sorted(records_ids) == sorted(f"excl:{s}" for s in inside)


def test_nth_weekday_runs_on_its_day(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    today = datetime.now(UTC)
    dow = (today.weekday() + 1) % 7  # cron: 0 is Sunday
    nth = (today.day - 1) // 7 + 1
    config = base(nats_server, http_app, [job("nth", schedule=f"* * * * * {dow}#{nth}")])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]):
        wait_for(lambda: len(slots(http_app, "/jobs/nth")) >= 2, 20, what="runs today")
    assert max(Counter(slots(http_app, "/jobs/nth")).values()) == 1


def test_a_timed_pause_ends_by_itself_on_every_sidecar(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a")])
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: slots(http_app, "/jobs/a"), 20, what="a runs")
        done = run_cli("pause", "a", "-c", cfg, "--until", "6s", "--reason", "deploy")
        assert done.returncode == 0, done.stderr
        assert " until " in done.stdout and "resumes by itself" in done.stdout
        stored = datetime.now(UTC).timestamp()
        view = job_status(cfg, "a")
        assert view["paused"] and view["paused_reason"] == "deploy"
        assert view["paused_by"] and "@" in view["paused_by"]
        until = parse_rfc3339(view["paused_until"])
        assert stored < until <= stored + 7
        wait_for(
            lambda: all(
                p.metric("anarchon_job_paused_until_timestamp_seconds", {"job": "a"})
                == pytest.approx(until, abs=0.01)
                and p.metric("anarchon_job_paused", {"job": "a"}) == 1
                for p in procs
            ),
            5,
            what="paused with its end on all three",
        )
        # No CLI from here on: each sidecar ends the pause itself.
        wait_for(
            lambda: all(p.metric("anarchon_job_paused", {"job": "a"}) == 0 for p in procs),
            until - datetime.now(UTC).timestamp() + 3,
            what="the pause ended everywhere",
        )
        ended = datetime.now(UTC).timestamp()
        assert ended >= until - 0.05
        wait_for(
            lambda: [s for s in slots(http_app, "/jobs/a") if s / 1000 >= until], 5, what="runs"
        )
        assert not job_status(cfg, "a")["paused"]
        ran = slots(http_app, "/jobs/a")
        paused_slots = list(range(int(stored + 1) * 1000, int(until) * 1000, 1000))
        assert not set(ran) & set(paused_slots), "a ran while paused"
        skipped = [r for r in history(cfg, "a") if r["status"] == "skipped"]
        # Each paused slot recorded once (the first may race the watch and run).
        assert {r["slot"] for r in skipped} >= set(paused_slots[1:])
        assert len(skipped) == len({r["slot"] for r in skipped})
        assert all(r["error"].startswith("paused by ") and "deploy" in r["error"] for r in skipped)
        recorded = total(procs, "anarchon_runs_skipped_total", {"job": "a", "reason": "paused"})
        assert recorded == len(skipped)
    assert max(Counter(ran).values()) == 1


async def _skip_key(url: str, job_name: str) -> dict[str, Any] | None:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value("CRON_STATE")
        try:
            entry = await kv.get(f"skip.{job_name}")
        except Exception:
            return None
        return dict(json.loads(entry.value or b"{}"))
    finally:
        await nc.close()


def test_skip_skips_exactly_the_next_slots_everywhere_and_unskip_cancels(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a", schedule="*/2 * * * * *")])
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: slots(http_app, "/jobs/a"), 20, what="a runs")
        done = run_cli("skip", "a", "-c", cfg, "--count", "2", "--reason", "holiday")
        assert done.returncode == 0, done.stderr
        assert done.stdout.count("a: skipping ") == 2
        chosen = (asyncio.run(_skip_key(nats_server.url, "a")) or {}).get("slots")
        assert isinstance(chosen, list) and len(chosen) == 2
        assert chosen[1] - chosen[0] == 2000
        wait_for(lambda: [s for s in slots(http_app, "/jobs/a") if s > chosen[1]], 10, what="after")
        ran = slots(http_app, "/jobs/a")
        assert not set(ran) & set(chosen)
        wait_for(
            lambda: (
                total(procs, "anarchon_runs_skipped_total", {"job": "a", "reason": "skip"}) == 2
            ),
            5,
            what="two skip records",
        )
        assert total(procs, "anarchon_claims_skipped_total", {"job": "a", "reason": "skip"}) == 6
        assert job_status(cfg, "a")["skip_pending"] == 0
        # Twenty more, then cancelled: the runs come back.
        more = run_cli("skip", "a", "-c", cfg, "--count", "20")
        assert more.returncode == 0, more.stderr
        second = (asyncio.run(_skip_key(nats_server.url, "a")) or {}).get("slots") or []
        # The two past ones stay only while a sidecar may still be deciding them
        # (jitter + max_late + 5 s): a second skip never drops a pending fate.
        added = [s for s in second if s not in chosen]
        assert len(added) == 20 and min(added) > max(chosen)
        assert 1 <= job_status(cfg, "a")["skip_pending"] <= 20  # some may pass meanwhile
        table = run_cli("status", "-c", cfg).stdout  # slots may have passed meanwhile
        assert re.search(r"^a: next \d+ slot\(s\) skipped \(skip\)$", table, re.M), table
        cancel = run_cli("unskip", "a", "-c", cfg)
        assert cancel.returncode == 0, cancel.stderr
        assert "pending skip(s) cancelled" in cancel.stdout
        cancelled = datetime.now(UTC).timestamp()
        wait_for(
            lambda: [s for s in slots(http_app, "/jobs/a") if s / 1000 > cancelled + 0.5],
            8,
            what="runs after unskip",
        )
        again = run_cli("unskip", "a", "-c", cfg)
        assert again.returncode == 1 and "no skip pending" in again.stderr
    records = [r for r in history(cfg, "a") if r["status"] == "skipped"]
    recorded = {r["slot"] for r in records}
    assert set(chosen) <= recorded <= set(chosen) | set(second)
    assert len(records) == len(recorded)
    assert all(r["error"].startswith("skip by ") for r in records)
    assert all("holiday" in r["error"] for r in records if r["slot"] in chosen)
    assert max(Counter(slots(http_app, "/jobs/a")).values()) == 1


# ---------------------------------------------------------------- backfill, bursts, triggers


def trigger_of(req: Any) -> str:
    return str(req.headers.get("X-Anarchon-Trigger"))


def test_backfill_runs_each_slot_once_by_the_fleet_one_at_a_time(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.delay["/jobs/bf"] = 0.4
    config = base(nats_server, http_app, [job("bf", schedule="*/10 * * * * *", max_late="5s")])
    cfg = cli_config(tmp_path, config)
    now = int(datetime.now(UTC).timestamp())
    start, end = (now // 10 - 6) * 10, (now // 10 - 1) * 10  # six past slots
    wanted = [s * 1000 for s in range(start, end + 1, 10)]
    args = ["backfill", "bf", "-c", cfg, "--from", iso(start), "--to", iso(end)]
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        dry = run_cli(*args, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert dry.stdout.count("bf: would run ") == 6
        assert job_status(cfg, "bf")["backfill_pending"] == 0  # a dry run writes nothing
        done = run_cli(*args)
        assert done.returncode == 0, done.stderr
        assert "queued 6 slot(s) (trigger backfill)" in done.stdout

        def backfilled() -> list[Any]:
            return [r for r in http_app.requests_for("/jobs/bf") if trigger_of(r) == "backfill"]

        wait_for(lambda: len(backfilled()) == 6, 30, what="six backfill runs")
        wait_for(lambda: job_status(cfg, "bf")["backfill_pending"] == 0, 10, what="done")
        runs = backfilled()
        assert sorted(int(r.headers["X-Anarchon-Slot"]) for r in runs) == wanted
        for r in runs:
            slot = int(r.headers["X-Anarchon-Slot"])
            assert r.headers["X-Anarchon-Previous-Scheduled-At"] == rfc3339(slot / 1000 - 10)
        ordered = sorted(runs, key=lambda r: r.at)
        for before, after in itertools.pairwise(ordered):
            assert after.at >= before.finished - 0.01, "two backfill runs overlapped"
        pending = "anarchon_job_backfill_pending"
        wait_for(  # each sidecar's view follows the bucket by its watch
            lambda: all(not p.metric(pending, {"job": "bf"}) for p in procs),
            5,
            what="every sidecar's backfill_pending at 0",
        )
        ids = {m.headers.get("Nats-Msg-Id") for m in read_stream(nats_server.url)}
        assert {f"bf:{s}:b" for s in wanted} <= ids
        hist = [r for r in history(cfg, "bf") if r.get("trigger") == "backfill"]
        assert sorted(r["slot"] for r in hist) == wanted
        assert all(r["status"] == "succeeded" for r in hist)
        # The table marks them as it marks manual runs.
        table = run_cli("history", "bf", "-c", cfg, "--limit", "200")
        marked = [line for line in table.stdout.splitlines() if "(backfill)" in line]
        assert len(marked) == 6, table.stdout
        # The same backfill again runs nothing again; --again runs them anew.
        same = run_cli(*args)
        assert same.returncode == 0, same.stderr
        assert "6 slot(s) a backfill ran before are left out" in same.stdout
        assert "queued 0 slot(s)" in same.stdout
        anew = run_cli(*args, "--again")
        assert anew.returncode == 0, anew.stderr
        wait_for(lambda: len(backfilled()) == 12, 30, what="six more with --again")
    assert Counter(int(r.headers["X-Anarchon-Slot"]) for r in backfilled()) == {
        s: 2 for s in wanted
    }
    # Scheduled runs never collided with the backfill's claims.
    scheduled = [r for r in http_app.requests_for("/jobs/bf") if trigger_of(r) == "scheduled"]
    assert (
        max(Counter(int(r.headers["X-Anarchon-Slot"]) for r in scheduled).values(), default=1) == 1
    )


def test_backfill_refuses_too_many_slots_naming_the_count(tmp_path: Path) -> None:
    config = {
        "nats": {"servers": "nats://127.0.0.1:1", "connect_timeout": "200ms"},
        "jobs": [job("x")],
    }
    cfg = cli_config(tmp_path, config)
    now = int(datetime.now(UTC).timestamp())
    done = run_cli("backfill", "x", "-c", cfg, "--from", iso(now - 7200), "--to", iso(now - 1))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "7200 slots in that range; a backfill runs at most 1000" in done.stderr
    future = run_cli("backfill", "x", "-c", cfg, "--from", iso(now), "--to", iso(now + 60))
    assert future.returncode == 2 and "in the future" in future.stderr
    # Durations back from now, as pause --until takes them ahead; --to defaults to now.
    back = run_cli("backfill", "x", "-c", cfg, "--from", "2h", "--to", "1s")
    assert back.returncode == 2 and " slots in that range; a backfill runs at" in back.stderr
    words = run_cli("backfill", "x", "-c", cfg, "--from", "yesterday")
    assert words.returncode == 2, words.stderr
    assert words.stderr.strip() == (
        "anarchon-sidecar: --from: 'yesterday' is neither an RFC 3339 time "
        "(2026-12-24T08:00:00Z) nor a duration back from now (30m, 2h)"
    )
    ahead = run_cli("backfill", "x", "-c", cfg, "--from", "2h", "--to", "+1m")
    assert ahead.returncode == 2 and "--to is in the future" in ahead.stderr, ahead.stderr


def test_pause_until_in_the_past_says_so(tmp_path: Path) -> None:
    config = {"nats": {"servers": "nats://127.0.0.1:1"}, "jobs": [job("x")]}
    cfg = cli_config(tmp_path, config)
    done = run_cli("pause", "x", "-c", cfg, "--until", "-5m")
    assert done.returncode == 2, done.stderr
    assert "--until: '-5m' is in the past (" in done.stderr, done.stderr


def test_resume_never_bursts_the_paused_slots_even_after_a_restart(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a", catchup="all", max_late="8s")])
    cfg = cli_config(tmp_path, config)
    procs = [Sidecar(tmp_path, f"s{i}", config, {}) for i in range(2)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready()
        wait_for(lambda: slots(http_app, "/jobs/a"), 20, what="a runs")
        assert run_cli("pause", "a", "-c", cfg).returncode == 0
        wait_for(lambda: all(p.metric("anarchon_job_paused", {"job": "a"}) == 1 for p in procs), 5)
        paused_at = datetime.now(UTC).timestamp()
        for p in procs:
            assert p.terminate() == 0
        # Down and paused: nobody records these slots. Then resumed, then restarted.
        wait_for(lambda: datetime.now(UTC).timestamp() > paused_at + 3, 5)
        resumed_at = datetime.now(UTC).timestamp()  # the resume is stored a little later
        resumed = run_cli("resume", "a", "-c", cfg)
        assert resumed.returncode == 0, resumed.stderr
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready()
        wait_for(lambda: [s for s in slots(http_app, "/jobs/a") if s / 1000 > resumed_at + 1], 15)
        during = [s for s in slots(http_app, "/jobs/a") if paused_at + 1 < s / 1000 < resumed_at]
        assert during == [], "slots of the pause ran after the resume"
        # The first start caught up slots from before the test's pause; none of the pause.
        caught = [
            int(r.headers["X-Anarchon-Slot"]) / 1000
            for r in http_app.requests_for("/jobs/a")
            if trigger_of(r) == "catchup"
        ]
        assert [t for t in caught if paused_at < t < resumed_at] == []
    finally:
        for p in procs:
            p.kill()


def test_catchup_never_reaches_before_a_schedule_change(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    old = base(
        nats_server, http_app, [job("a", schedule="*/2 * * * * *", catchup="all", max_late="8s")]
    )
    new = base(
        nats_server, http_app, [job("a", schedule="*/3 * * * * *", catchup="all", max_late="8s")]
    )
    with sidecars(tmp_path, [("s0", old, {})]):
        wait_for(lambda: len(slots(http_app, "/jobs/a")) >= 2, 20, what="old schedule runs")
    stopped = datetime.now(UTC).timestamp()
    wait_for(lambda: datetime.now(UTC).timestamp() > stopped + 4, 6)
    changed = datetime.now(UTC).timestamp()
    with sidecars(tmp_path, [("s1", new, {}), ("s2", new, {})]) as procs:
        wait_for(lambda: [s for s in slots(http_app, "/jobs/a") if s / 1000 > changed + 3], 20)
        assert any("its schedule changed" in p.log() for p in procs)
    early = [
        int(r.headers["X-Anarchon-Slot"])
        for r in http_app.requests_for("/jobs/a")
        if r.headers["X-Anarchon-Slot"]
        and int(r.headers["X-Anarchon-Slot"]) / 1000 > stopped
        and int(r.headers["X-Anarchon-Slot"]) / 1000 < changed
    ]
    assert early == [], "catch-up ran slots dated before the schedule change"


def test_resume_catchup_runs_the_paused_slots_once_as_catchup(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a", schedule="*/2 * * * * *")])
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        wait_for(lambda: slots(http_app, "/jobs/a"), 20, what="a runs")
        assert run_cli("pause", "a", "-c", cfg).returncode == 0
        wait_for(lambda: all(p.metric("anarchon_job_paused", {"job": "a"}) == 1 for p in procs), 5)
        paused_at = datetime.now(UTC).timestamp()
        wait_for(
            lambda: (
                total(procs, "anarchon_runs_skipped_total", {"job": "a", "reason": "paused"}) >= 3
            ),
            15,
            what="three paused slots",
        )
        done = run_cli("resume", "a", "-c", cfg, "--catchup")
        assert done.returncode == 0, done.stderr
        assert "(trigger catchup)" in done.stdout
        skipped = [r["slot"] for r in history(cfg, "a") if r["status"] == "skipped"]
        wait_for(
            lambda: (
                {
                    int(r.headers["X-Anarchon-Slot"])
                    for r in http_app.requests_for("/jobs/a")
                    if trigger_of(r) == "catchup"
                }
                >= set(skipped)
            ),
            30,
            what="the paused slots run as catchup",
        )
    ran = Counter(
        (int(r.headers["X-Anarchon-Slot"]), trigger_of(r)) for r in http_app.requests_for("/jobs/a")
    )
    assert max(ran.values()) == 1
    assert all(s / 1000 >= paused_at - 2 for (s, t) in ran if t == "catchup")


def test_every_trigger_says_why_and_history_keeps_it(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.status["/jobs/flaky"] = 500
    config = base(
        nats_server,
        http_app,
        [job("tick"), job("flaky", schedule="*/5 * * * * *", retry={"max": 1, "backoff": "1s"})],
    )
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]):
        wait_for(lambda: len(slots(http_app, "/jobs/tick")) >= 2, 20, what="ticks")
        manual = run_cli("run-now", "tick", "-c", cfg)
        assert manual.returncode == 0, manual.stderr
        wait_for(
            lambda: [r for r in http_app.requests_for("/jobs/flaky") if trigger_of(r) == "retry"],
            20,
            what="a retry",
        )
    ticks = http_app.requests_for("/jobs/tick")
    scheduled = [r for r in ticks if trigger_of(r) == "scheduled"]
    assert scheduled and {trigger_of(r) for r in ticks} == {"scheduled", "manual"}
    for r in scheduled:
        slot = int(r.headers["X-Anarchon-Slot"])
        assert r.headers["X-Anarchon-Previous-Scheduled-At"] == rfc3339(slot / 1000 - 1)
    retry = next(r for r in http_app.requests_for("/jobs/flaky") if trigger_of(r) == "retry")
    assert retry.headers["X-Anarchon-Attempt"] == "2"
    triggers = Counter(r.get("trigger") for r in history(cfg, "tick"))
    assert triggers["manual"] == 1 and triggers["scheduled"] >= 2
    assert "retry" in {r.get("trigger") for r in history(cfg, "flaky")}


def test_backfill_goes_on_when_its_runner_is_killed_mid_run(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.delay["/jobs/bf"] = 3.0
    config = base(nats_server, http_app, [job("bf", schedule="0 0 1 1 *", max_late="10s")])
    cfg = cli_config(tmp_path, config)
    wanted = [
        round(datetime(year, 1, 1, tzinfo=UTC).timestamp() * 1000) for year in (2023, 2024, 2025)
    ]
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        done = run_cli(
            "backfill", "bf", "-c", cfg, "--from", "2023-01-01T00:00:00Z", "--to",
            "2025-01-01T00:00:00Z",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        first = wait_for(lambda: http_app.requests_for("/jobs/bf"), 20, what="the first run")[0]
        runner = next(p for p in procs if p.name == first.headers["X-Anarchon-Instance"])
        runner.kill()  # SIGKILL in the middle of its run
        wait_for(
            lambda: (
                len({r.headers["X-Anarchon-Slot"] for r in http_app.requests_for("/jobs/bf")}) == 3
            ),
            60,
            what="the other two slots run by the survivors",
        )
        wait_for(
            lambda: (
                (v := job_status(cfg, "bf"))["backfill_pending"] == 0
                and v["backfill_running"] is None
            ),
            20,
            what="finished",
        )
    runs = http_app.requests_for("/jobs/bf")
    assert sorted(int(r.headers["X-Anarchon-Slot"]) for r in runs) == wanted  # each once
    assert {r.headers["X-Anarchon-Instance"] for r in runs[1:]} <= {
        p.name for p in procs if p is not runner
    }
