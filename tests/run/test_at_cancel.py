"""A cancel of a one-off run is either done (it never runs) or too late (it runs),
and says which: never "cancelled" for a run that then happens.

The sidecars read ``at.<job>`` at the instant plus their jitter, then claimed:
a cancel stored between that read and the claim answered "cancelled" (with a
note that it "may have been claimed already"), and the run happened anyway.
Now the first sidecar marks the entry ``claiming`` by compare-and-set before it
claims; a cancel that finds it marked is too late and says so (exit 1), one
that comes first removes it and nothing is claimed. The failpoint
``at.marked=1*sleep(3)`` holds the sidecar between its mark and its claim.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sidecar.core.clock import rfc3339
from tests.support import (
    NatsServer,
    RecordingApp,
    base,
    cli_config,
    job,
    run_cli,
    sidecars,
    wait_for,
)

YEARLY = "0 0 1 1 *"


def at_calls(app: RecordingApp) -> list[int]:
    return [
        int(r.headers["X-Anarchon-Slot"])
        for r in app.requests_for("/jobs/a")
        if r.headers.get("X-Anarchon-Trigger") == "at"
    ]


def queue(cfg: str, when: str) -> int:
    done = run_cli("at", "a", "-c", cfg, when, "--json")
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["queued"]["slot"])


def test_a_cancel_after_a_sidecar_started_claiming_is_too_late_and_says_so(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a", schedule=YEARLY, max_late="10s")])
    cfg = cli_config(tmp_path, config)
    held = {"ANARCHON_FAILPOINTS": "at.marked=1*sleep(3)"}
    with sidecars(tmp_path, [("s0", config, held)]) as procs:
        slot = queue(cfg, "2s")
        wait_for(lambda: "failpoint at.marked" in procs[0].log(), 15, what="the mark")
        late = run_cli("at", "a", "-c", cfg, "--cancel", rfc3339(slot / 1000))
        assert late.returncode == 1, (late.stdout, late.stderr)
        assert "too late to cancel the one-off run at" in late.stderr, late.stderr
        assert "s0 is claiming it" in late.stderr, late.stderr
        assert "cancelled" not in late.stdout, late.stdout
        wait_for(lambda: at_calls(http_app), 15, what="the one-off run")
        assert at_calls(http_app) == [slot]

        # Before any sidecar marked it: cancelled, and never run.
        other = queue(cfg, "3s")
        gone = run_cli("at", "a", "-c", cfg, "--cancel", rfc3339(other / 1000), "--json")
        assert gone.returncode == 0, gone.stderr
        answer = json.loads(gone.stdout)
        assert [r["slot"] for r in answer["cancelled"]] == [other] and not answer["too_late"]
        wait_for(lambda: time.time() > other / 1000 + 0.2 + 10 + 0.5, 20, what="its window")
        assert at_calls(http_app) == [slot], rfc3339(other / 1000)
