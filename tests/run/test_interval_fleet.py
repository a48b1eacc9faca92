"""``@every`` intervals run by a fleet: three real sidecars on a real nats-server run
an interval's slots once each, anchored to the epoch (or ``offset``/``from``),
never to when a process started (the slot maths: tests/when/test_intervals.py)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
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


def test_three_sidecars_run_each_interval_slot_once_on_the_epoch_grid(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(
        nats_server,
        http_app,
        [
            job("ev", schedule="@every 3s offset 1s"),
            job("mixed", schedule=["@every 2s", "*/3 * * * * *"], timezone="Asia/Kolkata"),
        ],
    )
    cfg = cli_config(tmp_path, config)
    checked = run_cli("check", "-c", cfg)
    assert checked.returncode == 0, checked.stderr
    assert "schedule '@every 3s offset 1s': Every 3s, counted from the Unix epoch + 1s" in (
        checked.stdout
    )
    nexts = [ln for ln in checked.stdout.splitlines() if ln.strip().startswith("next:")][:3]
    assert len(nexts) == 3
    # Started one after the other: a grid counted from each process's start would differ.
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]):
        wait_for(lambda: len(set(slots(http_app, "/jobs/ev"))) >= 6, 40, what="six ev runs")
        wait_for(lambda: len(set(slots(http_app, "/jobs/mixed"))) >= 8, 20, what="mixed runs")
        done = run_cli("status", "-c", cfg, "--json")
        assert done.returncode == 0, done.stderr
        view = next(j for j in json.loads(done.stdout)["jobs"] if j["name"] == "ev")
        assert view["schedules"] == [
            {"cron": "@every 3s offset 1s", "text": "Every 3s, counted from the Unix epoch + 1s"}
        ]
        nxt = datetime.fromisoformat(view["next_slot"].replace("Z", "+00:00"))
        assert nxt.timestamp() % 3 == 1
        table = run_cli("status", "-c", cfg).stdout
        assert "ev: schedule '@every 3s offset 1s'" in table
    ev = slots(http_app, "/jobs/ev")
    assert max(Counter(ev).values()) == 1, "an interval slot ran twice"
    assert all(s % 3000 == 1000 for s in ev), ev
    # No hole: consecutive slots of the grid, from the first run to the last.
    ordered = sorted(ev)
    assert ordered == list(range(ordered[0], ordered[-1] + 1, 3000)), ordered
    mixed = slots(http_app, "/jobs/mixed")
    assert max(Counter(mixed).values()) == 1
    assert all(s % 2000 == 0 or s % 3000 == 0 for s in mixed)
    assert any(s % 2000 == 0 and s % 3000 != 0 for s in mixed)
    assert any(s % 3000 == 0 and s % 2000 != 0 for s in mixed)


def test_catchup_latest_runs_a_missed_interval_slot_once(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """A fleet started just after a slot of a long interval catches that slot up."""
    # The stream exists first: a slot dated before its creation is never claimed.
    with sidecars(tmp_path, [("first", base(nats_server, http_app, [job("warm")]), {})]):
        wait_for(lambda: slots(http_app, "/jobs/warm"), 20, what="the stream in use")
    anchor = int(datetime.now(UTC).timestamp()) + 1  # after the stream's creation
    wait_for(lambda: datetime.now(UTC).timestamp() > anchor + 1.5, 5, what="the slot passed")
    stamp = datetime.fromtimestamp(anchor, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = base(
        nats_server,
        http_app,
        [job("hourly", schedule=f"@every 1h from {stamp}", catchup="latest", max_late="1m")],
    )
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]):
        wait_for(lambda: slots(http_app, "/jobs/hourly"), 30, what="the caught-up slot")
        request = http_app.requests_for("/jobs/hourly")[0]
        assert request.headers["X-Anarchon-Trigger"] == "catchup"
    assert slots(http_app, "/jobs/hourly") == [anchor * 1000]
