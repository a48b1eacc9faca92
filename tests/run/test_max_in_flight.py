"""``target.max_in_flight`` (issue 49): a burst of jobs due at one instant does not
open a connection each to the app; a run that cannot get a place by its slot +
max_late is recorded skipped ``late``, never sent late.

A real sidecar, a real nats-server and a real app that answers in 0.6 s: eight
jobs due every two seconds on one path. Bounded at 2, the app never has more
than two requests of the sidecar at once, and every claimed slot has one fate
in the stream (ran, or skipped late naming the bound). Without the bound the
same burst reaches the app eight at once: the test can fail.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from tests.support import NatsServer, RecordingApp, base, results, sidecars, wait_for

JOBS = [
    {
        "name": f"burst-{i}",
        "schedule": "*/2 * * * * *",
        "jitter": "0ms",
        "max_late": "1s",
        "request": {"path": "/jobs/burst"},
    }
    for i in range(8)
]
PATH = "/jobs/burst"


def run_burst(
    tmp_path: Path, nats_server: NatsServer, app: RecordingApp, bound: int | None
) -> None:
    app.delay[PATH] = 0.6
    config = base(nats_server, app, JOBS)
    if bound is not None:
        config["target"]["max_in_flight"] = bound
    with sidecars(tmp_path, [("s1", config, {})]):
        since = time.time()
        wait_for(lambda: len(app.requests_for(PATH)) >= 12, 30, what="three bursts")
        wait_for(
            lambda: sum(len(results(nats_server.url, j["name"])) for j in JOBS) >= 24,
            30,
            what="their results",
        )
    for j in JOBS:
        fates = Counter(
            int(m.data["slot"])
            for m in results(nats_server.url, j["name"])
            if m.data["slot"] / 1000 > since
        )
        assert fates and max(fates.values()) == 1, (j["name"], fates)


def test_a_burst_keeps_to_max_in_flight(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    run_burst(tmp_path, nats_server, http_app, 2)
    assert http_app.max_in_flight[PATH] <= 2, http_app.max_in_flight
    late = [
        m.data
        for j in JOBS
        for m in results(nats_server.url, j["name"])
        if m.data["status"] == "skipped"
    ]
    # 8 runs of 0.6 s two at a time take 2.4 s: past max_late (1 s) some wait too long.
    assert late, "no run waited past max_late"
    assert all("target.max_in_flight" in (d.get("error") or "") for d in late), late[:2]
    sent = [r for r in http_app.requests_for(PATH)]
    for r in sent:  # nothing sent after its slot + max_late
        assert r.at - int(r.headers["X-Anarchon-Slot"]) / 1000 < 1.0 + 0.5, r.headers


def test_without_a_bound_the_burst_reaches_the_app_at_once(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    run_burst(tmp_path, nats_server, http_app, None)  # the default, 256
    assert http_app.max_in_flight[PATH] >= 6, http_app.max_in_flight
