"""Slots due while NATS is away run late, once, when it is back within max_late.

A sidecar that loses NATS keeps its view of the state bucket and reads the
bucket again once it reconnects (sidecar/store/watch.py); a slot after what that
view last heard waits for the new read before it is judged (docs/GUARANTEES.md,
"One fate per slot", rule 3; sidecar/fleet/freshness.py ``reread``). Neither
may cost a slot whose claim can still be made: the slots of the outage's later
seconds, after the watch stopped, run late once NATS is back, none twice; and a
pause stored while the bucket is read again keeps the slots after it.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from tests.support import (
    NatsServer,
    RecordingApp,
    base,
    cli_config,
    job,
    run_cli,
    sidecars,
    slots,
    wait_for,
)

OUTAGE = 16.0  # longer than the watch's look and its request's timeout: it stops


def test_slots_due_while_nats_is_away_run_late_once_when_it_is_back(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("tick", max_late="30s")])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]):
        wait_for(lambda: len(http_app.requests_for("/jobs/tick")) >= 2, 20, what="ticks")
        nats_server.kill()
        down = time.time()
        time.sleep(OUTAGE)
        nats_server.start()
        up = time.time()
        # The slots due while NATS was away, after the first seconds (the watch stopped).
        away = {s for s in range(int(down + 10) * 1000, int(up - 1) * 1000, 1000)}

        wait_for(
            lambda: away <= set(slots(http_app, "/jobs/tick")),
            30,
            interval=0.5,
            what=f"the slots {sorted(away)} run",
        )
    ran = Counter(slots(http_app, "/jobs/tick"))
    assert not {s: n for s, n in ran.items() if n > 1}, ran


def test_a_pause_stored_while_the_bucket_is_read_again_keeps_the_slots_after_it(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """After a reconnect the sidecar reads the bucket again, slowly here (the
    ``watch.read`` failpoint: 5 s, at start and after the reconnect); an operator
    pauses the job meanwhile. The view from before has no pause, and the probe
    cannot finish while no watch follows the bucket (it gives up after 2 s): a
    slot after the pause waits for the read instead of being judged by that view,
    and none runs."""
    config = base(nats_server, http_app, [job("tick", max_late="20s")])
    env = {"ANARCHON_FAILPOINTS": "watch.read=2*sleep(5)"}
    with sidecars(tmp_path, [("s0", config, env)]) as (proc,):
        wait_for(lambda: len(http_app.requests_for("/jobs/tick")) >= 2, 30, what="ticks")
        nats_server.stop()
        nats_server.start()
        wait_for(lambda: "reconnected to NATS" in proc.log(), 20, what="the reconnect")
        res = run_cli("pause", "tick", "-c", cli_config(tmp_path, config))
        assert res.returncode == 0, res.stderr
        paused_at = time.time()
        wait_for(
            lambda: proc.metric("anarchon_job_paused", {"job": "tick"}) == 1,
            20,
            what="the pause in the view",
        )
        time.sleep(2.0)  # every slot judged before the read came in is decided by now
        after = [s for s in slots(http_app, "/jobs/tick") if s / 1000 > paused_at]
    assert not after, f"slots after the pause ran: {after}"
