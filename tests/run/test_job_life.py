"""A job's life (sidecar/run/job_loop.py) built without the daemon, against a real nats-server
and a real HTTP app: its parts wired as the daemon wires them (the ``make_jobs``
fixture, tests/conftest.py), nothing mocked.

Each ending of a won claim (succeeded, failed then retried, cut off by the
drain, skipped on overlap, lost) is read back from the stream: one record,
built by ``ResultRecord`` alone (its fields are imported, never retyped),
counted once; the tasks lost-run judging starts are part of the drain.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from sidecar.config.load import Config, JobConfig, parse_config
from sidecar.core.excerpt import Excerpt
from sidecar.core.tasks import cancel_all
from sidecar.core.wire import FAILED, LOST, SKIPPED, SUCCEEDED, ResultRecord, results_subject
from sidecar.fleet.member import Fleet
from sidecar.obs.metrics import Metrics
from sidecar.run.job_loop import Jobs
from sidecar.store.kv import Keys
from sidecar.store.state import EXPIRED, Entry, Removal
from sidecar.when.attempts import due_key, run_key
from tests.support import MakeJobs, NatsServer, RecordingApp, job, until


@dataclass
class Life:
    """One sidecar's job loops, wired as the daemon wires them."""

    config: Config
    jobs: Jobs
    metrics: Metrics
    fleet: Fleet
    stopping: asyncio.Event

    @property
    def job(self) -> JobConfig:
        return self.config.jobs[0]

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {"job": self.job.name, **labels})
        return value or 0.0

    async def runs_done(self, timeout: float = 15.0) -> None:
        if self.jobs.runs:
            _, pending = await asyncio.wait(set(self.jobs.runs), timeout=timeout)
            assert not pending, "runs still going"


@contextlib.asynccontextmanager
async def life(
    make_jobs: MakeJobs, nats_server: NatsServer, app: RecordingApp, instance: str, **extra: Any
) -> AsyncIterator[Life]:
    config = parse_config(
        {
            "instance_id": instance,
            "nats": {"servers": [nats_server.url], "lease_ttl": "3s"},
            "target": {"url": app.url, "timeout": "30s"},
            "shutdown_grace": "1s",
            "jobs": [job("work", max_late="10s", **extra)],
        },
        {},
    )
    async with make_jobs(config) as jobs, running(jobs):
        try:
            yield Life(config, jobs, jobs.metrics, jobs.fleet, jobs.stopping)
        finally:
            jobs.stopping.set()
            jobs.wake()
            await cancel_all([*jobs.runs, *jobs.background()])


@contextlib.asynccontextmanager
async def running(jobs: Jobs) -> AsyncIterator[None]:
    """The stream guard's loop and the fleet's watch of `jobs` started, until the
    stream is checked and the state bucket read; both stopped on exit."""
    guard, fleet = jobs.guard, jobs.fleet
    watcher = asyncio.create_task(guard.run(jobs.js))
    fleet.start(jobs.js)
    try:
        await until(
            lambda: guard.stream_ready and fleet.view.synced and fleet.leases_ok,
            15,
            "the stream checked and the state bucket read",
        )
        yield
    finally:
        await fleet.stop()
        await cancel_all([watcher])


async def next_second(one: Life) -> int:
    """The next slot (the job runs every second), once its time has come."""
    slot = (int(time.time()) + 1) * 1000
    await one.jobs.sleep_until(slot / 1000)
    return slot


async def results(js: JetStreamContext, spec_name: str = "CRON") -> list[dict[str, Any]]:
    """Every result record of the job, decoded, checked to be a ``ResultRecord`` as is."""
    info = await js.stream_info(spec_name)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg(spec_name, seq)
        if msg.subject != results_subject("cron.", "work"):
            continue
        data = json.loads(msg.data or b"{}")
        # Built by ResultRecord and nothing else: the record read back is one, byte for byte.
        known = {f.name: data[f.name] for f in fields(ResultRecord) if f.name in data}
        if "answer" in data:  # the start of the app's answer: one Excerpt's fields
            known["excerpt"] = Excerpt(
                data["answer"],
                data.get("answer_type"),
                data.get("answer_base64", False),
                data.get("answer_cut", False),
            )
        required = [f.name for f in fields(ResultRecord) if f.default is MISSING]
        missing = [name for name in required if name not in data]
        assert not missing, missing
        assert ResultRecord(**known).to_json() == msg.data
        out.append(data)
    return out


