"""The fleet page's HTTP side with real sidecars, a real nats-server and a real app.

The JSON API agrees with ``status --json`` field for field; actions need the
token (403 without a token file, 401 with a wrong one), are recorded in the
state bucket and shown on the job's page; the headers forbid what the page
does not need; hostile stream data is escaped; a slow page render never
holds up a slot. The browser side is in test_browser.py.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.clock import parse_rfc3339
from tests.admin.test_bucket_jobs import put_key
from tests.fleet.test_fleet import base, cli_config, job, slots
from tests.run.test_schedules import history
from tests.support import NatsServer, RecordingApp, Sidecar, run_cli, sidecars, wait_for

TOKEN = "s3cret-token-for-the-page-0123"


def request(
    sc: Sidecar,
    path: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(sc.base_url + path, data=body, method=method)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def api(sc: Sidecar, path: str) -> Any:
    status, _, body = request(sc, path)
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def shape(value: Any) -> Any:
    """The keys of nested objects (lists by their first element): what "field for field" means."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__ if value is not None else None


def same_keys(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), (where, sorted(set(a) ^ set(b)))
        for k in a:
            same_keys(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and a and b:
        same_keys(a[0], b[0], f"{where}[0]")


def test_api_agrees_with_status_json_and_the_pages_answer(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a"), job("b", schedule="*/2 * * * * *")])
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        wait_for(lambda: len(slots(http_app, "/jobs/b")) >= 2, 20, what="runs of b")
        run_cli("pause", "a", "-c", cfg, "--reason", "db <migration>")
        wait_for(lambda: api(procs[0], "/api/v1/jobs/a")["paused"], 10, what="pause on the page")
        done = run_cli("status", "-c", cfg, "--json")
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        listed = api(procs[0], "/api/v1/jobs")
        jobs = listed["jobs"]
        fleet = api(procs[0], "/api/v1/fleet")
        from_api = {**fleet, "jobs": jobs, "selection": listed["selection"]}
        assert from_api.pop("served_by") == "s0"
        same_keys(status, from_api)
        by_name = {j["name"]: j for j in jobs}
        for cli_job in status["jobs"]:
            page_job = by_name[cli_job["name"]]
            for field in (
                "paused",
                "paused_by",
                "paused_reason",
                "paused_at",
                "schedules",
                "timezone",
                "settings_differ",
                "stream_problem",
                "target",
            ):
                assert cli_job[field] == page_job[field], field
        assert {i["id"] for i in status["instances"]} == {i["id"] for i in fleet["instances"]}
        b = by_name["b"]
        assert b["schedules"] == [{"cron": "*/2 * * * * *", "text": "Every 2 seconds (UTC)"}]
        assert len(b["next_slots"]) == 3 and b["recent"], b
        assert all(r["status"] in ("succeeded", "running") for r in b["recent"])
        runs = api(procs[0], "/api/v1/jobs/b/runs?limit=1")
        assert len(runs["runs"]) == 1 and runs["next_before"] == runs["runs"][0]["fence"]
        older = api(procs[0], f"/api/v1/jobs/b/runs?limit=1&before={runs['next_before']}")
        assert older["runs"][0]["fence"] < runs["runs"][0]["fence"]
        first = runs["runs"][0]
        assert {"fence", "late_ms", "token", "instance", "scheduled_at"} <= set(first)
        # The pages: the index and a job's page, escaped, with the security headers.
        status_code, headers, html = request(procs[1], "/")
        assert status_code == 200 and b"<table" in html
        csp = headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert b"db &lt;migration&gt;" in html and b"db <migration>" not in html
        assert b"read-only" in html  # no token file: no sign-in form
        code, _, job_html = request(procs[1], "/jobs/b")
        assert code == 200 and first["token"].encode() in job_html
        assert request(procs[1], "/jobs/nosuch")[0] == 404
        assert request(procs[1], "/api/v1/jobs/nosuch")[0] == 404
        # No token file: every POST is refused, nothing changes.
        for path in ("/api/v1/jobs/a/resume", "/jobs/a/resume", "/login"):
            code, _, _ = request(
                procs[0], path, "POST", b"{}", {"Authorization": f"Bearer {TOKEN}"}
            )
            assert code == 403, path
        assert api(procs[0], "/api/v1/jobs/a")["paused"]
        # The whole page with its assets stays small.
        size = len(html) + sum(
            len(request(procs[0], f"/static/{n}")[2]) for n in ("page.css", "page.js")
        )
        assert size < 100_000, size


def test_actions_need_the_token_are_recorded_and_shown(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"# operators\nalice:{TOKEN}\nbob:another-token-of-sixteen+\n")
    signing = tmp_path / "signing"
    signing.write_text("signing-secret-never-shown")
    config = base(nats_server, http_app, [job("a"), job("b")])
    config["admin"] = {"token_file": str(token_file)}
    config["target"]["signing_secret_file"] = str(signing)
    config["target"]["headers"] = {"Authorization": "Bearer app-header-never-shown"}
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        wait_for(lambda: len(slots(http_app, "/jobs/a")) >= 1, 20, what="a runs")
        path = "/api/v1/jobs/a/pause"
        body = json.dumps({"reason": "maintenance"}).encode()
        json_h = {"Content-Type": "application/json"}
        assert request(procs[0], path, "POST", body, json_h)[0] == 401
        wrong = {**json_h, "Authorization": "Bearer not-the-token-at-all"}
        assert request(procs[0], path, "POST", body, wrong)[0] == 401
        # A form POST without a session or CSRF token is refused too.
        assert request(procs[0], "/jobs/a/pause", "POST", b"reason=x")[0] == 401
        good = {**json_h, "Authorization": f"Bearer {TOKEN}"}
        code, _, answer = request(procs[0], path, "POST", body, good)
        assert code == 200, answer
        assert json.loads(answer)["by"] == "alice"
        paused_at = parse_rfc3339(json.loads(answer)["pause"]["at"])
        wait_for(
            lambda: all(p.metric("anarchon_job_paused", {"job": "a"}) == 1 for p in procs),
            5,
            what="paused on both",
        )

        # Recorded in the state bucket, visible from the other replica's page.
        def recorded() -> list[dict[str, Any]]:
            return list(api(procs[1], "/api/v1/jobs/a")["actions"])

        wait_for(lambda: recorded(), 5, what="the action on the other replica")
        act = recorded()[0]
        assert act["action"] == "pause" and act["by"] == "alice" and act["via"] == "api"
        assert act["from"] == "127.0.0.1" and act["instance"] == "s0"
        assert TOKEN not in json.dumps(recorded())
        _, _, html = request(procs[1], "/jobs/a")
        assert b"alice" in html and b"maintenance" in html and TOKEN.encode() not in html
        # No secret on any page or answer: tokens, the signing secret, request headers.
        for path in ("/", "/jobs/a", "/api/v1/jobs", "/api/v1/fleet", "/api/v1/jobs/a/runs"):
            seen = request(procs[1], path)[2]
            for secret in (TOKEN, "another-token", "never-shown"):
                assert secret.encode() not in seen, (path, secret)
        # A run-now from the API is run by the sidecar that serves it.
        code, _, answer = request(
            procs[1], "/api/v1/jobs/b/run-now", "POST", b"", {"Authorization": f"Bearer {TOKEN}"}
        )
        assert code == 200, answer
        run_id = json.loads(answer)["run_id"]
        wait_for(
            lambda: any(
                r.headers.get("X-Anarchon-Run-Id") == run_id
                for r in http_app.requests_for("/jobs/b")
            ),
            10,
            what="the manual run reached the app",
        )
        manual = [
            r
            for r in http_app.requests_for("/jobs/b")
            if r.headers.get("X-Anarchon-Run-Id") == run_id
        ]
        assert len(manual) == 1
        # Resume, then a second resume is a conflict.
        code, _, _ = request(procs[0], "/api/v1/jobs/a/resume", "POST", b"", good)
        assert code == 200
        assert request(procs[0], "/api/v1/jobs/a/resume", "POST", b"", good)[0] == 409
        past = json.dumps({"until": "2001-01-01T00:00:00Z"}).encode()
        assert request(procs[0], "/api/v1/jobs/a/pause", "POST", past, good)[0] == 400
        time_after = parse_rfc3339(recorded()[0]["at"])
        assert time_after >= paused_at
    late = [s for s in slots(http_app, "/jobs/a") if paused_at + 1 < s / 1000 < time_after - 0.5]
    assert late == [], "a ran while paused"
    assert max(Counter(slots(http_app, "/jobs/a")).values()) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds no token"),
        ("short", "at least 16 characters"),
        ("a b:0123456789abcdef0\n", "a name is letters"),
    ],
)
def test_a_bad_token_file_is_a_config_error_naming_the_key(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, content: str, message: str
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(content)
    config = base(nats_server, http_app, [job("a")])
    config["admin"] = {"token_file": str(token_file)}
    sc = Sidecar(tmp_path, "bad", config, {}).start()
    assert sc.proc is not None
    assert sc.proc.wait(30) == 2
    assert "admin.token_file" in sc.log() and message in sc.log()
    assert "Traceback" not in sc.log()


def test_page_off_leaves_only_metrics(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a")])
    config["admin"] = {"page": False}
    with sidecars(tmp_path, [("s0", config, {})]) as (sc,):
        assert request(sc, "/")[0] == 404
        assert request(sc, "/api/v1/jobs")[0] == 404
        assert request(sc, "/metrics")[0] == 200


def test_pause_until_ends_by_itself_and_skip_records_the_next_slot(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"alice:{TOKEN}\n")
    config = base(nats_server, http_app, [job("a"), job("c", schedule="*/10 * * * * *")])
    config["admin"] = {"token_file": str(token_file)}
    cfg = cli_config(tmp_path, config)
    good = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        wait_for(lambda: len(slots(http_app, "/jobs/a")) >= 1, 20, what="a runs")
        until = json.dumps({"until": "4s", "reason": "deploy"}).encode()
        skip = json.dumps({"count": 1, "reason": "holiday"}).encode()
        # Both refused without a token, and nothing is written.
        for path, body in (("/api/v1/jobs/a/pause", until), ("/api/v1/jobs/c/skip", skip)):
            assert (
                request(procs[0], path, "POST", body, {"Content-Type": "application/json"})[0]
                == 401
            )
        assert not api(procs[1], "/api/v1/jobs/a")["paused"]
        assert api(procs[1], "/api/v1/jobs/c")["skip_pending"] == 0

        # Pause until 4 s from now: paused on both, then over by itself on both.
        code, _, answer = request(procs[0], "/api/v1/jobs/a/pause", "POST", until, good)
        assert code == 200, answer
        end = parse_rfc3339(json.loads(answer)["pause"]["until"])
        wait_for(
            lambda: all(p.metric("anarchon_job_paused", {"job": "a"}) == 1 for p in procs),
            3,
            what="paused on both",
        )
        row = request(procs[1], "/")[2].decode()
        assert "paused</span> by alice: deploy, until" in row, row
        job_a = api(procs[1], "/api/v1/jobs/a")
        assert job_a["paused_until"] == json.loads(answer)["pause"]["until"]
        assert job_a["paused_by"] == "alice" and job_a["paused_reason"] == "deploy"
        wait_for(
            lambda: all(p.metric("anarchon_job_paused", {"job": "a"}) == 0 for p in procs),
            10,
            what="the pause over by itself on both",
        )
        wait_for(
            lambda: [s for s in slots(http_app, "/jobs/a") if s / 1000 > end + 0.5],
            10,
            what="a runs again after the pause's end",
        )
        assert not api(procs[0], "/api/v1/jobs/a")["paused"]
        ran = slots(http_app, "/jobs/a")
        start = parse_rfc3339(json.loads(answer)["pause"]["at"])
        assert not [s for s in ran if start + 1 < s / 1000 < end - 0.5], "a ran while paused"

        # Skip the next slot of c (every 10 s); asked well before it so the page shows it.
        wait_for(lambda: 1 <= time.time() % 10 <= 6, 11, what="a moment well before c's slot")
        code, _, answer = request(procs[0], "/api/v1/jobs/c/skip", "POST", skip, good)
        assert code == 200, answer
        chosen = json.loads(answer)["skipped"]
        assert len(chosen) == 1 and json.loads(answer)["skip_pending"] == 1
        wait_for(
            lambda: "next 1 run(s) skipped" in request(procs[1], "/jobs/c")[2].decode(),
            2,
            what="skip pending shown on the other replica's page",
        )
        assert api(procs[1], "/api/v1/jobs/c")["skip_pending"] == 1
        act = api(procs[1], "/api/v1/jobs/c")["actions"][0]
        assert act["action"] == "skip" and act["by"] == "alice" and act["via"] == "api"
        wait_for(
            lambda: [s for s in slots(http_app, "/jobs/c") if s > chosen[0]],
            25,
            what="c runs after the skipped slot",
        )
        assert chosen[0] not in slots(http_app, "/jobs/c")
        wait_for(
            lambda: [
                r for r in history(cfg, "c") if r["slot"] == chosen[0] and r["status"] == "skipped"
            ],
            5,
            what="the skipped slot recorded",
        )
    records = [r for r in history(cfg, "c") if r["status"] == "skipped"]
    assert [r["slot"] for r in records] == chosen
    assert records[0]["error"].startswith("skip by alice") and "holiday" in records[0]["error"]
    assert max(Counter(slots(http_app, "/jobs/c")).values()) == 1


def test_with_nats_down_the_page_answers_at_once_saying_so(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("a")])
    with sidecars(tmp_path, [("s0", config, {})]) as (sc,):
        nats_server.stop()
        wait_for(lambda: sc.get("/readyz")[0] == 503, 10, what="/readyz says not connected")
        for _ in range(2):  # the first load (nothing known yet) and the next
            started = time.monotonic()
            code, _, html = request(sc, "/")
            took = time.monotonic() - started
            assert code == 200 and took < 1.0, (code, took)
            assert b"NATS is unreachable: this sidecar is not connected" in html, html[:2000]
            started = time.monotonic()
            code, _, html = request(sc, "/jobs/a")
            took = time.monotonic() - started
            assert code == 200 and took < 1.0, (code, took)
            assert b"NATS is unreachable: this sidecar is not connected" in html, html[:2000]


def row_of(html: str, name: str) -> str:
    """The index's row of job `name`."""
    found = re.search(rf'<tr id="job-{re.escape(name)}".*?</tr>', html, re.S)
    assert found, (name, html[:3000])
    return found.group(0)


def test_the_page_says_where_a_job_comes_from_and_why_it_runs_no_more(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Issue 42's features where a user looks for them: a bucket job's source and id,
    the overlap policy and its kept slot, pending one-offs, not started / ended /
    max_runs with the count, an interval in words, and the bucket's job keys that
    do not run; every value from the bucket escaped."""
    yearly = "0 0 1 1 *"
    config = base(
        nats_server,
        http_app,
        [
            {"name": "keep", "schedule": yearly},
            {"name": "every", "schedule": "@every 90m offset 15m"},
            {
                "name": "later",
                "schedule": "0 3 * * *",
                "start_at": "2099-01-01T00:00:00Z",
                "end_at": "2099-06-01T00:00:00Z",
            },
            job("capped", max_runs=1),
            job("buffered", overlap="buffer_one", max_late="10s"),
        ],
    )
    cfg = cli_config(tmp_path, config)
    http_app.delay["/jobs/buffered"] = 4.0
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        spec = tmp_path / "dyn.yaml"
        spec.write_text(json.dumps({"name": "dyn", "schedule": yearly, "id": "tenant-7/report"}))
        added = run_cli("job", "add", str(spec), "-c", cfg)
        assert added.returncode == 0, added.stderr
        queued = run_cli("at", "keep", "2h", "-c", cfg, "--reason", "<i>deploy</i>")
        assert queued.returncode == 0, queued.stderr
        # Written as anyone with write access to the bucket could: not run, said why.
        evil = {"name": "evil", "schedule": "<script>alert(1)</script>", "id": "<b>x</b>"}
        put_key(nats_server.url, "CRON_STATE", "job.evil", json.dumps(evil).encode())
        put_key(
            nats_server.url,
            "CRON_STATE",
            "job.keep",
            json.dumps({"name": "keep", "schedule": yearly}).encode(),
        )

        def index() -> str:
            return request(procs[1], "/")[2].decode()

        wait_for(lambda: 'id="job-dyn"' in index(), 10, what="the bucket job on the page")
        wait_for(lambda: "kept</span> slot" in row_of(index(), "buffered"), 20, what="a kept slot")
        wait_for(lambda: "ended</span>" in row_of(index(), "capped"), 20, what="capped ended")
        html = index()
        dyn = row_of(html, "dyn")
        assert '<span class="tag src"' in dyn and ">bucket</span>" in dyn, dyn
        assert "id tenant-7/report" in dyn, dyn
        assert 'class="tag src"' not in row_of(html, "keep")  # the file's job: no tag
        assert "Every 90m, counted from the Unix epoch + 15m" in row_of(html, "every")
        later = row_of(html, "later")
        assert "not started</span> no slot before <time" in later, later
        assert 'datetime="2099-01-01T00:00:00.000Z"' in later and "(start_at)" in later, later
        assert "until <time" in later and "(end_at)" in later, later
        capped = row_of(html, "capped")
        assert "runs no more: max_runs 1 reached (1 runs counted in count.capped)" in capped
        buffered = row_of(html, "buffered")
        assert "overlap: buffer_one" in buffered, buffered
        assert "runs after the running one (buffer_one)" in buffered, buffered
        keep = row_of(html, "keep")
        assert 'class="tag once"' in keep and "&lt;i&gt;deploy&lt;/i&gt;" in keep, keep
        assert "<i>deploy" not in html
        # The fleet: the bucket's job keys that do not run, and why, escaped.
        assert "Jobs in the state bucket that do not run" in html
        assert "<strong>evil</strong> (id &lt;b&gt;x&lt;/b&gt;): invalid:" in html, html
        assert "<strong>keep</strong>: shadowed:" in html
        assert "<script>alert" not in html and "<b>x</b>" not in html
        assert "jobs added at run time</dt><dd>1 run, 2 not run" in html
        # A job's own page says where it comes from.
        page_dyn = request(procs[0], "/jobs/dyn")[2].decode()
        assert "state bucket key <code>job.dyn</code>, id <code>tenant-7/report</code>" in page_dyn
        assert "From the config file." in request(procs[0], "/jobs/every")[2].decode()
        # The API has what the page shows.
        assert api(procs[0], "/api/v1/jobs/later")["not_started"] == (
            "no slot before start_at 2099-01-01T00:00:00Z"
        )
        assert api(procs[0], "/api/v1/jobs/every")["not_started"] is None


def test_the_fleet_section_names_a_calendar_that_differs() -> None:
    """``mismatched_calendars`` (sidecar/store/digests.py) is named on the page, escaped."""
    from sidecar.admin.page import fleet_section

    html = fleet_section(
        {
            "config_mismatch": True,
            "mismatched_jobs": ["report"],
            "mismatched_calendars": ["holidays", "<b>"],
        }
    )
    assert "different settings: report" in html
    assert "these calendars with different contents: holidays, &lt;b&gt;</p>" in html
    assert "calendars" not in fleet_section({"mismatched_calendars": []})
