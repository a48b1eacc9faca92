"""The checks behind hostile state: due keys, range checks, the bucket's settings,
permissions violations, the config digest. Pure tables, and a real nats-server
where NATS answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.js.api import KeyValueConfig

from sidecar.config.load import JobConfig, parse_config
from sidecar.core.bounds import MAX_SLOT_MS, attempt_no, epoch_s, seq_no, slot_ms
from sidecar.core.errors import Hostile
from sidecar.run.duecheck import config_problem, judge_result
from sidecar.store.bucketcheck import StateSpec, check_bucket
from sidecar.store.digests import job_hash
from sidecar.store.permissions import Denials, parse_violation
from sidecar.when.attempts import DueKey
from tests.support import MakeJobs, NatsServer, run_cli, write_config

NOW = 1_796_400_000.0  # a whole minute


def jobs(**extra: Any) -> list[JobConfig]:
    config = parse_config(
        {
            "jobs": [
                {"name": "sync", "schedule": "*/5 * * * *", "jitter": "2s", **extra},
            ]
        },
        {},
    )
    return list(config.jobs)


SYNC = jobs(retry={"max": 2, "backoff": "30s"}, on_lost="rerun")[0]


@pytest.mark.parametrize(
    ("slot", "attempt", "problem"),
    [
        (int(NOW * 1000) - 300_000, 2, None),
        (int(NOW * 1000), 3, None),
        (int(NOW * 1000) - 300_000, 4, "beyond the job's budget"),
        (int(NOW * 1000) - 60_000, 2, "not an instant of the job's schedule"),
        (int(NOW * 1000) + 300_000, 2, "in the future"),
        (MAX_SLOT_MS + 1, 2, "out of range"),
        (10**20, 2, "out of range"),
    ],
)
def test_config_problems_of_due_keys(slot: int, attempt: int, problem: str | None) -> None:
    found = config_problem(SYNC, DueKey("sync", slot, attempt), NOW)
    assert (found is None) if problem is None else (problem in str(found)), found


def result(**fields: Any) -> bytes:
    base = {"job": "sync", "slot": 1_000, "status": "failed", "token": "t", "attempt": 2}
    return json.dumps({**base, **fields}).encode()


def test_a_due_attempt_is_backed_only_by_a_failed_or_lost_result_of_the_attempt_before() -> None:
    due = DueKey("sync", 1_000, 3)
    # Failed attempt 2: due backoff * 2 after the server stored it, not when the key says.
    assert judge_result(SYNC, due, result(), 500.0) == (500.0 + 60.0, "retry")
    assert judge_result(SYNC, due, result(status="lost"), 500.0) == (500.0, "lost")
    for data, why in [
        (result(status="succeeded"), "ended 'succeeded'"),
        (result(attempt=1), "not of attempt 2"),
        (result(slot=2_000), "another slot"),
        (result(job="other"), "another slot"),
        (result(manual=True), "manual run"),
        (b"[1]", "is not one"),
        (b"\xff", "is not one"),
    ]:
        with pytest.raises(Hostile, match=why):
            judge_result(SYNC, due, data, 500.0)
    record = jobs(retry={"max": 2, "backoff": "1s"})[0]  # on_lost: record
    with pytest.raises(Hostile, match="does not rerun lost runs"):
        judge_result(record, due, result(status="lost"), 500.0)
    with pytest.raises(Hostile, match="no usable time"):
        judge_result(SYNC, due, result(), float("nan"))


def test_range_checks() -> None:
    assert slot_ms(0) == 0 and slot_ms(MAX_SLOT_MS) == MAX_SLOT_MS
    assert slot_ms(MAX_SLOT_MS + 1) is None and slot_ms(-1) is None
    assert slot_ms(True) is None and slot_ms(1e3) is None and slot_ms("5") is None
    assert attempt_no(None, 1) == 1 and attempt_no(11) == 11 and attempt_no(12) is None
    assert attempt_no(0) is None and attempt_no(False) is None
    assert seq_no(1) == 1 and seq_no(2**63) is None and seq_no(0) is None
    assert epoch_s(1.5) == 1.5 and epoch_s(float("inf")) is None and epoch_s(-1) is None


def test_permissions_violations_are_parsed_and_their_subject_spelt_as_used() -> None:
    text = 'nats: permissions violation for publish to "$kv.cron_state.lock.sync"'
    assert parse_violation(text) == ("publish", "$kv.cron_state.lock.sync")
    assert parse_violation('nats: permissions violation for subscription to "cron.>"') == (
        "subscribe",
        "cron.>",
    )
    assert parse_violation("nats: stale connection") is None
    now = [100.0]
    denials = Denials(clock=lambda: now[0])
    denials.known("CRON_STATE", "cron.", "sync")
    assert not denials.report("nats: stale connection")
    # A refused advisory subscription is no readiness problem (the checks poll).
    assert denials.report(
        'nats: permissions violation for subscription to "$js.event.advisory.stream.*.cron"'
    )
    assert denials.report('nats: permissions violation for publish to "$js.api.stream.update.cron"')
    assert denials.not_ready() is None
    assert denials.report(text)
    assert denials.denied("$KV.CRON_STATE.lock.sync")
    reason = denials.not_ready()
    assert reason is not None and "'$KV.CRON_STATE.lock.sync'" in reason
    now[0] += 121
    assert denials.not_ready() is None and not denials.denied("$KV.CRON_STATE.lock.sync")


def test_the_config_digest_leaves_out_the_apps_address() -> None:
    def digest(url: str, path: str = "/jobs/sync") -> str:
        config = parse_config(
            {
                "target": {"url": url},
                "jobs": [{"name": "sync", "schedule": "* * * * *", "request": {"path": path}}],
            },
            {},
        )
        return job_hash(config.jobs[0])

    assert digest("http://127.0.0.1:8080") == digest("http://127.0.0.1:9090")
    assert digest("http://127.0.0.1:8080") == digest("unix:///run/app.sock")
    assert digest("http://127.0.0.1:8080") != digest("http://127.0.0.1:8080", "/jobs/other")


async def test_the_bucket_check_sets_history_to_1_and_names_what_it_cannot_fix(
    nc: NATS,
) -> None:
    js = nc.jetstream()
    spec = StateSpec("CRON_STATE", 1, 60.0)
    await js.create_key_value(KeyValueConfig(bucket="CRON_STATE", history=5, limit_marker_ttl=120))
    seen = await check_bucket(js, spec, 3.0, fix=False)
    assert seen.facts.history == 5 and seen.problem and "history is 5" in seen.problem
    fixed = await check_bucket(js, spec, 3.0, fix=True)
    assert fixed.fixed == ["history 5 -> 1"] and fixed.problem is None
    assert (await js.stream_info("KV_CRON_STATE")).config.max_msgs_per_subject == 1
    await js.delete_key_value("CRON_STATE")
    await js.create_key_value(KeyValueConfig(bucket="CRON_STATE", history=1))
    bare = await check_bucket(js, spec, 3.0, fix=True)
    assert bare.problem is not None and "no marker TTL" in bare.problem
    assert "allow_msg_ttl" not in bare.problem  # only what is missing is named
    await js.delete_key_value("CRON_STATE")
    await js.create_key_value(KeyValueConfig(bucket="CRON_STATE", history=1, limit_marker_ttl=1))
    short = await check_bucket(js, spec, 3.0, fix=True)
    assert short.problem is not None and "shorter than lease_ttl" in short.problem


def test_resume_against_a_missing_bucket_names_it(tmp_path: Path, nats_server: NatsServer) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        {
            "nats": {"servers": [nats_server.url]},
            "jobs": [{"name": "sync", "schedule": "* * * * *"}],
        },
    )
    res = run_cli("resume", "sync", "-c", str(config))
    assert res.returncode == 1, res.stderr
    assert "state bucket CRON_STATE does not exist" in res.stderr, res.stderr
    assert "was not paused" not in res.stderr


async def test_a_run_that_ends_with_an_exception_is_logged_and_recorded(
    nc: NATS,
    make_jobs: MakeJobs,
    nats_server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: Any,
) -> None:
    """A bug (or hostile input) in a run's task: a failed result, not `running` for ever."""
    import asyncio

    from sidecar.run.claim import Claim
    from sidecar.store.stream import ensure_stream, stream_spec

    config = parse_config(
        {
            "nats": {"servers": [nats_server.url]},
            "jobs": [{"name": "tick", "schedule": "* * * * *"}],
        },
        {},
    )
    js = nc.jetstream()
    await ensure_stream(js, stream_spec(config))

    async def broken(*args: Any) -> None:
        raise OverflowError("a bug")

    async with make_jobs(config) as jobs:
        monkeypatch.setattr(jobs, "run_slot", broken)
        claim = Claim("tick", 1_796_400_000_000, "t" * 32, True, 1, 1, 0, 0.0)
        jobs._start_run(config.jobs[0], claim, 1_796_400_000.0)
        await asyncio.wait(set(jobs.runs), timeout=10)
    msg = await js.get_last_msg("CRON", "cron.tick.results")
    record = json.loads(msg.data or b"{}")
    assert record["status"] == "failed" and record["token"] == "t" * 32
    assert "internal error: OverflowError('a bug')" in record["error"]
    assert "the run ended with an error" in caplog.text
