"""The state bucket as an attacker and a careless colleague leave it, with real processes.

Forged due keys, absurd values in leases and the stream, a bucket made by hand
with history 5, one without a marker TTL, and a bucket deleted and made again
under a running fleet: nothing in the bucket makes a sidecar trigger what its
own config and the stream would not, nothing crashes, and no run is left
`running` for ever.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
from nats.js.api import KeyValueConfig

from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    bucket_keys,
    job,
    results,
    run_cli,
    sidecars,
    wait_for,
    write_config,
)

TTL = "2s"


def base(url: str, app: RecordingApp, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nats": {"servers": [url], "lease_ttl": TTL},
        "target": {"url": app.url, "timeout": "60s"},
        "jobs": jobs,
    }


def total(procs: list[Sidecar], name: str, labels: dict[str, str] | None = None) -> float:
    return sum(p.metric(name, labels) or 0 for p in procs if p.proc and p.proc.poll() is None)


def with_nats(url: str, work: Callable[[Any], Awaitable[Any]]) -> Any:
    """Run `work(nc)` on a fresh connection (a client of the account, not a sidecar)."""

    async def go() -> Any:
        nc = await nats.connect(url)
        try:
            return await work(nc)
        finally:
            await nc.close()

    return asyncio.run(go())


def put(url: str, key: str, value: Any, ttl: float | None = None) -> None:
    async def work(nc: Any) -> None:
        await nc.jetstream().publish(
            f"$KV.CRON_STATE.{key}",
            json.dumps(value).encode(),
            stream="KV_CRON_STATE",
            msg_ttl=ttl,
        )

    with_nats(url, work)


def live_keys(url: str) -> list[str]:
    async def work(nc: Any) -> list[str]:
        kv = await nc.jetstream().key_value("CRON_STATE")
        return await bucket_keys(kv)

    return list(with_nats(url, work))


def requests(app: RecordingApp, path: str) -> set[tuple[int, int]]:
    return {
        (int(r.headers["X-Anarchon-Slot"]), int(r.headers["X-Anarchon-Attempt"]))
        for r in app.requests_for(path)
    }


# ------------------------------------------------------------------ forged due keys


def test_forged_due_keys_trigger_nothing_and_are_counted_logged_and_deleted(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.status["/jobs/flaky"] = 500
    config = base(
        nats_server.url,
        http_app,
        [
            job("ok", retry={"max": 2, "backoff": "1s"}),
            job("once"),  # retry.max 0: the "once" mode
            job("yearly", schedule="0 0 1 1 *", retry={"max": 3, "backoff": "1s"}),
            job("flaky", schedule="*/3 * * * * *", retry={"max": 1, "backoff": "1s"}),
        ],
    )
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        done = wait_for(
            lambda: [r for r in http_app.requests_for("/jobs/ok") if r.finished],
            20,
            what="a run of ok that succeeded",
        )
        succeeded = int(done[0].headers["X-Anarchon-Slot"])
        once = wait_for(
            lambda: [r for r in http_app.requests_for("/jobs/once") if r.finished],
            20,
            what="a run of once",
        )
        once_slot = int(once[0].headers["X-Anarchon-Slot"])
        now_ms = int(time.time()) * 1000
        hour_ahead = now_ms + 3_600_000
        off_schedule = now_ms - 500  # half a second: not an instant of "* * * * * *"
        year_2028 = 1_830_297_600_000  # 2028-01-01T00:00Z
        forged = {
            f"due.ok.{succeeded}.2": succeeded,  # attempt 1 succeeded
            f"due.ok.{hour_ahead}.3": hour_ahead,  # an hour in the future
            f"due.ok.{off_schedule}.2": off_schedule,  # not on the schedule
            f"due.ok.{now_ms - 2000}.9": now_ms - 2000,  # beyond retry.max
            f"due.once.{once_slot}.2": once_slot,  # the job has no retries
            f"due.yearly.{year_2028}.2": year_2028,  # next year's slot, now
            f"due.ok.{now_ms}.1": now_ms,  # attempt 1 is never a due key
        }
        # The forger names the real (succeeded) result of that slot, or anything.
        real = wait_for(
            lambda: [m.seq for m in results(nats_server.url, "ok") if m.data["slot"] == succeeded],
            10,
            what="the succeeded result",
        )
        for key in forged:
            hint = real[0] if key.startswith(f"due.ok.{succeeded}.") else 1
            put(nats_server.url, key, {"due_at": time.time(), "reason": "retry", "result": hint})

        # Each key refused by one sidecar at least: a key the other deleted before
        # this one looked at it is gone, not refused twice (CI: s1 deleted one within
        # 3 ms, and s0's view held its delete when s0 came to the put).
        def every_key_refused() -> bool:
            logs = [p.log() for p in procs]  # read once a look, not once a key
            return all(any(f"due key {key} refused" in log for log in logs) for key in forged)

        wait_for(
            every_key_refused,
            20,
            what="every forged key refused",
        )
        wait_for(
            lambda: not set(live_keys(nats_server.url)) & set(forged),
            10,
            what="the forged keys deleted",
        )
        # A real failure is still retried: attempt 2, backed by the stream.
        wait_for(
            lambda: any(a == 2 for _, a in requests(http_app, "/jobs/flaky")),
            20,
            what="a real retry",
        )
        time.sleep(2.0)  # what a forged key would have triggered comes by now
        counted = total(procs, "anarchon_hostile_input_total", {"what": "due_key"})
        logs = [p.log() for p in procs]
    ran = requests(http_app, "/jobs/ok") | requests(http_app, "/jobs/once")
    assert not {(s, a) for (s, a) in ran if a > 1}, ran
    assert not http_app.requests_for("/jobs/yearly")
    said = 0
    for key in forged:
        per_log = [
            [line for line in log.splitlines() if f"due key {key} refused" in line] for log in logs
        ]
        assert all(len(lines) <= 1 for lines in per_log), (key, per_log)  # once each at most
        assert any(per_log), key
        said += sum(len(lines) for lines in per_log)
    assert counted == said, (counted, said)  # each refusal counted once
    log = "\n".join(logs)
    assert "attempt 1 ended 'succeeded', not failed or lost" in log
    assert "its slot is in the future" in log
    assert "not an instant of the job's schedule" in log
    assert "beyond the job's budget (retry.max 2)" in log
    assert "beyond the job's budget (retry.max 0)" in log


def test_a_due_key_gets_its_time_from_the_stream_not_from_the_key(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """A recorder's clock ahead (or a forger) cannot move a real retry out of reach."""
    http_app.status["/jobs/flaky"] = 500
    config = base(
        nats_server.url,
        http_app,
        [job("flaky", schedule="*/4 * * * * *", retry={"max": 1, "backoff": "1s"})],
    )
    with sidecars(tmp_path, [("s0", config, {})]) as _:
        first = wait_for(
            lambda: [r for r in http_app.requests_for("/jobs/flaky") if r.finished],
            20,
            what="a failed attempt 1",
        )
        slot = int(first[0].headers["X-Anarchon-Slot"])
        retried = wait_for(
            lambda: [
                r
                for r in http_app.requests_for("/jobs/flaky")
                if int(r.headers["X-Anarchon-Slot"]) == slot
                and r.headers["X-Anarchon-Attempt"] == "2"
            ],
            15,
            what="attempt 2",
        )
    failed = next(
        m
        for m in results(nats_server.url, "flaky")
        if m.data["slot"] == slot and m.data.get("attempt", 1) == 1
    )
    # Due 1 s (the backoff) after the server stored the failure, plus jitter and
    # the failed replica's extra wait (0.5 s; it is the only one here).
    assert 1.4 <= retried[0].at - failed.time <= 1.0 + 0.2 + 0.5 + 1.0, retried[0].at - failed.time


