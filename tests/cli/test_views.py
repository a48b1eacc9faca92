"""What the command line shows, as pure functions: tables line up, hostile text is escaped."""

from __future__ import annotations

from typing import Any

from sidecar.cli import status_text, views


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
    assert views.closest_name("SYNC", ["sync", "sink"]) == "sync"
    assert views.closest_name("synk", ["sync", "report"]) == "sync"
    assert views.closest_name("zzz", ["sync", "report"]) is None
    message = views.unknown_job("synk", ("sync", "report"), "in the config")
    assert message == "no job named 'synk' in the config; did you mean 'sync'? (jobs: sync, report)"
