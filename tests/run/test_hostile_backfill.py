"""Forged ``backfill.<job>`` values, with three real sidecars and a real nats-server.

A writer of the state bucket made the fleet trigger a slot not on the
schedule, one in 1969 and one an hour ahead, and one slot of 10**20 made the
backfill task log a traceback every 5 s and ``status`` die (OSError 75).
Now a value the backfill command would not write is counted, logged once,
deleted, and nothing of it runs; a real backfill still runs; ``status``
reads any value.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import nats

from sidecar.core.clock import rfc3339
from tests.store.test_hostile_state import base, live_keys, total
from tests.support import NatsServer, RecordingApp, cli_config, job, run_cli, sidecars, wait_for

JOBS = ["ahead", "off", "old", "huge", "many", "extra", "junk"]


def put_raw(url: str, key: str, raw: bytes) -> None:
    async def go() -> None:
        nc = await nats.connect(url)
        try:
            await nc.jetstream().publish(f"$KV.CRON_STATE.{key}", raw, stream="KV_CRON_STATE")
        finally:
            await nc.close()

    asyncio.run(go())


def value(pending: list[Any], **extra: Any) -> bytes:
    """What the command writes, with `pending` and `extra` as the forger likes."""
    return json.dumps(
        {
            "pending": pending,
            "running": None,
            "tag": "b",
            "trigger": "backfill",
            "by": "mallory@somewhere",
            "at": rfc3339(time.time()),
            "done": 0,
            **extra,
        }
    ).encode()


def backfilled(app: RecordingApp, name: str) -> list[int]:
    return [
        int(r.headers["X-Anarchon-Slot"])
        for r in app.requests_for(f"/jobs/{name}")
        if r.headers.get("X-Anarchon-Trigger") == "backfill"
    ]


def test_forged_backfill_values_run_nothing_and_are_counted_logged_and_deleted(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    jobs = [job(name, jitter="500ms") for name in [*JOBS, "real"]]
    config = base(nats_server.url, http_app, jobs)
    # The command line knows one more job, which no sidecar runs: its key stays.
    cfg = cli_config(tmp_path, {**config, "jobs": [*jobs, job("idle", schedule="0 * * * *")]})
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: http_app.requests_for("/jobs/real"), 20, what="the fleet runs")
        now = int(time.time()) * 1000
        forged = {
            "ahead": value([now + 3_600_000]),  # an hour ahead
            "off": value([now - 10_500]),  # not an instant of "* * * * * *"
            "old": value([-1000]),  # 1969-12-31T23:59:59Z
            "huge": value([], running={"slot": 10**20, "instance": "x", "at": rfc3339(0)}),
            "many": value(list(range(now - 1_001_000, now, 1000))),  # 1001 slots
            "extra": value([now - 10_000], note="not a field of the command"),
            "junk": b"\xff not json",
        }
        for name, raw in forged.items():
            put_raw(nats_server.url, f"backfill.{name}", raw)
        keys = {f"backfill.{name}" for name in forged}
        wait_for(
            lambda: not keys & set(live_keys(nats_server.url)),
            15,
            what="every forged backfill key deleted",
        )
        wait_for(
            lambda: (
                total(procs, "anarchon_hostile_input_total", {"what": "backfill_key"})
                >= len(forged)
            ),
            10,
            what="every forged key counted",
        )
        # A real backfill runs, and is not taken for a forged one.
        start = int(time.time()) - 6
        done = run_cli(
            "backfill",
            "real",
            "-c",
            cfg,
            "--from",
            rfc3339(start),
            "--to",
            rfc3339(start + 2),
        )
        assert done.returncode == 0, done.stderr
        wait_for(lambda: len(backfilled(http_app, "real")) == 3, 20, what="the real backfill")
        # A value no sidecar acts on (no sidecar runs `idle`): status reads it anyway.
        put_raw(
            nats_server.url,
            "backfill.idle",
            value([10**20, -5], running={"slot": 10**20, "instance": "x", "at": "x"}, done="x"),
        )
        shown = run_cli("status", "-c", cfg)
        assert shown.returncode == 0, shown.stderr
        time.sleep(1.0)  # what a forged key would have triggered comes by now
        logs = [p.log() for p in procs]
    assert sorted(backfilled(http_app, "real")) == [1000 * s for s in range(start, start + 3)]
    for name in forged:
        assert not backfilled(http_app, name), name
    for log in logs:
        assert "Traceback" not in log and "backfill step failed" not in log
        assert "backfill.real refused" not in log and "backfill.idle" not in log
        for name in forged:
            lines = [x for x in log.splitlines() if f"backfill.{name} refused" in x]
            assert len(lines) <= 1, lines  # once, by a sidecar that read it before its delete
    said = "\n".join(logs)
    for why in (
        "a slot is in the future",
        "a slot is not an instant of the job's schedule",
        "a slot is not a time in range",
        "pending is not a list of at most 1000 slots",
        "unknown field 'note'",
        "not JSON",
    ):
        assert why in said, why
