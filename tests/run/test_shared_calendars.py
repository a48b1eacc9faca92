"""Shared calendars (``calendars:``, ``exclude: [calendar:<name>]``) with real sidecars and
a real nats-server: a calendar's window runs nowhere and is recorded skipped once a
slot, the other slots run exactly once; a calendar whose content differs between
replicas is a config mismatch that ``status`` names (docs/SCHEDULES.md)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
)


def stamp(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y%m%dT%H%M%SZ")


def ics(*events: str, eol: str = "\r\n", summary: str = "") -> str:
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//test//EN"]
    for i, when in enumerate(events):
        lines += ["BEGIN:VEVENT", f"UID:{i}@test", *when.split("|")]
        lines += [f"SUMMARY:{summary}"] if summary else []
        lines += ["END:VEVENT"]
    return eol.join([*lines, "END:VCALENDAR"]) + eol


def total(procs: list[Sidecar], name: str, labels: dict[str, str]) -> float:
    return sum(p.metric(name, labels) or 0 for p in procs)


def status(cfg: str) -> dict[str, Any]:
    done = run_cli("status", "-c", cfg, "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_calendar_window_runs_nowhere_and_the_other_slots_once(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    start = int(datetime.now(UTC).timestamp()) + 25  # after every loop started, even loaded
    window = [start, start + 4]  # four one-second slots, from the calendar file
    (tmp_path / "windows.ics").write_text(
        ics(f"DTSTART:{stamp(window[0])}|DTEND:{stamp(window[1])}"), newline=""
    )
    plain = start + 6  # and one plain entry beside it
    config = base(
        nats_server,
        http_app,
        [job("cal", exclude=["calendar:freeze", f"{iso(plain)}/PT1S"])],
    )
    config["calendars"] = {"freeze": {"file": "windows.ics"}}  # beside each sidecar's config
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(
            lambda: [s for s in slots(http_app, "/jobs/cal") if s / 1000 >= plain + 3],
            60,
            what="runs after the calendar's window",
        )
        wait_for(
            lambda: (
                total(procs, "anarchon_runs_skipped_total", {"job": "cal", "reason": "excluded"})
                == 5
            ),
            10,
            what="five excluded slots recorded",
        )
        view = next(j for j in status(cfg)["jobs"] if j["name"] == "cal")
        skipped_seen = total(
            procs, "anarchon_claims_skipped_total", {"job": "cal", "reason": "excluded"}
        )
    ran = slots(http_app, "/jobs/cal")
    inside = [s * 1000 for s in range(window[0], window[1])]
    assert not set(ran) & {*inside, plain * 1000}
    assert max(Counter(ran).values()) == 1  # each other slot exactly once
    # around the window, every slot ran or was excluded: none lost, none run twice
    around = set(range((window[0] - 5) * 1000, (plain + 3) * 1000, 1000))
    assert set(ran) & around == around - {*inside, plain * 1000}, sorted(around - set(ran))
    assert skipped_seen == 15  # every replica judged every excluded slot
    records = [m for m in read_stream(nats_server.url) if m.data.get("skipped") == "excluded"]
    ids = sorted(m.headers.get("Nats-Msg-Id") for m in records)
    assert ids == sorted(f"cal:{s}" for s in [*inside, plain * 1000])  # once a slot
    done = run_cli("history", "cal", "-c", cfg, "--json", "--limit", "200")
    results = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    errors = {r["slot"]: r["error"] for r in results if r["status"] == "skipped"}
    event = f"{iso(window[0])}/{iso(window[1])}"
    assert all(errors[s] == f"excluded: calendar:freeze {event}" for s in inside), errors
    assert errors[plain * 1000] == f"excluded: {iso(plain)}/PT1S"
    assert [c["name"] for c in view["calendars"]] == ["freeze"]
    assert "excluded: calendar:freeze (1 entries, content hash " in " ".join(view["schedule_lines"])


def test_calendars_that_differ_between_replicas_are_a_mismatch(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    events = ["DTSTART;VALUE=DATE:20261225|DTEND;VALUE=DATE:20261227"]
    config = base(nats_server, http_app, [job("report", schedule="0 9 * * *")])
    config["jobs"][0]["exclude"] = ["calendar:holidays"]
    config["calendars"] = {"holidays": {"file": "holidays.ics"}}
    hosts = {name: tmp_path / name for name in ("a", "b", "c")}
    for where in hosts.values():
        where.mkdir()
    # a and b: the same events, in other bytes (LF, a summary); c: another day too
    (hosts["a"] / "holidays.ics").write_text(ics(*events, eol="\n"), newline="")
    (hosts["b"] / "holidays.ics").write_text(ics(*events, summary="Weihnachten"), newline="")
    (hosts["c"] / "holidays.ics").write_text(
        ics(*events, "DTSTART;VALUE=DATE:20261231"), newline=""
    )
    cfg = cli_config(tmp_path, config)
    (tmp_path / "holidays.ics").write_text(ics(*events), newline="")
    with sidecars(hosts["a"], [("a", config, {})]), sidecars(hosts["b"], [("b", config, {})]):
        same = wait_for(lambda: (v := status(cfg)) and len(v["instances"]) == 2 and v, 20)
        assert not same["config_mismatch"] and same["mismatched_calendars"] == []
        with sidecars(hosts["c"], [("c", config, {})]):
            odd = wait_for(
                lambda: (v := status(cfg)) and len(v["instances"]) == 3 and v,
                20,
                what="three instances",
            )
            text = run_cli("status", "-c", cfg).stdout
    assert odd["config_mismatch"] and odd["mismatched_jobs"] == ["report"]
    assert odd["mismatched_calendars"] == ["holidays"]
    (report,) = odd["jobs"]
    assert report["settings_differ"]
    assert "active (settings differ)" in text
    assert "WARNING: live instances run these jobs with different settings: report" in text
    assert "WARNING: live instances hold these calendars with different contents: holidays" in text


def iso(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
