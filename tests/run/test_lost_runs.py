"""Lost runs (sidecar/run/retries.py) against a real nats-server, and how history reads them.

A lease that expired after its result is not lost (though later results hide
it); a result stored between the check and the lost record wins; an expiry
reported as an empty put still reads as one; a real result wins over lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from sidecar.config.load import Config, parse_config
from sidecar.core.wire import LOST, SKIPPED, SUCCEEDED, ResultRecord
from sidecar.obs.metrics import Metrics
from sidecar.run.lostruns import LOOKS_AT_ONCE, RECHECKS, LostRuns
from sidecar.run.record import publish_result
from sidecar.store import state
from sidecar.store.bucketcheck import StateSpec
from sidecar.store.kv import Keys
from sidecar.store.runs import join_runs
from sidecar.store.state import EXPIRED, UNSEEN, Removal, View, ensure_bucket
from sidecar.store.stream import StreamSpec, ensure_stream, stream_spec
from tests.support import MakeJobs, NatsServer, until


def lease_value(token: str = "t1", instance: str = "me") -> dict[str, object]:
    return {"job": "j", "slot": 1000, "attempt": 1, "token": token, "instance": instance}


def test_history_shows_one_row_per_attempt_and_a_real_result_wins_over_lost() -> None:
    def claim(token: str, attempt: int | None) -> bytes:
        body: dict[str, object] = {"job": "j", "slot": 60000, "token": token, "instance": "a"}
        if attempt is not None:
            body["attempt"] = attempt
        return json.dumps(body).encode()

    def result(token: str, status: str) -> bytes:
        return json.dumps({"job": "j", "token": token, "status": status}).encode()

    c, r = "cron.j.claims", "cron.j.results"
    messages = [
        (1, c, claim("t1", None)),
        (2, r, result("t1", LOST)),
        (3, c, claim("t2", 2)),
        (4, r, result("t2", SUCCEEDED)),
        (5, r, result("t1", SUCCEEDED)),  # the stopped runner came back
        (6, r, result("t1", LOST)),  # a lost copy after it changes nothing
        (7, c, claim("t3", None)),
        (8, r, result("t3", SKIPPED)),
    ]
    runs = join_runs("j", messages, "cron.").runs
    assert [(run.token, run.attempt, run.status) for run in runs] == [
        ("t3", 1, SKIPPED),
        ("t2", 2, SUCCEEDED),
        ("t1", 1, SUCCEEDED),
    ]
    only_lost = join_runs("j", messages[:2], "cron.").runs
    assert only_lost[0].status == LOST


def test_an_expiry_reported_as_an_empty_put_still_reads_as_an_expiry() -> None:
    """nats-io/nats.py#966: one release gave TTL markers as plain puts."""
    from nats.js.kv import KeyValue

    removed: list[Removal] = []
    view = View(on_removed=removed.append)
    value = json.dumps(lease_value()).encode()

    def entry(key: str, data: bytes, revision: int, op: str | None) -> KeyValue.Entry:
        return KeyValue.Entry("T", key, data, revision, None, None, op)

    view.apply_entry(entry("run.j.1000", value, 1, None))
    view.apply_entry(entry("paused.j", b"", 2, None))  # not a lease: a value like any
    view.apply_entry(entry("run.j.1000", b"", 3, None))
    assert [(r.key, r.how) for r in removed] == [("run.j.1000", EXPIRED)]
    assert "paused.j" in view.keys and "run.j.1000" not in view.keys


# ---------------------------------------------------------------- lost records


def lost_config(lease_ttl: str = "30s") -> Config:
    return parse_config(
        {
            "instance_id": "judge",
            "nats": {"lease_ttl": lease_ttl},
            "jobs": [{"name": "j", "schedule": "* * * * * *", "max_late": "5s"}],
        },
        {},
    )


def result(slot: int, token: str) -> ResultRecord:
    return ResultRecord(
        job="j",
        slot=slot,
        token=token,
        instance="runner",
        status=SUCCEEDED,
        started_at="2026-12-03T00:00:00.000Z",
        finished_at="2026-12-03T00:00:01.000Z",
        duration_ms=1000,
        http_status=200,
        error=None,
    )


@contextlib.asynccontextmanager
async def lost_runs(
    nc: NATS, make_jobs: MakeJobs, lease_ttl: str = "30s", view: View | None = None
) -> AsyncIterator[tuple[LostRuns, StreamSpec, Metrics]]:
    """Lost-run judging of one sidecar (the state bucket not read: no keys, or
    `view`'s), with a recorder of its own (no aftermath)."""
    config = lost_config(lease_ttl)
    spec = stream_spec(config)
    await ensure_stream(nc.jetstream(), spec)
    async with make_jobs(config) as jobs:
        yield LostRuns(jobs.ctx, view=view), spec, jobs.metrics


def expired(slot: int, token: str, fence: int | None) -> Removal:
    value: dict[str, Any] = {**lease_value(token, "runner"), "slot": slot}
    if fence is not None:
        value["fence"] = fence
    return Removal(f"run.j.{slot}", state.Entry(value, 7), EXPIRED, time.time())


