"""A slot kept from its claim is said once per reason, not once a minute for ever.

Issue 39 item 9: a sidecar whose NATS user lacks the permissions repeated
"job a slot ... skipped: stream not checked yet" (or "state bucket not read
yet") about once a minute for as long as it ran. Now a job's skip is said
once per reason: again only when the reason changes, or when the job claimed
in between (and then is kept from its claims again). The count goes on
(``claims_skipped_total``). The clock here is a stand-in moved by hand: the
old code said it again after 60 s of it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from sidecar.config.load import load_config
from sidecar.core.clock import Clock, rfc3339
from sidecar.obs.metrics import Metrics
from sidecar.run.claim import Claim
from sidecar.run.context import Context
from sidecar.run.skips import SkipRecorder, Unclaimed
from tests.support import job, write_config


class HandClock:
    """Monotonic and wall time moved by the test (what Unclaimed reads of a Clock)."""

    def __init__(self) -> None:
        self.at = 1_800_000_000.0

    def monotonic(self) -> float:
        return self.at

    def wall(self) -> float:
        return self.at


def said(caplog: pytest.LogCaptureFixture, job_name: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sidecar.run.skips" and r.getMessage().startswith(f"job {job_name} slot ")
    ]


def test_a_skip_is_said_once_per_reason_until_the_job_claims_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.run.skips")
    config = load_config(
        str(
            write_config(
                tmp_path / "c.yaml",
                {
                    "nats": {"servers": ["nats://127.0.0.1:4222"]},
                    "target": {"url": "http://127.0.0.1:1"},
                    "jobs": [job("a"), job("b")],
                },
            )
        ),
        {},
    )
    a, b = config.job("a"), config.job("b")
    metrics = Metrics(CollectorRegistry())
    clock = HandClock()
    spawned: list[Any] = []
    hand = cast(Clock, clock)
    recorder = cast(SkipRecorder, None)  # only kept() records; skip() does not
    # Only what Unclaimed reads of the sidecar's Context (sidecar/run/context.py).
    ctx = SimpleNamespace(
        metrics=metrics,
        clock=hand,
        connected=asyncio.Event(),
        tasks=SimpleNamespace(spawn=spawned.append),
    )
    unclaimed = Unclaimed(cast(Context, ctx), recorder)

    # Two hours of slots, one a second, all kept from their claim for one reason.
    for _ in range(7200):
        clock.at += 1.0
        unclaimed.skip(a, int(clock.at * 1000), "stream", "stream not checked yet")
    assert said(caplog, "a") == [
        f"job a slot {rfc3339(1_800_000_001.0)} skipped: stream not checked yet"
    ], said(caplog, "a")[:5]
    assert metrics.claims_skipped_total.labels(job="a", reason="stream").value == 7200
    # Another job says its own, once.
    unclaimed.skip(b, int(clock.at * 1000), "stream", "stream not checked yet")
    assert len(said(caplog, "b")) == 1
    # The stream's trouble in other words (the stream check says those itself): nothing.
    for _ in range(3):
        clock.at += 61
        unclaimed.skip(a, int(clock.at * 1000), "stream", "state bucket not read yet")
    assert len(said(caplog, "a")) == 1
    # Something changed: the reason (a pause of the job).
    for _ in range(3):
        clock.at += 61
        unclaimed.skip(a, int(clock.at * 1000), "paused", "paused by ops at T")
    assert len(said(caplog, "a")) == 2 and said(caplog, "a")[-1].endswith("paused by ops at T")
    # It claimed again, then is kept again for the stream: said again, once.
    unclaimed.count(Claim("a", int(clock.at * 1000), "t", True, 1, 1, 0, 0.01))
    for _ in range(3):
        clock.at += 61
        unclaimed.skip(a, int(clock.at * 1000), "stream", "state bucket not read yet")
    assert len(said(caplog, "a")) == 3 and said(caplog, "a")[-1].endswith("not read yet")
    assert not spawned
