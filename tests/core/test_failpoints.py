"""Failpoints, and the two holes they were made to prove closed.

A winner frozen between its claim and its request (SIGSTOP, a long pause)
must send nothing once slot + max_late has passed; a claim retried after a
suspend must not be published outside its window. Both run real sidecar
processes against a real nats-server and a real app, stopped at an exact
point by a failpoint.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg

from sidecar.after.signing import Signer
from sidecar.core import clock as clock_module
from sidecar.core import failpoints
from sidecar.core.clock import Clock
from sidecar.core.errors import FailpointError
from sidecar.core.failpoints import Failpoint, parse
from sidecar.run.trigger import Trigger
from tests.run.test_trigger import SLOT, TOKEN, job_for
from tests.support import (
    ROOT,
    NatsServer,
    RecordingApp,
    Sidecar,
    read_stream,
    run_cli,
    sidecar_env,
    stopped,
    wait_for,
    write_config,
)


@pytest.mark.parametrize(
    ("text", "armed"),
    [
        ("", {}),
        ("claim.won=sigstop", {"claim.won": Failpoint("sigstop")}),
        (
            " claim.won=1*sigstop ; claim.before_retry=2*suspend(300)",
            {
                "claim.won": Failpoint("sigstop", 0.0, 1),
                "claim.before_retry": Failpoint("suspend", 300.0, 2),
            },
        ),
        ("trigger.before_send=sleep(0.25)", {"trigger.before_send": Failpoint("sleep", 0.25)}),
        ("claim.after_publish=1*ackloss", {"claim.after_publish": Failpoint("ackloss", 0, 1)}),
        ("claim.won=off", {"claim.won": Failpoint("off")}),
        ("lease.create=timeout(2)", {"lease.create": Failpoint("timeout", 2.0)}),
    ],
)
def test_parse(text: str, armed: dict[str, Failpoint]) -> None:
    assert parse(text) == armed


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("claim.won", "'claim.won'"),
        ("claim.won=explode", "'claim.won=explode'"),
        ("claim.won=sleep()", "'claim.won=sleep()'"),
        ("claim.lost=sigstop", "no failpoint 'claim.lost'"),
        ("claim.won=x*sigstop", "'claim.won=x*sigstop'"),
    ],
)
def test_parse_refuses_naming_the_entry(text: str, named: str) -> None:
    with pytest.raises(FailpointError, match="ANARCHON_FAILPOINTS") as info:
        parse(text)
    assert named in str(info.value)


def test_inert_without_the_variable() -> None:
    """Production: nothing armed, every point's branch is never taken."""
    code = (
        "import sidecar.cli.daemon, sidecar.core.failpoints as f; "
        "print(f.ENABLED, f.ARMED, sorted(f.POINTS))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=sidecar_env(),
        cwd=ROOT,
        check=True,
    )
    assert out.stdout.startswith("False {} "), out.stdout
    assert "failpoint" not in out.stderr


def test_every_point_is_in_the_code() -> None:
    """A documented point that no code reaches would arm nothing."""
    source = "".join(p.read_text() for p in (ROOT / "sidecar").rglob("*.py"))
    for name in failpoints.POINTS:
        assert f'failpoints.hit("{name}")' in source, name


