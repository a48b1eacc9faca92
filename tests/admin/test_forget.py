"""``forget JOB`` against a real nats-server: a retired job's keys removed, each by its
revision; refused for a job in use (a lease held, a job of the state bucket, a job
of the config given), a bad name, a bucket that does not exist. Refused while a
live instance runs the job: tests/fleet/test_orphans.py, with real sidecars."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
from nats.js.errors import KeyNotFoundError

from tests.support import NatsServer, RecordingApp, job, run_cli, write_config


def test_forget_removes_a_retired_jobs_keys_and_refuses_a_job_in_use(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = {"nats": {"servers": [nats_server.url]}, "target": {"url": http_app.url}}
    cli = str(write_config(tmp_path / "cli.yaml", {**config, "jobs": [job("keep")]}))
    gone = run_cli("forget", "old", "-c", cli)
    assert gone.returncode == 1 and "does not exist: nothing to forget" in gone.stderr
    retired = {"instance_id": "cli", **config, "jobs": [job(n) for n in ("old", "leased")]}
    cli_retired = str(write_config(tmp_path / "retired.yaml", retired))
    for name in ("old", "leased"):
        res = run_cli("pause", name, "-c", cli_retired, "--reason", "retired")
        assert res.returncode == 0, res.stderr

    async def write(key: str, value: bytes) -> None:
        nc = await nats.connect(nats_server.url)
        try:
            kv = await nc.jetstream().key_value("CRON_STATE")
            await kv.put(key, value)
        finally:
            await nc.close()

    for key in ("count.old", "skip.old", "since.old", "lock.leased", "job.bucketjob"):
        asyncio.run(write(key, b'{"n": 3, "instance": "gone"}'))

    def forget(name: str) -> tuple[int, str, str]:
        res = run_cli("forget", name, "-c", cli)
        return res.returncode, res.stdout, res.stderr

    code, _, err = forget("leased")
    assert code == 1 and "a run holds a lease (lock.leased)" in err, err
    code, _, err = forget("bucketjob")
    assert code == 1 and "`job remove bucketjob` first" in err, err
    code, _, err = forget("keep")
    assert code == 2 and "keep is a job of the config file" in err, err
    code, _, err = forget("a.b")
    assert code == 2 and "not a job name" in err, err  # the name option refuses it first
    code, out, err = forget("old")
    assert code == 0, err
    assert out == "old: forgotten: removed count.old, paused.old, since.old, skip.old\n"
    code, _, err = forget("old")
    assert code == 1 and "old: no key of this job in the state bucket" in err, err

    # The job in use keeps everything; the bucket job too.
    async def there(keys: tuple[str, ...]) -> list[str]:
        nc = await nats.connect(nats_server.url)
        try:
            kv = await nc.jetstream().key_value("CRON_STATE")
            out = []
            for key in keys:
                try:
                    await kv.get(key)
                    out.append(key)
                except KeyNotFoundError:  # also KeyDeletedError
                    pass
            return out
        finally:
            await nc.close()

    kept = ("paused.leased", "lock.leased", "job.bucketjob")
    assert asyncio.run(there(kept)) == list(kept)
    assert asyncio.run(there(("paused.old", "count.old", "skip.old", "since.old"))) == []
