"""``history --output``: the app's answer under each run, escaped (sidecar/cli/answer_text.py)."""

from __future__ import annotations

import base64
from dataclasses import replace
from zoneinfo import ZoneInfo

from sidecar.cli.answer_text import answer_lines, runs_with_output
from sidecar.store.runs import Run

AT = "2026-12-02T16:13:00.000Z"
RUN = Run("sync", 1796227980000, "t", "web-1", False, "failed", AT, AT, AT, AT, 4, 500, "HTTP 500")


def test_no_answer_no_lines() -> None:
    assert answer_lines(RUN) == []


def test_text_line_by_line_escaped_and_cut() -> None:
    run = replace(
        RUN,
        answer="locked\n\x1b[2Jgone\u202eevil\r\n",
        answer_type="text/plain\x1b[31m",
        answer_cut=True,
    )
    assert answer_lines(run) == [
        "    answer (text/plain\\x1b[31m, first 24 bytes):",
        "    | locked",
        "    | \\x1b[2Jgone\\u202eevil\\r",
        "    | ... (cut)",
    ]


def test_binary_as_base64_lines() -> None:
    data = bytes(range(256))
    run = replace(RUN, answer=base64.b64encode(data).decode(), answer_base64=True)
    lines = answer_lines(run)
    assert lines[0] == "    answer (no content type, 256 bytes, binary, base64):"
    assert "".join(line[6:] for line in lines[1:]) == base64.b64encode(data).decode()
    assert all(len(line) <= 6 + 76 for line in lines[1:])


def test_under_each_runs_row() -> None:
    runs = [replace(RUN, answer="a"), replace(RUN, token="u")]
    lines = runs_with_output(runs, ZoneInfo("UTC"))
    assert lines[0].startswith("SCHEDULED")
    assert lines[2] == "    answer (no content type, 1 bytes):" and lines[3] == "    | a"
    assert len(lines) == 5 and "HTTP 500" in lines[4]
