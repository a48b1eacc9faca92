"""What the command line shows, as pure functions: tables line up, hostile text is escaped."""

from __future__ import annotations

from typing import Any

from sidecar.cli import output, status_text


def instance(id_: str, version: str = "0.1.0") -> dict[str, Any]:
    return {
        "id": id_,
        "version": version,
        "started_at": "2026-12-03T08:02:52.252Z",
        "config_hash": "5c4d66b71bc5",
    }


def fleet(*ids: str) -> dict[str, Any]:
    return {
        "stream": {
            "name": "CRON",
            "domain": None,
            "cluster": "C1",
            "leader": "n1",
            "replicas": 3,
        },
        "instances": [instance(i) for i in ids],
        "config_mismatch": False,
        "mismatched_jobs": [],
        "jobs": [],
    }


def test_status_starts_with_the_stream_and_lines_up_instances_of_any_id_length() -> None:
    lines = status_text.status_lines(fleet("web-1", "worker-eu-west-17", "a"))
    assert lines[0] == ("stream CRON: JetStream domain (none), cluster C1, leader n1, replicas 3")
    assert lines[1] == "instances: 3 live"
    rows = lines[2:5]
    # every column starts at the same place whatever the id's length
    starts = {row.index(" v0.1.0") for row in rows}
    assert len(starts) == 1, rows
    assert len({row.index("config ") for row in rows}) == 1, rows


def test_control_characters_from_the_stream_are_shown_escaped() -> None:
    lines = status_text.status_lines(fleet("evil\x1b[2J"))
    assert "\x1b" not in "\n".join(lines)
    assert any("evil\\x1b[2J" in line for line in lines)


def test_closest_name_prefers_case_then_spelling() -> None:
    assert output.closest_name("SYNC", ["sync", "sink"]) == "sync"
    assert output.closest_name("synk", ["sync", "report"]) == "sync"
    assert output.closest_name("zzz", ["sync", "report"]) is None
    message = output.unknown_job("synk", ("sync", "report"), "in the config")
    assert message == "no job named 'synk' in the config; did you mean 'sync'? (jobs: sync, report)"


def test_history_marks_every_trigger_kind_but_scheduled() -> None:
    from sidecar.core.wire import TRIGGERS
    from sidecar.store.runs import Run

    def run(trigger: str | None, attempt: int = 1, manual: bool = False) -> Run:
        return Run(
            "j", 1000, "t", "web-1", manual, "succeeded", "2026-12-02T16:13:00.000Z",
            "2026-12-02T16:13:00.000Z", None, None, 3, 200, None,
            attempt=attempt, trigger=trigger,
        )  # fmt: skip

    marks = {
        t: output.run_marks(run(t, attempt=2 if t in ("retry", "rerun") else 1)) for t in TRIGGERS
    }
    assert marks == {
        "scheduled": "",
        "catchup": " (catchup)",
        "manual": " (manual)",
        "retry": " (retry, attempt 2)",
        "rerun": " (rerun, attempt 2)",
        "backfill": " (backfill)",
        "at": " (at)",
        "after": " (after)",
    }
    # A skipped slot has no trigger; a reference claim says only `manual`.
    assert output.run_marks(run(None)) == ""
    assert output.run_marks(run(None, manual=True)) == " (manual)"


def test_the_attempt_table_of_docs_cli_is_the_codes() -> None:
    """docs/CLI.md's table of a lost run and its rerun is what runs_table prints."""
    from pathlib import Path
    from zoneinfo import ZoneInfo

    from sidecar.store.runs import Run

    text = (Path(__file__).resolve().parents[2] / "docs" / "CLI.md").read_text()
    start = text.index("Each attempt of a slot is a row of its own:")
    block = text[
        text.index("```text\n", start) + 8 : text.index("```", text.index("```text\n", start) + 8)
    ]
    slot = 1796228040000
    error = (
        f"lease run.sync.{slot} expired: instance web-1 stopped renewing it (lease_ttl 30s); "
        "recorded by web-3"
    )
    at = "2026-12-02T16:14:00.000Z"
    runs = [
        Run("sync", slot, "b", "web-2", False, "succeeded", at, at, at, at, 12, 200, None,
            attempt=2, trigger="rerun"),
        Run("sync", slot, "a", "web-1", False, "lost", at, at, at, at, 31020, None, error,
            attempt=1, trigger="scheduled"),
    ]  # fmt: skip
    assert output.runs_table(runs, ZoneInfo("Europe/Berlin")) == block.splitlines()
