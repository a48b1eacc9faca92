"""RateLimitedLog: the first report at once, then one line per interval with a count."""

from __future__ import annotations

import logging

import pytest

from sidecar.obs.ratelog import RateLimitedLog


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def limited(caplog: pytest.LogCaptureFixture) -> tuple[RateLimitedLog, FakeClock]:
    caplog.set_level(logging.DEBUG, logger="test.ratelog")
    clock = FakeClock()
    return RateLimitedLog(logging.getLogger("test.ratelog"), 60.0, clock), clock


def messages(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records]


def test_one_line_per_interval_with_the_count(
    limited: tuple[RateLimitedLog, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    rlog, clock = limited
    assert rlog.warning("nats", "nats: %s", "refused 1") is True
    for n in range(2, 61):  # one report a second for a minute
        clock.now += 1
        assert rlog.warning("nats", "nats: %s", f"refused {n}") is (n == 61)
    assert messages(caplog) == [("WARNING", "nats: refused 1")]
    clock.now += 1  # 61 s after the first line
    assert rlog.warning("nats", "nats: %s", "refused 61") is True
    assert messages(caplog)[-1] == ("WARNING", "nats: refused 61 (and 59 more times in 59s)")


def test_clear_tells_what_was_held_and_restarts(
    limited: tuple[RateLimitedLog, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    rlog, clock = limited
    rlog.warning("nats", "nats: %s", "eof")
    for n in range(1, 6):
        clock.now += 1
        rlog.warning("nats", "nats: %s", f"refused {n}")
    rlog.clear("nats")
    assert messages(caplog) == [
        ("WARNING", "nats: eof"),
        ("WARNING", "nats: refused 5 (and 4 more times in 4s)"),
    ]
    caplog.clear()
    rlog.clear("nats")  # nothing held: nothing to say
    clock.now += 1
    rlog.warning("nats", "nats: %s", "refused again")  # a new outage: at once
    assert messages(caplog) == [("WARNING", "nats: refused again")]


def test_kinds_are_counted_apart_and_levels_kept(
    limited: tuple[RateLimitedLog, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    rlog, clock = limited
    rlog.warning("nats", "nats down")
    rlog.log(logging.ERROR, "stream", "stream %s wrong", "CRON")
    clock.now += 1
    rlog.warning("nats", "nats down")
    rlog.clear("nats")
    rlog.clear("stream")
    assert messages(caplog) == [
        ("WARNING", "nats down"),
        ("ERROR", "stream CRON wrong"),
        ("WARNING", "nats down"),
    ]