async def lost_records(nc: NATS, spec: StreamSpec) -> list[dict[str, Any]]:
    js = nc.jetstream()
    info = await js.stream_info(spec.name)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        data = json.loads((await js.get_msg(spec.name, seq)).data or b"{}")
        if data.get("status") == LOST:
            out.append(data)
    return out


async def test_a_lease_expiring_after_its_result_is_not_lost_though_later_results_hide_it(
    nc: NATS, make_jobs: MakeJobs
) -> None:
    """Runs overlap: the expired run's result is not the job's newest one."""
    async with lost_runs(nc, make_jobs) as (runs, spec, metrics):
        js = nc.jetstream()
        claim = await js.publish("cron.j.claims", b'{"token":"t1"}', stream=spec.name)
        await publish_result(js, spec.name, spec.prefix, result(1000, "t1"))
        await publish_result(js, spec.name, spec.prefix, result(2000, "t2"))  # a later run's
        await runs.record_lost(runs.jobs["j"], expired(1000, "t1", claim.seq))
        assert await lost_records(nc, spec) == []
        # A run that has no result is recorded lost, once.
        await runs.record_lost(runs.jobs["j"], expired(3000, "t3", claim.seq))
        lost = await lost_records(nc, spec)
        assert [(r["slot"], r["token"]) for r in lost] == [(3000, "t3")]
        assert metrics.registry.get_sample_value("anarchon_runs_lost_total", {"job": "j"}) == 1


async def test_a_result_stored_between_the_check_and_the_lost_record_wins(
    nc: NATS, make_jobs: MakeJobs
) -> None:
    """The lost record expects the job's last result as read: the run's own result
    stored in between makes it look again, and refrain."""
    async with lost_runs(nc, make_jobs) as (runs, spec, _):
        js = nc.jetstream()
        recorded, last = await runs.recorded("j", "t1", None)
        assert (recorded, last) == (False, 0)
        await publish_result(js, spec.name, spec.prefix, result(1000, "t1"))  # the runner, late
        removal = expired(1000, "t1", None)
        value = removal.entry.value
        stored = await runs._publish(runs.jobs["j"], removal.key, value, 1000, 1, "t1", 0.0, last)
        assert stored is None  # refused: a result came in
        await runs.record_lost(runs.jobs["j"], removal)
        assert await lost_records(nc, spec) == []


