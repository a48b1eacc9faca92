"""The schedule in words: a table of expressions and what people read (``check``,
``status``, the fleet page and the API all use sidecar.when.describe)."""

from __future__ import annotations

from zoneinfo import ZoneInfo

import pytest

from sidecar.when.describe import describe, schedule_lines
from sidecar.when.slots import parse_calendar


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("* * * * *", "Every minute"),
        ("*/5 * * * *", "Every 5 minutes"),
        ("*/15 * * * *", "Every 15 minutes"),
        ("*/7 * * * *", "Every seventh minute of every hour"),  # restarts each hour
        ("0 */6 * * *", "Every 6 hours"),
        ("0 */5 * * *", "At minute 0 past every fifth hour"),  # 24 is not a multiple of 5
        ("0 */2 * * *", "Every 2 hours"),
        ("*/2 * * * * *", "Every 2 seconds"),
        ("*/10 * * * * *", "Every 10 seconds"),
        ("0 */10 * * * *", "Every 10 minutes"),
        ("30 */10 * * * *", "At second 30 every 10th minute past every hour"),
        ("30 0 0 * * *", "At 00:00:30 every day"),
        ("0 * * * *", "At the start of every hour"),
        ("5 * * * *", "At minute 5 of every hour"),
        ("0,30 * * * *", "At minutes 0 and 30 of every hour"),
        ("0 3 * * *", "At 03:00 every day"),
        ("30 2 * * *", "At 02:30 every day"),
        ("0 3 * * 1-5", "At 03:00 on Monday through Friday"),
        ("0 9 * * MON-FRI", "At 09:00 on Monday through Friday"),
        ("0 9,17 * * MON", "At 09:00 and 17:00 on Monday"),
        ("0 9,18 * * *", "At 09:00 and 18:00 every day"),
        ("0 12 * * 0,6", "At 12:00 on Sunday and Saturday"),
        (
            "*/15 9-17 * * 1-5",
            "Every 15th minute from 09:00 through 17:59 on Monday through Friday",
        ),
        ("30 2 1 * *", "At 02:30 on the first day of every month"),
        ("0 0 */2 * *", "At 00:00 on every second day of month"),
        ("0 0 29 2 *", "At 00:00 on February 29"),
        ("0 0 1 jan,JUL *", "At 00:00 on the first day of January and July"),
        ("0 0 L * *", "At 00:00 on the last day of every month"),
        ("0 0 LW * *", "At 00:00 on the last weekday of every month"),
        ("0 18 * * 5L", "At 18:00 on the last Friday of the month"),
        ("0 9 * * 1#2", "At 09:00 on the second Monday of the month"),
        # Both day fields restricted: either matches (the union of the two).
        ("0 0 1,15 * 5", "At 00:00 on the first and the 15th day of month and on Friday"),
        ("  0   3 * *   * ", "At 03:00 every day"),
    ],
)
def test_words(expr: str, words: str) -> None:
    assert describe(expr, "") == words


def test_the_timezone_is_named_and_nonsense_is_shown_as_it_is() -> None:
    assert describe("0 3 * * *", "Europe/Berlin") == "At 03:00 every day (Europe/Berlin)"
    assert describe("not a cron", "UTC") == "not a cron"
    assert describe("61 * * * *", "") == "61 * * * *"


def test_schedule_lines_name_everything_check_shows() -> None:
    cal = parse_calendar(
        ["0 9 * * 1#2", "0 0 L * *"],
        ZoneInfo("Europe/Berlin"),
        "nightly-report",
        3600,
        ["2026-12-24"],
    )
    lines = schedule_lines(cal)
    assert lines[0] == "schedule '0 9 * * 1#2': At 09:00 on the second Monday of the month"
    assert lines[1] == "schedule '0 0 L * *': At 00:00 on the last day of every month"
    assert "spread 3600s: every slot 3264s later (from the job name)" in lines
    assert "excluded: 2026-12-24" in lines
    assert lines[-1].startswith("uses '#' (nth weekday), 'L' (last), spread")
    assert lines[-1].endswith(
        "the reference backend (the NatsBackend of anarchon's JavaScript scheduler) "
        "cannot run this job if it shares the stream; sidecars can"
    )
    assert schedule_lines(parse_calendar("*/5 * * * *", ZoneInfo("UTC"))) == [
        "schedule '*/5 * * * *': Every 5 minutes"
    ]
