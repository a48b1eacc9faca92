"""Due keys of a job not in the job set when delivered (sidecar/run/retries.py).

A job of the state bucket is put into the set after the start's full read told
its due keys: they are kept, and competed for once the job is put. Kept for at
most ``MAX_UNKNOWN`` keys (another fleet may share the bucket), each let go when
it leaves the view. The end to end case, with real processes:
tests/admin/test_bucket_job_retry.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from sidecar.config.load import parse_config
from sidecar.run import retries
from tests.admin.test_bucket_takeup_loop import capped
from tests.support import MakeJobs, until


async def test_due_keys_of_a_job_put_later_are_competed_for_and_the_kept_ones_capped(
    make_jobs: MakeJobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retries, "MAX_UNKNOWN", 20)
    config = capped(10)
    async with make_jobs(config) as jobs:
        view = jobs.ctx.fleet.view
        view.synced = True
        jobs.ctx.guard.looked = True  # past the start: no slot waits for the first look
        due = jobs.due.made()
        competed: list[str] = []

        async def compete(job: Any, parsed: Any, key: str, *rest: Any) -> None:
            competed.append(key)

        due._due_attempt = compete  # type: ignore[method-assign]
        revision = 0

        def deliver(key: str) -> None:
            nonlocal revision
            revision += 1
            # The fleet's listeners tell the due attempts (``DueOnFirstUse``).
            view.apply(key, json.dumps({"reason": "retry"}).encode(), revision, False)

        deliver("due.later.1000.2")
        foreign = [f"due.other.{slot}.2" for slot in range(1000, 1030)]
        for key in foreign:
            deliver(key)
        assert due._unknown_count == 20  # the cap: the rest of another fleet's let go
        for key in foreign:  # claimed or expired where they were made
            revision += 1
            view.apply(key, None, revision, True, "DEL")
        deliver("due.later.2000.2")  # kept: the gone ones were let go when they left
        assert due._unknown_count == 2
        await asyncio.sleep(0)  # a task spawned for one of them would have begun
        assert competed == []

        later = parse_config(
            {
                "target": {"url": "http://127.0.0.1:9"},
                "jobs": [{"name": "later", "schedule": "* * * * *"}],
            },
            {},
        ).jobs
        jobs.ctx.jobs.put(later)  # as the take-up puts a job of the state bucket
        await until(lambda: len(competed) == 2, 5, what="both competed for")
        assert sorted(competed) == ["due.later.1000.2", "due.later.2000.2"]
        assert "later" not in due._unknown and due._unknown_count == 0
