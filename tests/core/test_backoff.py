"""Backoff: waits double from start to cap, jitter stays in its band, deadlines cut."""

from __future__ import annotations

import asyncio
import random

import pytest

from sidecar.core.backoff import Backoff


def waits(backoff: Backoff, n: int, at_most: float | None = None) -> list[float]:
    return [backoff.next(at_most) for _ in range(n)]


@pytest.mark.parametrize(
    ("start", "cap", "expected"),
    [
        (0.02, 1.0, [0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0]),
        (0.2, 30.0, [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]),
        (0.1, 5.0, [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]),
        (1.0, 1.0, [1.0, 1.0, 1.0]),  # a fixed wait
    ],
)
def test_doubles_from_start_up_to_the_cap(start: float, cap: float, expected: list[float]) -> None:
    assert waits(Backoff(start, cap), len(expected)) == pytest.approx(expected)


def test_an_uncapped_backoff_keeps_doubling() -> None:
    assert waits(Backoff(1.0, float("inf")), 5) == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_current_is_the_next_wait_before_jitter() -> None:
    backoff = Backoff(0.1, 5.0, jitter=0.5)
    assert backoff.current == 0.1
    backoff.next()
    assert backoff.current == 0.2


def test_jitter_stays_in_its_band_and_varies() -> None:
    rng = random.Random(7)
    backoff = Backoff(1.0, 1.0, jitter=0.5, uniform=rng.uniform)
    seen = waits(backoff, 500)
    assert min(seen) >= 0.5
    assert max(seen) <= 1.5
    assert min(seen) < 0.6 and max(seen) > 1.4  # the whole band is used
    assert len(set(seen)) > 400


def test_jitter_is_applied_to_the_capped_wait() -> None:
    backoff = Backoff(0.5, 1.0, jitter=0.2, uniform=lambda lo, hi: hi)
    assert waits(backoff, 4) == pytest.approx([0.6, 1.2, 1.2, 1.2])


def test_at_most_cuts_a_wait_and_never_goes_below_zero() -> None:
    backoff = Backoff(1.0, 8.0)
    assert backoff.next(at_most=0.25) == 0.25
    assert backoff.next(at_most=-3.0) == 0.0  # a deadline already passed
    assert backoff.next(at_most=100.0) == 4.0  # the sequence went on meanwhile


def test_reset_starts_again() -> None:
    backoff = Backoff(0.2, 30.0)
    waits(backoff, 6)
    backoff.reset()
    assert waits(backoff, 2) == pytest.approx([0.2, 0.4])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": 0.0, "cap": 1.0}, "start must be > 0"),
        ({"start": 2.0, "cap": 1.0}, "must be >= its start"),
        ({"start": 0.1, "cap": 1.0, "jitter": 1.0}, "jitter must be in"),
        ({"start": 0.1, "cap": 1.0, "factor": 0.5}, "factor must be >= 1"),
    ],
)
def test_nonsense_is_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Backoff(**kwargs)


async def test_sleep_waits_the_next_wait_bounded_by_at_most() -> None:
    backoff = Backoff(30.0, 60.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(backoff.sleep(at_most=0.01), 5.0)  # 30 s cut to 10 ms
    assert loop.time() - started < 5.0
    assert backoff.current == 60.0
