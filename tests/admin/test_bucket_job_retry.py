"""A retry of a job of the state bucket made due before a sidecar starts.

Due attempts are made by the first due key (sidecar/run/onkey.py
``DueOnFirstUse``). At a start, the full read of the bucket tells each
``due.`` key before the ``job.`` keys are taken up (sidecar/store/watch.py,
then sidecar/admin/bucket_jobs.py after its gather): the due key of a bucket
job names a job not in the job set yet. Once the job is taken up, that key must
still be competed for, or a fleet restarted between a failure and its retry
(a single sidecar, a rolling restart of all) loses the retry.

Real sidecar processes on a real nats-server.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.admin.test_bucket_jobs import YEARLY, job_file
from tests.support import (
    NatsServer,
    RecordingApp,
    base,
    cli_config,
    run_cli,
    sidecars,
    wait_for,
)

PATH = "/jobs/rt"


def one_failing_slot(lead: int = 5) -> dict[str, Any]:
    """Job rt: one slot, `lead` s from now (it fails), its retry due 2 s after."""
    at = time.gmtime(int(time.time()) + lead)
    return {
        "name": "rt",
        "schedule": f"{at.tm_sec} {at.tm_min} {at.tm_hour} * * *",
        "timezone": "UTC",
        "max_late": "60s",
        "retry": {"max": 1, "backoff": "2s"},
    }


def retry_made_due(a: Any, http_app: RecordingApp, within: float = 10) -> None:
    """Until rt's attempt 1 reached the app (and failed) and `a` made its retry due."""
    wait_for(lambda: len(http_app.requests_for(PATH)) == 1, within, what="attempt 1")
    wait_for(
        lambda: a.metric("anarchon_attempts_due_total", {"job": "rt"}) == 1,
        5,
        what="its retry made due",
    )


@pytest.mark.parametrize("origin", ["bucket", "file"])
def test_a_retry_due_before_a_restart_runs_after_it(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, origin: str
) -> None:
    """The due attempts are made by the due key the start's full read tells
    (``DueOnFirstUse``); of a job of the state bucket, competed for once the job is
    taken up."""
    # The file's job: its slot must still be ahead once the sidecar is up (a
    # loaded start takes seconds); the bucket's is made once it is.
    in_file = [one_failing_slot(lead=10)] if origin == "file" else []
    config = base(nats_server, http_app, [YEARLY, *in_file])
    cfg = cli_config(tmp_path, config)
    http_app.status[PATH] = 500
    with sidecars(tmp_path, [("a", config, {})]) as (a,):
        if origin == "bucket":
            rt = one_failing_slot()
            added = run_cli("job", "add", job_file(tmp_path, "rt", rt), "-c", cfg)
            assert added.returncode == 0, added.stderr
        retry_made_due(a, http_app, within=15)
        # Restarted before the retry's time: the due key is in the bucket at the start.
        assert a.terminate() == 0
        http_app.status[PATH] = 200
        a.start().wait_ready()
        wait_for(lambda: len(http_app.requests_for(PATH)) == 2, 12, what="attempt 2")
    attempts = [r.headers.get("X-Anarchon-Attempt") for r in http_app.requests_for(PATH)]
    assert attempts == ["1", "2"], attempts


def test_a_retry_due_when_its_job_is_removed_is_not_claimed(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """`job remove` claims nothing more of the job (docs/CLI.md): a retry already made
    due, whose wait began before the removal, is not claimed after it."""
    config = base(nats_server, http_app, [YEARLY])
    cfg = cli_config(tmp_path, config)
    http_app.status[PATH] = 500
    with sidecars(tmp_path, [("a", config, {})]) as (a,):
        rt = one_failing_slot()
        added = run_cli("job", "add", job_file(tmp_path, "rt", rt), "-c", cfg)
        assert added.returncode == 0, added.stderr
        retry_made_due(a, http_app)
        removed = run_cli("job", "remove", "rt", "-c", cfg)
        assert removed.returncode == 0, removed.stderr
        wait_for(lambda: "job rt (id rt) left the state bucket" in a.log(), 5, what="rt let go")
        # At the retry's time (2 s after attempt 1, plus the failed replica's wait) it
        # is let go, not claimed, nor counted skipped (the job-not-running alert would
        # fire for a job removed on purpose: docs/METRICS.md, claims_skipped_total).
        skipped = {"job": "rt"}
        wait_for(
            lambda: (
                "attempt 2 not claimed" in a.log()
                or a.metric("anarchon_claims_skipped_total", skipped)
            ),
            10,
            what="the retry's time",
        )
        assert not a.metric("anarchon_claims_skipped_total", skipped), a.log()
        assert "stream not checked yet" not in a.log()
    assert len(http_app.requests_for(PATH)) == 1, "the retry ran after `job remove`"