async def test_a_lost_run_is_recorded_once_nats_answers_again(
    nats_server: NatsServer, nc: NATS, make_jobs: MakeJobs, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease expired, then NATS stopped answering before the judge could read the
    results: the judge asks again and records the run lost once NATS is back
    (it gave up at the first error, leaving the run ``running`` in history)."""
    caplog.set_level(logging.INFO, logger="sidecar.run.lostruns")
    async with lost_runs(nc, make_jobs) as (runs, spec, metrics):
        claim = await nc.jetstream().publish("cron.j.claims", b'{"token":"t3"}', stream=spec.name)
        nats_server.stop()
        judging = asyncio.create_task(
            runs.record_lost(runs.jobs["j"], expired(3000, "t3", claim.seq))
        )
        await until(
            lambda: "asking again" in caplog.text or judging.done(), 30, "the judge asking again"
        )
        assert not judging.done(), caplog.text  # it did not give up at the first error
        await asyncio.to_thread(nats_server.start)
        await asyncio.wait_for(judging, 60)
        lost = await lost_records(nc, spec)
        assert [(r["slot"], r["token"]) for r in lost] == [(3000, "t3")]
        assert metrics.registry.get_sample_value("anarchon_runs_lost_total", {"job": "j"}) == 1


async def test_a_judge_racing_a_stream_of_results_records_the_run_lost_once_they_stop(
    nc: NATS, make_jobs: MakeJobs, caplog: pytest.LogCaptureFixture
) -> None:
    """Every look is beaten by a result of the job stored before the lost record (the
    skips of a job whose dead run holds its lock, many judges at once): the judge
    keeps looking while that lasts, within JUDGE_GIVE_UP, and records the run lost
    once (it gave up after five looks)."""
    caplog.set_level(logging.DEBUG, logger="sidecar.run.lostruns")
    async with lost_runs(nc, make_jobs) as (runs, spec, metrics):
        body = result(1000, "other").to_json()
        writing = True

        async def writer() -> int:
            n = 0
            while writing:
                for _ in range(50):  # not awaited one by one: faster than a judge's look
                    await nc.publish("cron.j.results", body)
                    n += 1
                await nc.flush()
            return n

        writes = asyncio.create_task(writer())
        await asyncio.sleep(0.2)  # the results are coming in
        judging = asyncio.create_task(runs.record_lost(runs.jobs["j"], expired(3000, "t3", None)))
        await asyncio.sleep(1.5)
        writing = False
        assert await writes > 1000
        await asyncio.wait_for(judging, 60)
        lost = await lost_records(nc, spec)
        assert [(r["slot"], r["token"]) for r in lost] == [(3000, "t3")], caplog.text
        assert metrics.registry.get_sample_value("anarchon_runs_lost_total", {"job": "j"}) == 1
        # Beaten more often than the five looks the judge used to give up after.
        assert caplog.text.count("a result came in first") > RECHECKS, caplog.text[-2000:]


async def test_a_lease_whose_end_a_re_read_did_not_see_is_judged_by_its_results(
    nc: NATS, make_jobs: MakeJobs
) -> None:
    """``UNSEEN`` (sidecar/store/watch.py ``Watch._start``): a lock taken again by another
    run while this sidecar read the bucket again. A run without a result is recorded
    lost; one whose result is stored (a clean release, then the new run) is not."""
    async with lost_runs(nc, make_jobs) as (runs, spec, _):
        js = nc.jetstream()
        claim = await js.publish("cron.j.claims", b'{"token":"t1"}', stream=spec.name)
        await publish_result(js, spec.name, spec.prefix, result(1000, "t1"))
        for slot, token in ((1000, "t1"), (2000, "t2")):
            value = {**lease_value(token, "runner"), "slot": slot, "fence": claim.seq}
            runs.removed(Removal("lock.j", state.Entry(value, 7), UNSEEN, None))
        await asyncio.wait_for(asyncio.gather(*runs.tasks), 30)
        lost = await lost_records(nc, spec)
        assert [(r["slot"], r["token"]) for r in lost] == [(2000, "t2")]
        # A deleted lock, told as deleted (a live view saw its delete), is not judged.
        runs.removed(Removal("lock.j", state.Entry(lease_value("t3"), 8), state.DELETED, None))
        assert not runs.tasks


async def test_a_lease_a_re_read_found_gone_without_a_marker_is_judged_after_lease_ttl(
    nc: NATS, make_jobs: MakeJobs
) -> None:
    """Its marker aged out while this sidecar was away (or the bucket was purged): a
    live runner takes its lease again at its next renewal, so the judge waits
    lease_ttl and a renewal first (it was never judged, and the run read
    ``running`` for ever). Taken again (in the view, or, the view not following,
    in NATS): not lost; still gone: lost."""
    view = View()
    bucket = await ensure_bucket(nc.jetstream(), StateSpec("CRON_STATE", 1, 60.0))
    async with lost_runs(nc, make_jobs, "1s", view) as (runs, spec, _):
        runs.keys = lambda: Keys(bucket)
        claim = await nc.jetstream().publish("cron.j.claims", b"{}", stream=spec.name)
        leases = {
            token: {**lease_value(token, "runner"), "slot": slot, "fence": claim.seq}
            for slot, token in ((1000, "alive"), (2000, "dead"), (3000, "renewed"))
        }
        for value in leases.values():
            key = f"run.j.{value['slot']}"
            runs.removed(Removal(key, state.Entry(value, 7), None, None))
        assert len(runs.tasks) == 3
        view.keys["run.j.1000"] = state.Entry(leases["alive"], 9)  # its renewal, seen
        # A renewal the view did not see (it is not following): NATS has it.
        await Keys(bucket).create("run.j.3000", leases["renewed"], 30.0)
        assert not view.following
        await asyncio.wait_for(asyncio.gather(*runs.tasks), 30)
        lost = await lost_records(nc, spec)
        assert [(r["slot"], r["token"]) for r in lost] == [(2000, "dead")]


async def test_many_leases_expiring_together_are_each_recorded_lost_once(
    nc: NATS, make_jobs: MakeJobs
) -> None:
    """A runner killed in a burst: its leases (of many jobs) expire together on every
    sidecar. The judges ask NATS LOOKS_AT_ONCE at a time (the others wait their
    turn), and each run is recorded lost once."""
    many = LOOKS_AT_ONCE * 2 + 7
    names = [f"k{i}" for i in range(many)]
    config = parse_config(
        {"instance_id": "judge", "jobs": [{"name": n, "schedule": "0 0 * * *"} for n in names]},
        {},
    )
    spec = stream_spec(config)
    await ensure_stream(nc.jetstream(), spec)
    async with make_jobs(config) as jobs:
        runs = LostRuns(jobs.ctx)
        inside, busiest = 0, 0
        recorded = runs.recorded

        async def counted_look(*args: Any) -> tuple[bool, int]:  # the judge's first call
            nonlocal inside, busiest
            inside += 1
            busiest = max(busiest, inside)
            try:
                result = await recorded(*args)
                await asyncio.sleep(0.01)  # a slower server: the judges pile up
                return result
            finally:
                inside -= 1

        runs.recorded = counted_look  # type: ignore[method-assign,assignment]
        for name in names:
            value = {**lease_value(f"t-{name}", "runner"), "job": name}
            runs.removed(Removal(f"run.{name}.1000", state.Entry(value, 7), EXPIRED, time.time()))
        await asyncio.wait_for(asyncio.gather(*runs.tasks), 60)
        lost = await lost_records(nc, spec)
        assert sorted(r["token"] for r in lost) == sorted(f"t-{n}" for n in names)
        counted = jobs.metrics.registry.get_sample_value
        assert all(counted("anarchon_runs_lost_total", {"job": n}) == 1 for n in names)
        assert busiest == LOOKS_AT_ONCE  # the bound was reached, never passed
