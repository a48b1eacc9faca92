"""What ``status --json`` and the page show of issue 50's keys, on three real sidecars:
a job's request template and run parameters (never a secret of it), its
concurrency key, limit and slots held, its chain, its shared calendars by name
and the calendar that keeps its next slot from running (sidecar/admin/requestview.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sidecar.admin.requestview import shown_path
from tests.admin.test_page import request, row_of
from tests.support import NatsServer, RecordingApp, base, cli_config, job, run_cli, sidecars

SECRET = "s3cret-value"


def test_status_and_the_page_show_the_request_template_chain_concurrency_and_calendars(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    today = datetime.now(UTC).date()
    days = [str(today - timedelta(days=1)), str(today), str(today + timedelta(days=1))]
    config = base(
        nats_server,
        http_app,
        [
            job(
                "a",
                schedule="*/2 * * * * *",
                request={
                    "path": f"/jobs/a?slot={{slot}}&token={SECRET}",
                    "headers": {
                        "Authorization": f"Bearer {SECRET}",
                        "X-Slot": "{slot}",
                        "X-Run": "{run_id}",
                        "X-Plain": SECRET,
                    },
                    "body": f'{{"run": "{{run_id}}", "key": "{SECRET}", "n": {{attempt}}}}',
                },
                answer={"redact": ["X-Run"]},
                concurrency={"key": "db-heavy", "limit": 2},
            ),
            {"name": "b", "after": {"job": "a", "on": "success"}, "max_late": "3s"},
            job("off", schedule="0 * * * * *", exclude=["calendar:freeze"]),
        ],
    )
    config["calendars"] = {"freeze": {"dates": days}}
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        done = run_cli("status", "-c", cli_config(tmp_path, config), "--json")
        assert done.returncode == 0, done.stderr
        assert SECRET not in done.stdout, done.stdout[done.stdout.find(SECRET) - 400 :][:500]
        jobs = {j["name"]: j for j in json.loads(done.stdout)["jobs"]}
        a = jobs["a"]
        assert a["request"] == {
            "method": "POST",
            "url": http_app.url,
            "path": "/jobs/a?slot={slot}&token=[redacted]",
            "headers": {
                "Authorization": "[redacted]",  # a credential's name
                "X-Plain": "[redacted]",  # no placeholder: could be anything
                "X-Run": "[redacted]",  # named in answer.redact
                "X-Slot": "{slot}",
            },
            "body_params": ["attempt", "run_id"],
            "params": ["attempt", "run_id", "slot"],
        }
        conc = a["concurrency"]
        assert (conc["key"], conc["limit"]) == ("db-heavy", 2)
        assert 0 <= conc["held_by_job"] <= conc["held"] <= 2
        assert jobs["b"]["after"] == {"job": "a", "on": "success"}
        assert jobs["b"]["chain"] == "after a on success"
        off = jobs["off"]
        assert [c["name"] for c in off["calendars"]] == ["freeze"]
        assert off["next_excluded"]["by"] == f"calendar:freeze {days[1]}"
        assert a["next_excluded"] is None and a["calendars"] == []
        # The page: the index rows, and the job's own page with its request.
        status, _, page = request(procs[0], "/")
        html = page.decode()
        assert status == 200 and SECRET not in html
        assert "calendars: freeze" in row_of(html, "off")
        assert f"excluded (calendar:freeze {days[1]})" in row_of(html, "off")
        assert "concurrency: db-heavy (at most 2 at once); " in row_of(html, "a")
        assert " held now</div>" in row_of(html, "a")
        assert "after a on success" in row_of(html, "b")
        status, _, page = request(procs[1], "/jobs/a")
        html = page.decode()
        assert status == 200 and SECRET not in html
        assert 'id="job-request"' in html and "/jobs/a?slot={slot}&amp;token=[redacted]" in html
        assert "X-Slot: {slot}" in html and "Authorization: [redacted]" in html
        assert "run parameters {attempt}, {run_id}, {slot}" in html


def test_a_query_value_is_shown_only_when_it_is_nothing_but_placeholders() -> None:
    assert shown_path("/x") == "/x"
    assert shown_path("/x/{job}?a={slot}&b=2&c={job}{slot}&d=x{slot}") == (
        "/x/{job}?a={slot}&b=[redacted]&c={job}{slot}&d=[redacted]"
    )