def test_a_malformed_value_stops_the_sidecar_at_start(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", {"jobs": [{"name": "j", "schedule": "* * * * *"}]})
    out = run_cli("run", "-c", str(config), env={"ANARCHON_FAILPOINTS": "claim.won=explode"})
    assert out.returncode == 2, out
    assert "ANARCHON_FAILPOINTS: cannot parse 'claim.won=explode'" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_simulated_suspend_moves_the_wall_and_boot_clocks_not_the_monotonic() -> None:
    clock = Clock()
    wall, boot, mono = clock.wall(), clock.monotonic(), time.monotonic()
    try:
        clock_module.simulate_suspend(600)
        assert clock.wall() - wall >= 600
        assert clock.monotonic() - boot >= 600
        assert time.monotonic() - mono < 5
    finally:
        clock_module.simulate_suspend(-600)


def test_deadlines_count_time_spent_suspended() -> None:
    """CLOCK_BOOTTIME, where there is one: never behind CLOCK_MONOTONIC."""
    if not hasattr(time, "CLOCK_BOOTTIME"):
        pytest.skip("no CLOCK_BOOTTIME on this system")
    boot = Clock.monotonic()
    assert abs(boot - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1
    assert boot >= time.monotonic() - 0.001


async def test_no_request_goes_out_after_send_by(http_app: RecordingApp) -> None:
    clock = Clock()
    async with Trigger(Signer.of(None), clock, "web-1") as trigger:
        result = await trigger.fire(
            job_for(http_app.url),
            SLOT,
            TOKEN,
            clock.monotonic() + 10,
            send_by=clock.monotonic() - 0.001,
        )
    assert result.late and not result.ok
    assert result.error is not None and result.error.startswith("late: not sent")
    assert http_app.requests == []


async def test_the_last_look_is_after_connecting(
    http_app: RecordingApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frozen with the connection open, the request still does not go out late."""
    monkeypatch.setattr(failpoints, "ENABLED", True)
    monkeypatch.setattr(failpoints, "ARMED", parse("trigger.before_send=1*sleep(0.3)"))
    clock = Clock()
    async with Trigger(Signer.of(None), clock, "web-1") as trigger:
        job = job_for(http_app.url)
        late = await trigger.fire(
            job, SLOT, TOKEN, clock.monotonic() + 10, send_by=clock.monotonic() + 0.1
        )
        # The point fired once; the next request goes out in time.
        sent = await trigger.fire(
            job, SLOT, TOKEN, clock.monotonic() + 10, send_by=clock.monotonic() + 5
        )
    assert late.late and late.delivery_tries == 1
    assert sent.ok and not sent.late
    assert len(http_app.requests) == 1


# ---------------------------------------------------------------- whole processes


def one_job(nats_server: NatsServer, app: RecordingApp, **job: Any) -> dict[str, Any]:
    return {
        "nats": {"servers": [nats_server.url]},
        "target": {"url": app.url, "timeout": "5s"},
        "jobs": [
            {"name": "tick", "schedule": "* * * * * *", "jitter": "0s", "max_late": "2s", **job}
        ],
    }


def app_slots(app: RecordingApp) -> list[int]:
    return [int(r.headers["X-Anarchon-Slot"]) for r in app.requests_for("/jobs/tick")]


def results(nats_server: NatsServer) -> dict[int, dict[str, Any]]:
    return {m.data["slot"]: m.data for m in read_stream(nats_server.url) if "status" in m.data}


def test_a_winner_frozen_past_max_late_sends_nothing_and_records_the_slot_skipped(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    sidecar = Sidecar(
        tmp_path,
        "frozen",
        one_job(nats_server, http_app),
        {"ANARCHON_FAILPOINTS": "claim.won=1*sigstop"},
    ).start()
    assert sidecar.proc is not None
    pid = sidecar.proc.pid
    try:
        wait_for(lambda: stopped(pid), 30, what="the winner stopped at claim.won")
        claims = [m.data for m in read_stream(nats_server.url) if m.subject.endswith(".claims")]
        assert len(claims) == 1, claims
        frozen = claims[0]["slot"]
        time.sleep(3)  # the fault itself: frozen past max_late (2 s)
        assert stopped(pid)
        os.kill(pid, signal.SIGCONT)
        wait_for(lambda: frozen in results(nats_server), 20, what="the frozen slot's result")
        wait_for(lambda: len(app_slots(http_app)) >= 2, 20, what="runs after the thaw")
    finally:
        code = sidecar.terminate()
    assert code == 0
    record = results(nats_server)[frozen]
    assert record["status"] == "skipped", record
    assert record["error"].startswith("late: not sent"), record
    assert frozen not in app_slots(http_app)
    assert min(app_slots(http_app)) > frozen
    assert "status=skipped error='late: not sent" in sidecar.log()


class ClaimListener:
    """Every claim published on core NATS, duplicates included (the stream keeps one)."""

    def __init__(self, url: str, subject: str) -> None:
        self.url = url
        self.subject = subject
        self.msg_ids: list[str] = []
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.done: asyncio.Event | None = None
        self.thread = threading.Thread(
            target=lambda: self.loop.run_until_complete(self._run()), daemon=True
        )

    async def _run(self) -> None:
        self.done = asyncio.Event()
        nc = await nats.connect(self.url)

        async def seen(msg: Msg) -> None:
            self.msg_ids.append((msg.headers or {}).get("Nats-Msg-Id", ""))

        await nc.subscribe(self.subject, cb=seen)
        await nc.flush()
        self.ready.set()
        await self.done.wait()
        await nc.close()

    def __enter__(self) -> ClaimListener:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.done is not None
        self.loop.call_soon_threadsafe(self.done.set)
        self.thread.join(10)
        self.loop.close()


def test_a_claim_is_not_retried_after_a_suspend_that_outlasted_its_window(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """The first publish is stored but its ack is lost; the machine then
    "suspends" for 600 s (the duplicate window is 2 min). The retry would get a
    duplicate answer, read its own token and run the slot ten minutes late;
    outside the window it would be stored anew. It must not go out at all."""
    # The simulated suspend jumps the sidecar's wall clock 600 s ahead; a
    # far-off schedule keeps it from claiming the slots of its new "now".
    config = one_job(nats_server, http_app)
    sidecar = Sidecar(
        tmp_path,
        "suspended",
        config,
        {"ANARCHON_FAILPOINTS": "claim.after_publish=1*ackloss;claim.before_retry=1*suspend(600)"},
    )
    with ClaimListener(nats_server.url, "cron.tick.claims") as listener:
        sidecar.start()
        try:
            wait_for(
                lambda: "no definite answer before the deadline" in sidecar.log(),
                30,
                what="the claim given up",
            )
            first = listener.msg_ids[0]
            # Whatever it claims later is another slot (its clock is 600 s ahead).
            wait_for(lambda: len(listener.msg_ids) >= 2, 20, what="later claims")
        finally:
            code = sidecar.terminate()
    assert code == 0
    assert listener.msg_ids.count(first) == 1, listener.msg_ids
    slot = int(first.rsplit(":", 1)[1])
    assert slot not in app_slots(http_app)
    assert "suspend" in sidecar.log()  # the failpoint said it fired
