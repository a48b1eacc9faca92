"""The commands that act on a job also act on a job added with `job add` (issue 51).

docs/CONFIG.md promises a job of the state bucket the same pause, skip and
backfill as a job of the file. Two real sidecars on a real nats-server run
a job added with `job add`; `run-now`, `at`, `skip`, `unskip`, `backfill`,
`pause` and `resume` name it with the file's config (which does not) and do
what they do for a file job: the app is called, the fleet pauses it. A name
that is neither the file's nor the bucket's still exits 2 with the closest name.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    base,
    cli_config,
    run_cli,
    sidecars,
    wait_for,
)

NAME = "tenant-42-report"
PATH = f"/jobs/{NAME}"
# A file job that never comes due during the test: the config needs one.
YEARLY = {"name": "keep", "schedule": "0 0 1 1 *"}


def paused_everywhere(procs: list[Sidecar], value: float) -> bool:
    return all(p.metric("anarchon_job_paused", {"job": NAME}) == value for p in procs)


def triggers(app: RecordingApp) -> list[str]:
    return [r.headers["X-Anarchon-Trigger"] for r in app.requests_for(PATH)]


def test_pause_skip_at_run_now_and_backfill_find_a_job_of_the_bucket(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [YEARLY])
    cfg = cli_config(tmp_path, config)
    added_job = tmp_path / "job.yaml"
    # Hourly, half an hour from now (its next run within the hour, so it has a series):
    # no slot of its own comes due while the test runs (every 10 minutes did, 1 run in 60).
    minute = (time.gmtime().tm_min + 30) % 60
    added_job.write_text(
        yaml.safe_dump({"name": NAME, "schedule": f"{minute} * * * *", "timezone": "UTC"})
    )
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        added = run_cli("job", "add", str(added_job), "-c", cfg)
        assert added.returncode == 0, added.stderr
        wait_for(
            lambda: all(
                (p.metric("anarchon_job_next_run_timestamp_seconds", {"job": NAME}) or 0) > 0
                for p in procs
            ),
            5,
            what="the bucket job taken up",
        )

        now = run_cli("run-now", NAME, "-c", cfg)
        assert now.returncode == 0, now.stderr
        assert triggers(http_app) == ["manual"]

        at = run_cli("at", NAME, "2s", "-c", cfg)
        assert at.returncode == 0, at.stderr
        wait_for(lambda: triggers(http_app) == ["manual", "at"], 10, what="the one-off run")

        skipped = run_cli("skip", NAME, "-c", cfg)
        assert skipped.returncode == 0, skipped.stderr
        unskipped = run_cli("unskip", NAME, "-c", cfg)
        assert unskipped.returncode == 0, unskipped.stderr
        assert "1 pending skip(s) cancelled" in unskipped.stdout

        planned = run_cli("backfill", NAME, "--from", "35m", "--dry-run", "-c", cfg)
        assert planned.returncode == 0, planned.stderr
        assert "1 slot(s)" in planned.stdout, planned.stdout  # the one 30 minutes ago

        paused = run_cli("pause", NAME, "-c", cfg, "--reason", "tenant moves")
        assert paused.returncode == 0, paused.stderr
        wait_for(lambda: paused_everywhere(procs, 1), 5, what="paused everywhere")
        resumed = run_cli("resume", NAME, "-c", cfg)
        assert resumed.returncode == 0, resumed.stderr
        wait_for(lambda: paused_everywhere(procs, 0), 5, what="resumed everywhere")

        typo = run_cli("pause", "tenant-42-reprot", "-c", cfg)
        assert typo.returncode == 2, typo
        assert typo.stderr.strip().endswith(
            "no job named 'tenant-42-reprot' in the config or in the state bucket; "
            f"did you mean '{NAME}'? (jobs: keep, {NAME})"
        ), typo.stderr
