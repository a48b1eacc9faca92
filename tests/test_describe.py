"""The schedule in words: a table of expressions and what people read."""

from __future__ import annotations

import pytest

from sidecar.describe import describe


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("* * * * *", "Every minute"),
        ("*/5 * * * *", "Every 5 minutes"),
        ("*/15 * * * *", "Every 15 minutes"),
        ("*/7 * * * *", "Every seventh minute of every hour"),  # restarts each hour
        ("0 */6 * * *", "Every 6 hours"),
        ("0 */5 * * *", "At minute 0 past every fifth hour"),  # 24 is not a multiple of 5
        ("*/2 * * * * *", "Every 2 seconds"),
        ("0 */10 * * * *", "Every 10 minutes"),
        ("30 */10 * * * *", "At second 30 every 10th minute past every hour"),
        ("5 * * * *", "At minute 5 of every hour"),
        ("0,30 * * * *", "At minutes 0 and 30 of every hour"),
        ("0 3 * * *", "At 03:00 every day"),
        ("0 3 * * 1-5", "At 03:00 on Monday through Friday"),
        ("0 9,17 * * MON", "At 09:00 and 17:00 on Monday"),
        ("30 2 1 * *", "At 02:30 on the first day of every month"),
        ("0 0 29 2 *", "At 00:00 on February 29"),
        ("  0   3 * *   * ", "At 03:00 every day"),
    ],
)
def test_words(expr: str, words: str) -> None:
    assert describe(expr, "") == words


def test_the_timezone_is_named_and_nonsense_is_shown_as_it_is() -> None:
    assert describe("0 3 * * *", "Europe/Berlin") == "At 03:00 every day (Europe/Berlin)"
    assert describe("not a cron", "UTC") == "not a cron"
    assert describe("61 * * * *", "") == "61 * * * *"
