"""Forged ``buffer.<job>`` and ``stop.<job>`` keys (sidecar/run/overlapcheck.py), with
three real sidecars, a real nats-server and a real app.

A writer of the state bucket made every sidecar run a kept slot of its
choosing (off the schedule, of a paused job whose ``max_runs`` was spent,
with its own run id, attempt 7 and fence 2^53-1, which then made an app that
keeps the highest fence refuse every real run), and cancel a live run "for
slot 1970-01-01". Now each such key is counted, logged once and deleted, the
app sees nothing of it, and the real runs go on.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from sidecar.core.clock import rfc3339
from tests.store.test_hostile_state import base, live_keys, put, total, with_nats
from tests.support import (
    NatsServer,
    RecordingApp,
    Request,
    Sidecar,
    cli_config,
    job,
    read_stream,
    results,
    run_cli,
    sidecars,
    slow_run,
    wait_for,
)

MAX_FENCE = 2**53 - 1  # the largest integer a JavaScript app reads exactly


def get_key(url: str, key: str) -> dict[str, Any] | None:
    """The JSON value of `key` in the state bucket, None when it has none."""

    async def work(nc: Any) -> dict[str, Any] | None:
        import json

        kv = await nc.jetstream().key_value("CRON_STATE")
        try:
            entry = await kv.get(key)
        except Exception:  # no such key (nats-py raises)
            return None
        return json.loads(entry.value) if entry.value else None

    got: dict[str, Any] | None = with_nats(url, work)
    return got


def forge(url: str, procs: list[Sidecar], what: str, key: str, value: Any) -> None:
    """Write `value` at `key` and wait until a sidecar refused and deleted it."""
    before = total(procs, "anarchon_hostile_input_total", {"what": what})
    put(url, key, value)
    wait_for(
        lambda: total(procs, "anarchon_hostile_input_total", {"what": what}) > before,
        15,
        what=f"{key} = {str(value)[:80]} refused",
    )
    wait_for(lambda: key not in live_keys(url), 10, what=f"{key} deleted")


def refusals(procs: list[Sidecar], key: str) -> list[str]:
    return [line for p in procs for line in p.log().splitlines() if f"{key} refused" in line]


def claims(url: str, name: str) -> dict[str, int]:
    """The stored claims of job `name`: run id -> sequence (the run's fence)."""
    return {
        m.data["token"]: m.seq
        for m in read_stream(url)
        if m.subject == f"cron.{name}.claims" and isinstance(m.data.get("token"), str)
    }


def fence(req: Request) -> int:
    return int(req.headers["X-Anarchon-Fence"])


# ------------------------------------------------------------------ buffer.<job>


def test_forged_kept_slots_run_nothing_and_the_real_runs_go_on(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    url = nats_server.url
    config = base(
        url,
        http_app,
        [
            job("buf", overlap="buffer_one"),
            job("yearly", schedule="0 0 1 1 *", overlap="buffer_one", max_runs=1),
            job("plain"),
        ],
    )
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        paused = run_cli("pause", "yearly", "--reason", "migration", "-c", cfg)
        assert paused.returncode == 0, paused.stderr
        put(url, "count.yearly", {"runs": 1, "slots": [], "max_runs": 1, "by": "s0", "at": "x"})
        wait_for(
            lambda: len([r for r in http_app.requests_for("/jobs/buf") if r.finished]) >= 3,
            20,
            what="three runs of buf",
        )
        ran = [m.data for m in results(url, "buf") if m.data["status"] == "succeeded"]
        buf_claims = claims(url, "buf")
        done = ran[0]  # a real claim that ran already
        done_seq = buf_claims[done["token"]]
        other_seq = max(claims(url, "plain").values())  # a claim of another job
        now_ms = int(time.time() * 1000)
        evil = "e" * 32

        def kept(**fields: Any) -> dict[str, Any]:
            """What a sidecar writes in buffer.<job>, with `fields` as the forger likes."""
            return {
                "job": "buf",
                "slot": done["slot"],
                "attempt": 1,
                "token": done["token"],
                "trigger": "scheduled",
                "manual": False,
                "fence": done_seq,
                "instance": "s0",
                "kept_at": rfc3339(time.time()),
                "behind": "f" * 32,
                **fields,
            }

        forged: list[tuple[str, Any, str]] = [
            # The red team's: a paused yearly job with max_runs spent, a slot off its
            # schedule, a chosen run id, attempt 7 and fence 2^53-1.
            (
                "buffer.yearly",
                kept(job="yearly", slot=now_ms - 1234, token=evil, attempt=7, fence=MAX_FENCE),
                f"no message is stored at sequence {MAX_FENCE}",
            ),
            ("buffer.buf", kept(), "it ran, or was recorded, already"),  # a replay
            ("buffer.buf", kept(token=evil), "the claim it names has another run id"),
            ("buffer.buf", kept(slot=done["slot"] + 500), "the claim it names is of another slot"),
            ("buffer.buf", kept(fence=other_seq), "not a claim of the job"),
            ("buffer.buf", kept(fence=MAX_FENCE, attempt=7, token=evil), "no message is stored"),
            ("buffer.buf", [1, 2], "slot is not a time in range"),  # read as {}
            ("buffer.buf", kept(fence="1"), "fence is not a stream sequence"),
        ]
        for key, value, _ in forged:
            forge(url, procs, "buffer_key", key, value)
        forged_at = time.time()
        # The real runs go on, each with its own claim's fence.
        wait_for(
            lambda: len([r for r in http_app.requests_for("/jobs/buf") if r.at > forged_at]) >= 3,
            20,
            what="three runs of buf after the forged keys",
        )
        counted = total(procs, "anarchon_hostile_input_total", {"what": "buffer_key"})
        said = {key: refusals(procs, key) for key, _, _ in forged}
        logs = "\n".join(p.log() for p in procs)
        stored = claims(url, "buf")
    assert not http_app.requests_for("/jobs/yearly")
    reqs = http_app.requests_for("/jobs/buf")
    # Every request is a stored claim's run, with that claim's sequence as its fence,
    # attempt 1, each run id once: nothing of a key's value reached the app.
    assert all(stored.get(r.headers["X-Anarchon-Run-Id"]) == fence(r) for r in reqs), [
        (r.headers["X-Anarchon-Run-Id"], fence(r)) for r in reqs
    ]
    assert all(r.headers["X-Anarchon-Attempt"] == "1" for r in reqs)
    assert max(Counter(r.headers["X-Anarchon-Run-Id"] for r in reqs).values()) == 1
    # An app that keeps the highest fence takes every real run, before and after.
    fences = [fence(r) for r in sorted(reqs, key=lambda r: r.at)]
    assert fences == sorted(fences) and len(set(fences)) == len(fences)
    assert max(fences) < MAX_FENCE
    assert [r for r in reqs if r.at > forged_at]
    # Each forged key counted and logged once per sidecar that refused it.
    assert counted == sum(len(lines) for lines in said.values())
    assert counted >= len(forged)
    for *_, why in forged:
        assert why in logs, why


def test_a_kept_slot_is_not_run_while_its_job_is_paused(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Like a due attempt, a kept slot whose turn comes while its job is paused is
    recorded skipped (paused), not run."""
    url = nats_server.url
    path = "/jobs/bp"
    config = base(url, http_app, [job("bp", overlap="buffer_one")])
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        first, _ = slow_run(http_app, procs, path, 4.0)
        kept = wait_for(lambda: get_key(url, "buffer.bp"), 10, what="a slot kept")
        paused = run_cli("pause", "bp", "--reason", "migration", "-c", cfg)
        assert paused.returncode == 0, paused.stderr
        paused_at = time.time()
        http_app.delay[path] = 0.0
        record = wait_for(
            lambda: next(
                (m.data for m in results(url, "bp") if m.data["token"] == kept["token"]), None
            ),
            20,
            what="the kept slot's record",
        )
        wait_for(lambda: first.finished, 10, what="the slow run's end")
        hostile = total(procs, "anarchon_hostile_input_total", {"what": "buffer_key"})
        skipped = total(procs, "anarchon_runs_skipped_total", {"job": "bp", "reason": "paused"})
    assert record["status"] == "skipped", record
    assert "paused by" in record["error"] and "migration" in record["error"], record
    tokens = {r.headers["X-Anarchon-Run-Id"] for r in http_app.requests_for(path)}
    assert kept["token"] not in tokens
    # Nothing ran once the pause was stored (a slot kept before it, under load, may have).
    assert not [r for r in http_app.requests_for(path) if r.at > paused_at]
    assert hostile == 0  # a real kept slot is not hostile
    assert skipped >= 1


# ------------------------------------------------------------------ stop.<job>


def test_forged_stop_requests_leave_the_live_run_alone(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    url = nats_server.url
    path = "/jobs/rep"
    http_app.delay[path] = 60.0  # only a cancel request ends a run
    rep = job(
        "rep",
        schedule="*/20 * * * * *",
        max_late="10s",
        overlap="replace",
        cancel={"grace": "1s"},
    )
    config = base(url, http_app, [rep, job("plain")])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        running = wait_for(lambda: http_app.requests_for(path), 30, what="a run of rep")[0]
        slot = int(running.headers["X-Anarchon-Slot"])
        lock = wait_for(lambda: get_key(url, "lock.rep"), 10, what="lock.rep")
        token = running.headers["X-Anarchon-Run-Id"]
        assert lock["token"] == token
        other_seq = wait_for(
            lambda: max(s for s in claims(url, "plain").values() if s > fence(running)),
            10,
            what="a claim of plain after the run's",
        )

        def stop(**fields: Any) -> dict[str, Any]:
            """What a replacer writes in stop.<job>, with `fields` as the forger likes."""
            at = rfc3339(time.time())
            return {"job": "rep", "token": token, "slot": 1, "instance": "s9", "at": at, **fields}

        forged: list[tuple[dict[str, Any], str]] = [
            (stop(), "fence is not a stream sequence"),  # the red team's: slot 1, no fence
            (stop(fence=fence(running)), "not newer than the running run's"),
            (stop(fence=MAX_FENCE), f"no message is stored at sequence {MAX_FENCE}"),
            (stop(fence=other_seq), "not a claim of the job"),
            (stop(fence=1, slot=slot - 20_000), "not newer than the running run's"),
        ]
        for value, _ in forged:
            forge(url, procs, "stop_key", "stop.rep", value)
        forged_until = time.time()
        alive = running.finished == 0.0
        asked_early = [
            r for r in http_app.requests_for(path) if r.headers.get("X-Anarchon-Cancel") == token
        ]
        # The next slot (20 s later) replaces the run as it should.
        replaced = wait_for(
            lambda: next((m.data for m in results(url, "rep") if m.data["token"] == token), None),
            40,
            what="the run replaced by the next slot",
        )
        counted = total(procs, "anarchon_hostile_input_total", {"what": "stop_key"})
        said = refusals(procs, "stop.rep")
        logs = "\n".join(p.log() for p in procs)
        newer = [
            r for r in http_app.requests_for(path) if r.headers.get("X-Anarchon-Cancel") is None
        ]
    assert alive and not asked_early, "a forged stop request cancelled the live run"
    cancel = next(
        r for r in http_app.requests_for(path) if r.headers.get("X-Anarchon-Cancel") == token
    )
    assert cancel.at > forged_until
    assert replaced["status"] == "failed"
    assert replaced["error"].startswith(f"replaced: stopped for slot {rfc3339(slot / 1000 + 20)}")
    assert [int(r.headers["X-Anarchon-Slot"]) for r in newer][:2] == [slot, slot + 20_000]
    assert counted == len(said) == len(forged)
    for _, why in forged:
        assert why in logs, why


def test_a_kept_slot_of_a_job_that_does_not_keep_slots_is_counted_and_runs_nothing(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    url = nats_server.url
    config = base(url, http_app, [job("skipper", overlap="skip"), job("plain")])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: http_app.requests_for("/jobs/skipper"), 20, what="a run of skipper")
        kept = {"job": "skipper", "slot": int(time.time() // 1 * 1000), "attempt": 1,
                "token": "f" * 32, "trigger": "scheduled", "manual": False, "fence": 1,
                "instance": "s0", "kept_at": rfc3339(time.time()), "behind": "x"}  # fmt: skip
        counted = {"what": "buffer_key"}
        for key in ("buffer.skipper", "buffer.plain"):
            put(url, key, kept)
        # Counted by each of the three sidecars, once per key (not again for the
        # same revision), said once; another app's job's key is not looked at.
        wait_for(
            lambda: total(procs, "anarchon_hostile_input_total", counted) == 6,
            15,
            what="both keys counted by every sidecar",
        )
        put(url, "buffer.elsewhere", {**kept, "job": "elsewhere"})
        later = time.time() + 3
        wait_for(lambda: time.time() > later, 5, what="a recount's time")
        assert total(procs, "anarchon_hostile_input_total", counted) == 6
        assert len([line for p in procs for line in p.log().splitlines()
                    if "buffer.skipper ignored" in line]) == 3  # fmt: skip
        # Nothing of it ran; the keys are left (a replica of another config's, maybe).
        assert not [
            r
            for r in http_app.requests
            if r.headers.get("X-Anarchon-Buffered")
            or r.headers.get("X-Anarchon-Run-Id") == "f" * 32
        ]
        assert {"buffer.skipper", "buffer.plain", "buffer.elsewhere"} <= set(live_keys(url))