async def test_a_won_slot_runs_once_and_ends_in_one_succeeded_record(
    nc: NATS, make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    async with (
        life(make_jobs, nats_server, http_app, "a") as a,
        life(make_jobs, nats_server, http_app, "b") as b,
    ):
        slot = await next_second(a)
        now = time.time()
        await asyncio.gather(a.jobs.attempt(a.job, slot, now), b.jobs.attempt(b.job, slot, now))
        await a.runs_done()
        await b.runs_done()
        assert len(http_app.requests_for("/jobs/work")) == 1
        [record] = await results(nc.jetstream())
        winner, loser = (a, b) if record["instance"] == "a" else (b, a)
        assert (record["status"], record["slot"], record["http_status"]) == (SUCCEEDED, slot, 200)
        assert record["trigger"] == "scheduled" and "attempt" not in record
        assert winner.metric("anarchon_runs_total", status=SUCCEEDED) == 1
        assert winner.metric("anarchon_job_last_success_timestamp_seconds") > 0
        assert loser.metric("anarchon_claims_lost_total") == 1
        assert loser.metric("anarchon_runs_total", status=SUCCEEDED) == 0


async def test_a_failed_attempt_is_recorded_failed_and_its_retry_made_due(
    nc: NATS, make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.status["/jobs/work"] = 500
    async with life(make_jobs, nats_server, http_app, "a", retry={"max": 1, "backoff": "30s"}) as a:
        slot = await next_second(a)
        await a.jobs.attempt(a.job, slot, time.time())
        await a.runs_done()
        [record] = await results(nc.jetstream())
        assert (record["status"], record["http_status"]) == (FAILED, 500)
        assert a.metric("anarchon_runs_total", status=FAILED) == 1
        key = due_key("work", slot, 2)
        await until(lambda: key in a.fleet.view.keys, 10, "the retry's due key")
        due = a.fleet.view.keys[key].value
        assert due["reason"] == "retry" and due["instance"] == "a"
        assert due["due_at"] >= time.time() + 20  # backoff 30s after the failure
        assert a.metric("anarchon_attempts_due_total", reason="retry") == 1


async def test_a_run_cut_off_by_the_drain_is_recorded_failed_interrupted(
    nc: NATS, make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.delay["/jobs/work"] = 30.0
    async with life(make_jobs, nats_server, http_app, "a") as a:
        await a.jobs.attempt(a.job, await next_second(a), time.time())
        await until(lambda: http_app.requests_for("/jobs/work"), 10, "the request")
        await cancel_all(set(a.jobs.runs))
        [record] = await results(nc.jetstream())
        assert record["status"] == FAILED and record["error"].startswith("interrupted")
        assert a.metric("anarchon_runs_in_progress") == 0
        assert a.metric("anarchon_runs_total", status=FAILED) == 1


async def test_a_slot_won_while_the_overlap_lock_is_held_is_recorded_skipped(
    nc: NATS, make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.delay["/jobs/work"] = 3.0
    async with life(make_jobs, nats_server, http_app, "a", overlap="skip") as a:
        slot = await next_second(a)
        await a.jobs.attempt(a.job, slot, time.time())
        await until(lambda: http_app.requests_for("/jobs/work"), 10, "the first run")
        await a.jobs.attempt(a.job, await next_second(a), time.time())
        await a.runs_done()
        records = await results(nc.jetstream())
        by_slot = {r["slot"]: r for r in records}
        assert by_slot[slot]["status"] == SUCCEEDED
        skipped = by_slot[slot + 1000]
        assert skipped["status"] == SKIPPED and skipped["error"].startswith("overlap: slot ")
        assert "trigger" not in skipped and skipped["http_status"] is None  # nothing sent
        assert len(http_app.requests_for("/jobs/work")) == 1
        assert a.metric("anarchon_runs_skipped_total", reason="overlap") == 1
        assert a.metric("anarchon_runs_total", status=SKIPPED) == 1


async def test_an_expired_lease_is_recorded_lost_once_and_judging_is_part_of_the_drain(
    nc: NATS, make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    async with (
        life(make_jobs, nats_server, http_app, "a") as a,
        life(make_jobs, nats_server, http_app, "b") as b,
    ):
        slot = await next_second(a)
        key = run_key("work", slot, 1)
        value = {"job": "work", "slot": slot, "attempt": 1, "token": "t" * 32}
        value |= {"instance": "gone", "started_at": "2026-01-01T00:00:00.000Z"}
        bucket = a.fleet.bucket
        assert bucket is not None
        await Keys(bucket).create(key, value, ttl=1)  # its runner never renews it

        def lost_total() -> float:
            return sum(one.metric("anarchon_runs_total", status=LOST) for one in (a, b))

        await until(lost_total, 20, "the lost record")
        await until(lambda: not a.jobs.lost.tasks and not b.jobs.lost.tasks, 10, "judging done")
        lost = [r for r in await results(nc.jetstream()) if r["status"] == LOST]
        assert len(lost) == 1 and lost[0]["instance"] == "gone" and lost[0]["slot"] == slot
        assert lost_total() == 1
        assert sum(one.metric("anarchon_runs_lost_total") for one in (a, b)) == 1
        # The same expiry judged again: its task is one the drain awaits, and it
        # finds the lost record and refrains.
        removal = Removal(key, Entry(value, 1), EXPIRED, time.time())
        a.jobs.lost.removed(removal)
        assert a.jobs.lost.tasks and a.jobs.lost.tasks <= a.jobs.background()
        _, pending = await asyncio.wait(set(a.jobs.lost.tasks), timeout=10)
        assert not pending
        assert len([r for r in await results(nc.jetstream()) if r["status"] == LOST]) == 1
        # Draining: an expiry seen now starts nothing the drain would not await.
        a.stopping.set()
        a.jobs.lost.removed(removal)
        assert not a.jobs.lost.tasks


def test_result_records_are_built_in_one_place() -> None:
    """Every ending goes through sidecar/run/record.py: no other module builds a record."""
    package = Path(__file__).resolve().parents[2] / "sidecar"
    builders = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                if name == ResultRecord.__name__:
                    builders.add(path.name)
    assert builders == {"record.py"}