# ------------------------------------------------------------------ forged locks


def put_raw(url: str, key: str, value: Any, headers: dict[str, str]) -> None:
    """A put with the headers given as they are (a Nats-TTL of the forger's choice)."""

    async def work(nc: Any) -> None:
        await nc.jetstream().publish(
            f"$KV.CRON_STATE.{key}", json.dumps(value).encode(), headers=headers or None
        )

    with_nats(url, work)


def test_a_forged_lock_without_a_ttl_is_counted_deleted_and_the_job_keeps_running(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Issue 48: a lock.<job> without a TTL blocked the job for good (0 runs in 25 s)."""
    config = base(nats_server.url, http_app, [job("guarded", overlap="skip")])
    forged = {"job": "guarded", "slot": 1, "attempt": 1, "token": "t" * 32, "instance": "evil"}
    hostile = {"what": "lock_key"}
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: http_app.requests_for("/jobs/guarded"), 20, what="a first run")
        counted = 0.0
        # No TTL at all, "never", and ten years: each would hold the job for ever.
        for ttl in ("", "never", str(10 * 365 * 86400)):
            put_raw(nats_server.url, "lock.guarded", forged, {"Nats-TTL": ttl} if ttl else {})
            wait_for(
                lambda: total(procs, "anarchon_hostile_input_total", hostile) > counted,  # noqa: B023
                10,
                what=f"the lock with Nats-TTL {ttl!r} counted",
            )
            counted = total(procs, "anarchon_hostile_input_total", hostile)
            before = len(http_app.requests_for("/jobs/guarded"))
            wait_for(
                lambda: len(http_app.requests_for("/jobs/guarded")) >= before + 3,  # noqa: B023
                10,
                what=f"guarded running again after the lock with Nats-TTL {ttl!r}",
            )
        logs = [p.log() for p in procs]
    for log in logs:
        # Logged once a minute per key, not once per slot, by whichever sidecars met it.
        assert len([line for line in log.splitlines() if "lock.guarded refused" in line]) <= 1
    assert any("lock.guarded refused" in log for log in logs)
    statuses = {m.data["status"] for m in results(nats_server.url, "guarded")}
    assert "succeeded" in statuses, statuses


# ------------------------------------------------------------------ absurd values


def test_absurd_numbers_in_leases_and_claims_are_skipped_not_crashed_on(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server.url, http_app, [job("guarded", overlap="skip"), job("plain")])
    cli = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))
    with sidecars(tmp_path, [("s0", config, {})]) as procs:
        wait_for(lambda: http_app.requests_for("/jobs/guarded"), 20, what="a first run")
        absurd = {"slot": 10**20, "attempt": 10**20, "token": "t" * 32, "instance": "x"}
        # A held lock with an absurd slot: the next winners must record their skip.
        put(nats_server.url, "lock.guarded", {**absurd, "started_at": "nonsense"}, ttl=30)
        # An expiring run lease with one: no lost record for a fake slot, no crash.
        put(nats_server.url, "run.plain.42", absurd, ttl=1)
        # A claim in the stream with one.
        with_nats(
            nats_server.url,
            lambda nc: nc.jetstream().publish(
                "cron.plain.claims",
                json.dumps({"job": "plain", **absurd}).encode(),
                headers={"Nats-Msg-Id": "plain:forged"},
            ),
        )
        wait_for(
            lambda: [
                m
                for m in results(nats_server.url, "guarded")
                if m.data["status"] == "skipped"
                and m.data["error"] == "overlap: a run of this job is still alive"
            ],
            20,
            what="a skipped slot recorded despite the absurd lock",
        )
        wait_for(
            lambda: total(procs, "anarchon_hostile_input_total", {"what": "value"}) >= 2,
            20,
            what="the absurd values counted",
        )
        status = run_cli("status", "-c", cli, "--json")
        table = run_cli("status", "-c", cli)
        hist = run_cli("history", "plain", "-c", cli, "--json")
        before = len(http_app.requests_for("/jobs/plain"))
        wait_for(
            lambda: len(http_app.requests_for("/jobs/plain")) > before + 1,
            10,
            what="plain keeps running",
        )
        log = procs[0].log()
    assert status.returncode == 0 and table.returncode == 0, status.stderr + table.stderr
    running = next(j for j in json.loads(status.stdout)["jobs"] if j["name"] == "guarded")
    assert running["running"][0]["slot"] is None  # shown, not formatted
    assert hist.returncode == 0, hist.stderr
    assert all(json.loads(line)["slot"] != 10**20 for line in hist.stdout.splitlines())
    assert "Traceback" not in log and "exception was never retrieved" not in log
    assert not [m for m in results(nats_server.url, "plain") if m.data["status"] == "lost"]


# ------------------------------------------------------------------ the bucket's settings


def test_a_premade_history_5_bucket_is_set_to_1_and_a_killed_runner_is_lost_in_time(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    async def premade(nc: Any) -> None:
        await nc.jetstream().create_key_value(
            KeyValueConfig(bucket="CRON_STATE", history=5, limit_marker_ttl=120)
        )

    with_nats(nats_server.url, premade)
    http_app.delay["/jobs/long"] = 60.0
    config = base(nats_server.url, http_app, [job("long", overlap="skip")])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        first = wait_for(lambda: http_app.requests_for("/jobs/long"), 20, what="a long run")
        victim = next(p for p in procs if p.name == first[0].headers["X-Anarchon-Instance"])
        time.sleep(0.5)
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        killed = time.time()
        victim.proc.wait(10)
        lost = wait_for(
            lambda: [m for m in results(nats_server.url, "long") if m.data["status"] == "lost"],
            30,
            what="the killed run recorded lost",
        )
        other = next(p for p in procs if p is not victim)
        ok = other.metric("anarchon_state_bucket_ok")
        logs = other.log() + victim.log()

    async def history_of(nc: Any) -> int:
        info = await nc.jetstream().stream_info("KV_CRON_STATE")
        return int(info.config.max_msgs_per_subject)

    assert with_nats(nats_server.url, history_of) == 1
    # lease_ttl 2 s, not the marker TTL's 120 s.
    assert lost[0].time - killed < 2.0 + 4.0, lost[0].time - killed
    assert ok == 1
    assert "set history 5 -> 1" in logs, logs


def test_a_bucket_without_a_marker_ttl_stops_the_jobs_that_need_leases_with_a_reason(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    async def premade(nc: Any) -> None:
        await nc.jetstream().create_key_value(KeyValueConfig(bucket="CRON_STATE", history=1))

    with_nats(nats_server.url, premade)
    config = base(nats_server.url, http_app, [job("guarded", overlap="skip"), job("plain")])
    cli = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))
    proc = Sidecar(tmp_path, "s0", config, {}).start()
    try:

        def reason() -> str | None:
            try:
                code, body = proc.get("/readyz")
            except OSError:
                return None
            return body if code == 503 and "cannot hold leases" in body else None

        body = wait_for(reason, 20, what="readyz 503 with the bucket's reason")
        wait_for(lambda: len(http_app.requests_for("/jobs/plain")) >= 2, 20, what="plain runs")
        skipped = wait_for(
            lambda: proc.metric(
                "anarchon_claims_skipped_total", {"job": "guarded", "reason": "bucket"}
            ),
            10,
            what="guarded skipped for the bucket",
        )
        assert proc.metric("anarchon_state_bucket_ok") == 0
        status = run_cli("status", "-c", cli)
    finally:
        proc.terminate()
    assert "no marker TTL" in body and "nats kv del CRON_STATE" in body, body
    assert not http_app.requests_for("/jobs/guarded")  # never run as overlap: allow
    assert skipped and skipped >= 1
    assert "WARNING: state bucket CRON_STATE cannot hold leases" in status.stdout, status.stdout
    lines = [
        line for line in proc.log().splitlines() if "sidecar.fleet.member: state bucket" in line
    ]
    assert len(lines) == 1, lines  # one line, not one per check


def test_a_bucket_made_again_under_the_fleet_is_noticed_and_no_run_stays_running(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.delay["/jobs/long"] = 120.0
    config = base(nats_server.url, http_app, [job("long", overlap="skip"), job("plain")])
    cli = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        first = wait_for(lambda: http_app.requests_for("/jobs/long"), 20, what="a long run")
        victim = next(p for p in procs if p.name == first[0].headers["X-Anarchon-Instance"])
        other = next(p for p in procs if p is not victim)
        time.sleep(0.5)

        # A colleague deletes the bucket and makes it again with nats-py's defaults
        # (no marker TTL), then the runner dies.
        async def remake(nc: Any) -> None:
            js = nc.jetstream()
            await js.delete_key_value("CRON_STATE")
            await js.create_key_value(KeyValueConfig(bucket="CRON_STATE", history=1))

        with_nats(nats_server.url, remake)
        remade = time.time()
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        wait_for(
            lambda: other.metric("anarchon_state_bucket_ok") == 0,
            10,
            what="the remade bucket noticed and judged",
        )
        noticed = time.time() - remade
        # A sidecar started now does not run overlap: skip as allow.
        late = Sidecar(tmp_path, "late", config, {}).start()
        try:
            wait_for(
                lambda: late.metric(
                    "anarchon_claims_skipped_total", {"job": "long", "reason": "bucket"}
                ),
                20,
                what="the late sidecar skipping long for the bucket",
            )
            lost = wait_for(
                lambda: [m for m in results(nats_server.url, "long") if m.data["status"] == "lost"],
                30,
                what="the killed run recorded lost, not running for ever",
            )
            hist = run_cli("history", "long", "-c", cli, "--json")
        finally:
            late.terminate()
        logs = other.log()
    assert noticed < 10, noticed
    assert "was deleted and made again" in logs or "disappeared" in logs, logs
    assert lost[0].data["token"] == first[0].headers["X-Anarchon-Run-Id"]
    rows = [json.loads(line) for line in hist.stdout.splitlines()]
    assert not [r for r in rows if r["status"] == "running"], rows
    assert len(http_app.requests_for("/jobs/long")) == 1
