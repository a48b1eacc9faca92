"""The page and ``/api/v1/jobs`` build the objects of the jobs they show, not of every
job (issue 49: with 30,000 bucket jobs a request was cut off at 10 s).

One real sidecar on a real nats-server takes up a few thousand jobs of the
state bucket (``job import``); one of them runs every second and fails at the
app. Each request's debug line says how many job objects it built: a page of
20 builds at most 20 (it built every job's before), a glob builds its
matches, "problems only" builds the failing job's alone and finds it.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from sidecar.config.load import parse_config
from sidecar.store.state import state_spec
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    base,
    cli_config,
    job,
    run_cli,
    taken_up,
    wait_for,
)

YEARLY = "0 0 1 1 *"
JOBS = 3000
BUILT = re.compile(r"fleet page: (\d+) of (\d+) job objects built")


def builds(proc: Sidecar, since: int) -> list[tuple[int, int]]:
    """(built, asked) of each request's debug line after log offset `since`."""
    return [(int(a), int(b)) for a, b in BUILT.findall(proc.log()[since:])]


def taken_up_by(server: NatsServer, config: dict[str, Any], instance: str) -> int:
    """How many bucket jobs `instance`'s presence says it runs (-1: no presence yet):
    read from the bucket, so that no request to the page builds anything before."""
    return asyncio.run(taken_up(server, state_spec(parse_config(config, {})).bucket, instance))


def api(proc: Sidecar, query: str) -> dict[str, Any]:
    code, body = proc.get(f"/api/v1/jobs?{query}")
    assert code == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def test_a_page_of_3000_bucket_jobs_builds_its_page_only(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    http_app.status["/jobs/tenant-0007"] = 500
    config = base(nats_server, http_app, [{"name": "keep", "schedule": YEARLY}])
    config["bucket_jobs"] = {"max_jobs": JOBS}
    cfg = cli_config(tmp_path, config)
    items = [{"name": f"tenant-{i:04d}", "schedule": YEARLY, "id": f"t/{i}"} for i in range(JOBS)]
    items[7] = {**job("tenant-0007"), "id": "t/7"}
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(items))
    proc = Sidecar(tmp_path, "s1", config, {"ANARCHON_LOG_LEVEL": "debug"}).start()
    try:
        proc.wait_ready()
        done = run_cli("job", "import", str(path), "-c", cfg)
        assert done.returncode == 0, done.stderr
        wait_for(
            lambda: taken_up_by(nats_server, config, "s1") == JOBS,
            60,
            what="every imported job taken up",
        )
        wait_for(lambda: len(http_app.requests_for("/jobs/tenant-0007")) >= 2, 20, what="runs")

        # The first request after the jobs came: it built every job's object before.
        since = len(proc.log())
        got = api(proc, "limit=20")
        assert builds(proc, since) and all(built <= 20 for built, _ in builds(proc, since))
        assert [j["name"] for j in got["jobs"]] == ["keep"] + [f"tenant-{i:04d}" for i in range(19)]
        assert got["selection"]["next_after"] == "tenant-0018"
        nxt = api(proc, "limit=20&after=tenant-0018")
        assert nxt["jobs"][0]["name"] == "tenant-0019"
        globbed = api(proc, "job=tenant-29*")
        assert globbed["selection"]["matched"] == 100 and len(globbed["jobs"]) == 100
        code, html = proc.get("/")
        assert code == 200 and 'id="next-jobs"' in html
        # Each request built the objects it shows (the page: its 200), never every job's.
        seen = builds(proc, since)
        assert len(seen) >= 4, proc.log()[since:][-2000:]
        assert all(asked <= 200 and built <= asked for built, asked in seen), seen

        # The rows a viewer's event names: those rows only (an unknown name: none).
        since = len(proc.log())
        code, rows = proc.get("/fragment/jobs?names=tenant-2990,tenant-0003,nope")
        assert code == 200
        assert re.findall(r'<tr id="job-([^"]+)"', rows) == ["tenant-0003", "tenant-2990"]
        assert builds(proc, since) and all(asked == 2 for _, asked in builds(proc, since))

        # Problems only: the failing job is found without building the others.
        def failing() -> bool:
            return [j["name"] for j in api(proc, "problems=1")["jobs"]] == ["tenant-0007"]

        wait_for(failing, 20, what="the failing job among the problems")
        since = len(proc.log())
        shown = api(proc, "problems=1")
        assert shown["jobs"][0]["problems"], shown
        assert shown["selection"]["matched"] == 1
        assert builds(proc, since) and all(asked <= 1 for _, asked in builds(proc, since))
    finally:
        proc.terminate()
