"""An operator's intent outlives the replicas that honour it (docs/GUARANTEES.md).

Two sidecars run ``capped`` (``max_runs: 3``) and ``held`` (paused before the
fleet starts); a third sidecar of another app, whose config has neither job,
shares the state bucket and stays up. The two are stopped cleanly for well
over the sweep's old grace (``max(lease_ttl, 30s)``), then the whole fleet is
scaled to zero, then everything comes back. On each return the pause holds
(``held`` never reaches the app, the stream records no run of it) and so does
the count (``capped`` ran 3 times, at the app and in the stream), and their
keys are still in the bucket. Before, the third sidecar logged ``removed
count.capped`` / ``removed paused.held`` about 35 s after the two left, and
on their return ``capped`` ran 3 more times and ``held`` ran.

``ANARCHON_TEST_AWAY`` shortens (or lengthens) the time away, in seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import nats
import pytest
from nats.js.errors import KeyNotFoundError

from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    bucket_keys,
    job,
    results,
    run_cli,
    wait_for,
    write_config,
)

AWAY = float(os.environ.get("ANARCHON_TEST_AWAY", "75"))
TTL = "2s"  # the old grace is then its floor, 30 s
KEPT = ("paused.held", "count.capped")


async def _values(url: str, keys: tuple[str, ...]) -> dict[str, bytes | None]:
    """Each key's value now (None: absent or deleted), read one by one."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value("CRON_STATE")
        out: dict[str, bytes | None] = {}
        for key in keys:
            try:
                out[key] = (await kv.get(key)).value
            except KeyNotFoundError:  # also KeyDeletedError: a delete marker
                out[key] = None
        return out
    finally:
        await nc.close()


def values(url: str) -> dict[str, bytes | None]:
    return asyncio.run(_values(url, KEPT))


def ran(url: str, name: str) -> int:
    """Runs of job `name` the stream records (a skip is not a run)."""
    return sum(1 for m in results(url, name) if m.data.get("status") != "skipped")


@pytest.mark.timeout(int(AWAY) + 300)
def test_a_pause_and_a_count_hold_while_every_replica_of_their_jobs_is_away(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    nats_cfg = {"servers": [nats_server.url], "lease_ttl": TTL}
    target = {"url": http_app.url, "timeout": "5s"}
    app = {
        "nats": nats_cfg,
        "target": target,
        "jobs": [job("capped", max_runs=3), job("held"), job("tick")],
    }
    other = {"nats": nats_cfg, "target": target, "jobs": [job("other")]}
    cli_app = str(write_config(tmp_path / "cli-app.yaml", {"instance_id": "cli", **app}))
    cli_other = str(write_config(tmp_path / "cli-other.yaml", {"instance_id": "cli", **other}))
    res = run_cli("pause", "held", "-c", cli_app, "--reason", "database migration")
    assert res.returncode == 0, res.stderr

    def others_seen() -> bool:
        """The third sidecar's config sees both jobs run by both replicas (presence)."""
        res = run_cli("status", "-c", cli_other, "--json")
        found = {j["name"]: j["run_by"] for j in json.loads(res.stdout)["other_jobs"]}
        return found.get("capped") == ["r1", "r2"] and found.get("held") == ["r1", "r2"]

    def ticks_after(moment: float, n: int) -> bool:
        return sum(1 for r in http_app.requests_for("/jobs/tick") if r.at > moment) >= n

    def check_intent(when: str) -> None:
        now = values(nats_server.url)
        seen = {
            "held at the app": len(http_app.requests_for("/jobs/held")),
            "capped at the app": len(http_app.requests_for("/jobs/capped")),
            "held in the stream": ran(nats_server.url, "held"),
            "capped in the stream": ran(nats_server.url, "capped"),
            "keys missing": [k for k in KEPT if now[k] is None],
        }
        want = {
            "held at the app": 0,
            "capped at the app": 3,
            "held in the stream": 0,
            "capped in the stream": 3,
            "keys missing": [],
        }
        assert seen == want, when

    replicas = [Sidecar(tmp_path, name, app, {}) for name in ("r1", "r2")]
    third = Sidecar(tmp_path, "o1", other, {})
    try:
        for s in [*replicas, third]:
            s.start()
        for s in [*replicas, third]:
            s.wait_ready()
        wait_for(
            lambda: len(http_app.requests_for("/jobs/capped")) == 3, 30, what="capped's 3 runs"
        )
        wait_for(others_seen, 30, interval=0.5, what="the third sidecar seeing both jobs run")
        # A fleet that has run together for a while (the old sweep looked every 5 s).
        together = time.time()
        wait_for(lambda: ticks_after(together, 12), 30, what="12 slots run by the whole fleet")
        wait_for(lambda: ran(nats_server.url, "capped") == 3, 10, what="3 runs in the stream")
        check_intent("before the replicas left")

        # 1. Both replicas of the jobs away, the other app's sidecar up throughout.
        for s in replicas:
            assert s.terminate(30) == 0
        left = time.monotonic()
        gone: dict[str, float] = {}
        while (away := time.monotonic() - left) < AWAY:
            for key, value in values(nats_server.url).items():
                if value is None:
                    gone.setdefault(key, round(away))
            assert third.proc is not None and third.proc.poll() is None, third.log()
            time.sleep(2.0)
        back = time.time()
        for s in replicas:
            s.start()
        for s in replicas:
            s.wait_ready()
        wait_for(lambda: ticks_after(back, 5), 30, what="5 slots run after the return")
        check_intent(f"after {AWAY:g} s away (keys gone after: {gone})")
        assert gone == {}, gone

        # 2. The whole fleet scaled to zero, past every presence's TTL, then back.
        for s in [*replicas, third]:
            assert s.terminate(30) == 0
        wait_for(lambda: not _instances(nats_server.url), 40, interval=1.0, what="no presence")
        back = time.time()
        for s in [third, *replicas]:
            s.start()
        for s in [third, *replicas]:
            s.wait_ready()
        wait_for(lambda: ticks_after(back, 5), 30, what="5 slots run after scaling up")
        check_intent("after the fleet was scaled to zero")
    finally:
        for s in [*replicas, third]:
            s.kill()
    assert "state bucket: removed" not in third.log(), third.log()


def _instances(url: str) -> list[str]:
    """The presence keys in the bucket now."""

    async def read() -> list[str]:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value("CRON_STATE")
            return [k for k in await bucket_keys(kv) if k.startswith("instance.")]
        finally:
            await nc.close()

    return asyncio.run(read())
