"""The one publish loop of results (sidecar/run/record.py): tried again as its
``Retry`` says, against a real nats-server with no stream to answer."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

import pytest
from nats.aio.client import Client as NATS

from sidecar.core.excerpt import MAX_ANSWER_BYTES, excerpt
from sidecar.core.wire import SUCCEEDED, TRANSIENT, ResultRecord
from sidecar.run.record import Retry, publish_result, publish_with_retry


def record() -> ResultRecord:
    return ResultRecord(
        job="j",
        slot=1000,
        token="t" * 32,
        instance="a",
        status=SUCCEEDED,
        started_at="2026-12-03T00:00:00.000Z",
        finished_at="2026-12-03T00:00:01.000Z",
        duration_ms=1000,
        http_status=200,
        error=None,
    )


async def test_a_result_not_stored_is_tried_publish_tries_times_then_reads_0(
    nc: NATS, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "sidecar.run.record")
    assert await publish_result(nc.jetstream(), "NONE", "cron.", record(), 0.5, 3) == 0
    tries = [r.getMessage() for r in caplog.records if "recording the result failed" in r.message]
    assert len(tries) == 3 and "(try 3)" in tries[-1], tries


async def test_a_publish_with_a_time_limit_gives_up_then_raises_the_last_error(nc: NATS) -> None:
    retry = Retry(None, 0.3, 0.05, 0.1, TRANSIENT, logging.DEBUG)
    started = time.monotonic()
    with pytest.raises(TRANSIENT):
        await publish_with_retry(nc.jetstream(), "NONE", "cron.", record(), retry, timeout=0.5)
    assert 0.3 <= time.monotonic() - started < 5


async def test_a_result_too_large_for_the_stream_is_recorded_without_the_answer(
    nc: NATS, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream whose max_msg_size is below a record with the app's answer (8 KiB of
    it here) still gets the run's result, without the answer; a small one keeps it."""
    caplog.set_level(logging.WARNING, "sidecar.run.record")
    js = nc.jetstream()
    await js.add_stream(name="SMALL", subjects=["cron.>"], max_msg_size=2048)
    big = replace(record(), excerpt=excerpt(b"x" * 9000, MAX_ANSWER_BYTES, "text/plain"))
    seq = await publish_result(js, "SMALL", "cron.", big, 2.0, 3)
    assert seq
    data = json.loads((await js.get_msg("SMALL", seq)).data or b"")
    assert data["status"] == SUCCEEDED and data["token"] == big.token
    assert not {"answer", "answer_type", "answer_cut"} & set(data)
    assert "too large for NATS" in caplog.text
    small = replace(record(), token="s" * 32, excerpt=excerpt(b"done", 512, "text/plain"))
    seq = await publish_result(js, "SMALL", "cron.", small, 2.0, 3)
    data = json.loads((await js.get_msg("SMALL", seq)).data or b"")
    assert (data["answer"], data["answer_type"]) == ("done", "text/plain")
