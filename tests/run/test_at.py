"""One-off runs at a set time (``anarchon-sidecar at``), with three real sidecars.

Exactly one app call at about the instant, whichever sidecars are alive
then; cancel works from the CLI and the API; a sidecar killed at the instant
still gives exactly one run; hostile ``at.*`` keys are counted and never run;
the instant is checked before anything is written.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from sidecar.core.clock import rfc3339
from sidecar.when.atkey import MAX_AHEAD, at_msg_id, instant_problem, parse_value, pending_of
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    base,
    cli_config,
    job,
    read_stream,
    run_cli,
    sidecars,
    wait_for,
)

TOKEN = "s3cret-token-for-the-page-0123"
# A schedule that never fires during a test: only one-off runs reach the app.
YEARLY = "0 0 1 1 *"


def one_off(name: str = "a", **extra: Any) -> dict[str, Any]:
    return job(name, schedule=YEARLY, **extra)


def at(*args: str) -> dict[str, Any]:
    done = run_cli("at", *args, "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def job_status(cfg: str, name: str) -> dict[str, Any]:
    done = run_cli("status", "-c", cfg, "--json")
    assert done.returncode == 0, done.stderr
    return next(j for j in json.loads(done.stdout)["jobs"] if j["name"] == name)


def history_of(cfg: str, name: str) -> list[str]:
    done = run_cli("history", name, "-c", cfg, "--json")
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.strip()]


def at_calls(app: RecordingApp, path: str = "/jobs/a") -> list[Any]:
    return [r for r in app.requests_for(path) if r.headers.get("X-Anarchon-Trigger") == "at"]


def total(procs: list[Sidecar], name: str, labels: dict[str, str]) -> float:
    return sum(p.metric(name, labels) or 0 for p in procs if p.proc and p.proc.poll() is None)


def with_nats(url: str, work: Callable[[Any], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        nc = await nats.connect(url)
        try:
            return await work(nc)
        finally:
            await nc.close()

    return asyncio.run(go())


def api_post(sc: Sidecar, path: str, body: dict[str, str], token: str | None = TOKEN) -> Any:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(sc.base_url + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def form_post(
    sc: Sidecar, path: str, fields: dict[str, str], cookie: str = ""
) -> tuple[int, dict[str, str], bytes]:
    """A browser's form POST (no redirect followed)."""
    import http.client
    from urllib.parse import urlencode

    conn = http.client.HTTPConnection("127.0.0.1", sc.metrics_port, timeout=10)
    try:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if cookie:
            headers["Cookie"] = cookie
        conn.request("POST", path, urlencode(fields), headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def page_of(sc: Sidecar, path: str, cookie: str = "") -> str:
    import urllib.request

    req = urllib.request.Request(sc.base_url + path)
    if cookie:
        req.add_header("Cookie", cookie)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return str(resp.read().decode())


def csrf_in(html: str, action: str) -> str:
    import re

    found = re.search(
        f'action="{action}"[^>]*><input type="hidden" name="csrf" value="([^"]+)"', html
    )
    assert found, html[:3000]
    return found[1]


# ---------------------------------------------------------------- pure


def test_entries_that_the_cli_would_not_write_are_hostile() -> None:
    now = 1_800_000_000.0
    good = {"slot": 1_800_000_060_000, "by": "alice@ops", "queued_at": "x", "reason": "hotfix"}
    value = {
        "runs": [
            good,
            good,  # the same instant twice is one run
            {"slot": "1800000060000", "by": "b", "queued_at": "x"},
            {"slot": 10**20, "by": "b", "queued_at": "x"},
            {"slot": int((now + MAX_AHEAD + 2 * 86400) * 1000), "by": "b", "queued_at": "x"},
            {"slot": 1_800_000_070_000, "by": 5, "queued_at": "x"},
            {"slot": 1_800_000_080_000, "by": "b" * 1000, "queued_at": "x"},
            "not an object",
        ]
    }
    parsed = parse_value(value, now)
    assert list(parsed.runs) == [1_800_000_060_000]
    assert len(parsed.hostile) == 6
    assert parse_value([1, 2], now).hostile and parse_value({"runs": {}}, now).hostile
    assert [r.as_dict()["at"] for r in pending_of(value, now)] == ["2027-01-15T08:01:00.000Z"]
    assert at_msg_id("a", 1_800_000_060_000) == "a:1800000060000:at"


def test_an_entry_on_an_instant_of_the_schedule_is_hostile() -> None:
    from zoneinfo import ZoneInfo

    from sidecar.when.atkey import instants_of
    from sidecar.when.slots import parse_calendar

    now = 1_800_000_000.0
    hourly = instants_of(parse_calendar("0 * * * *", ZoneInfo("UTC")))
    on, off = 1_800_003_600_000, 1_800_003_601_000  # on the hour; a second later
    value = {"runs": [{"slot": s, "by": "b", "queued_at": "x"} for s in (on, off)]}
    parsed = parse_value(value, now, hourly)
    assert list(parsed.runs) == [off]
    assert parsed.hostile == [f"slot {on} is an instant of the job's schedule"]
    assert list(parse_value(value, now).runs) == [on, off]  # without a schedule: both


@pytest.mark.parametrize(
    ("offset", "on_schedule", "fragment"),
    [
        (-1.0, False, "not in the future"),
        (0.0, False, "not in the future"),
        (MAX_AHEAD + 1, False, "more than 366 days ahead"),
        (60.0, True, "an instant of the job's schedule"),
        (60.0, False, None),
    ],
)
def test_the_instant_is_checked(offset: float, on_schedule: bool, fragment: str | None) -> None:
    now = 1_800_000_000.0
    why = instant_problem(round((now + offset) * 1000), now, on_schedule)
    assert (why is None) if fragment is None else (fragment in str(why))


def test_usage_errors_exit_2_before_connecting(tmp_path: Path) -> None:
    config = {
        "nats": {"servers": "nats://127.0.0.1:1"},  # nothing listens: never reached
        "jobs": [{"name": "a", "schedule": "0 * * * *"}],
    }
    cfg = cli_config(tmp_path, config)
    hour = (int(time.time()) // 3600 + 2) * 3600
    for args, fragment in [
        (["a", "-c", cfg, "2001-01-01T00:00:00Z"], "is not in the future"),
        (["a", "-c", cfg, "0s"], "is not in the future"),
        (["a", "-c", cfg, "9000h"], "more than 366 days ahead"),
        (["a", "-c", cfg, "tomorrow"], "neither an RFC 3339 time"),
        (["a", "-c", cfg, rfc3339(hour)], "an instant of the job's schedule"),
        (["a", "-c", cfg], "at needs one of"),
        (["a", "-c", cfg, "5m", "--list"], "at needs one of"),
        (["nope", "-c", cfg, "5m"], "no job named 'nope'"),
    ]:
        done = run_cli("at", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert fragment in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr


# ---------------------------------------------------------------- with a fleet


def test_one_off_runs_once_at_its_instant_and_cancel_works(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"alice:{TOKEN}\n")
    config = base(nats_server, http_app, [one_off("a")])
    config["admin"] = {"token_file": str(token_file)}
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        queued = at("a", "-c", cfg, "15s", "--reason", "hotfix")
        assert queued["new"] is True
        slot = queued["queued"]["slot"]
        # The same instant again is kept, not queued twice.
        again = at("a", "-c", cfg, queued["queued"]["at"])
        assert again["new"] is False and again["queued"]["slot"] == slot
        # Two more: one cancelled from the CLI, one from the API.
        cut_cli = at("a", "-c", cfg, "16s")["queued"]["slot"]
        code, answer = api_post(procs[1], "/api/v1/jobs/a/at", {"time": "17s", "reason": "x"})
        assert code == 200, answer
        cut_api = answer["queued"]["slot"]
        assert answer["by"] == "alice"
        # Pending, as status and --list show them.
        pending = job_status(cfg, "a")["at_pending"]
        assert [p["slot"] for p in pending] == [slot, cut_cli, cut_api]
        assert pending[0]["reason"] == "hotfix"
        text = run_cli("status", "-c", cfg).stdout
        assert f"a: one-off run at {rfc3339(slot / 1000)}" in text
        gauge = "anarchon_job_at_pending"
        wait_for(lambda: all(p.metric(gauge, {"job": "a"}) == 3 for p in procs), 5)
        listed = at("a", "-c", cfg, "--list")["pending"]
        said = run_cli("at", "a", "-c", cfg, "--list").stdout.splitlines()
        assert said[0].startswith(f"a: pending one-off run at {rfc3339(slot / 1000)} (")
        assert said[0].endswith(": hotfix") and len(said) == 3
        kept = run_cli("at", "a", "-c", cfg, rfc3339(slot / 1000))
        assert kept.returncode == 0 and "was queued already by" in kept.stdout, kept
        assert [p["slot"] for p in listed] == [slot, cut_cli, cut_api]
        cancelled = at("a", "-c", cfg, "--cancel", rfc3339(cut_cli / 1000))["cancelled"]
        assert [c["slot"] for c in cancelled] == [cut_cli]
        code, answer = api_post(procs[2], "/api/v1/jobs/a/cancel-at", {"time": str(cut_api)})
        assert code == 200 and [c["slot"] for c in answer["cancelled"]] == [cut_api], answer
        # Without the token, or as a form without a session and CSRF token: refused.
        assert api_post(procs[0], "/api/v1/jobs/a/at", {"time": "1h"}, token=None)[0] == 401
        assert api_post(procs[0], "/api/v1/jobs/a/at", {"time": "1h"}, "wrong-token")[0] == 401
        assert api_post(procs[0], "/jobs/a/at", {"time": "1h"}, token=None)[0] == 401
        past = api_post(procs[0], "/api/v1/jobs/a/at", {"time": "2001-01-01T00:00:00Z"})
        assert past[0] == 400 and "not in the future" in past[1]["error"]
        # Nothing left to cancel: exit 1.
        gone = run_cli("at", "a", "-c", cfg, "--cancel", rfc3339(cut_cli / 1000))
        assert gone.returncode == 1 and "no one-off run pending" in gone.stderr

        wait_for(lambda: at_calls(http_app), 30, what="the one-off run")
        # Past every cancelled instant plus jitter and max_late: nothing else ran.
        wait_for(lambda: time.time() > cut_api / 1000 + 4.5, 30, what="the windows passed")
        wait_for(lambda: not job_status(cfg, "a")["at_pending"], 10, what="none pending")
        wait_for(lambda: all(p.metric(gauge, {"job": "a"}) == 0 for p in procs), 5)
        # One won; the others lost the claim, or found the entry gone (dropped by the
        # winner) when their jitter ended.
        won = sum(p.metric("anarchon_claims_won_total", {"job": "a"}) or 0 for p in procs)
        assert won == 1
        history = run_cli("history", "a", "-c", cfg, "--json")
        table = run_cli("history", "a", "-c", cfg)
        status, body = procs[0].get("/api/v1/jobs/a")
        actions = json.loads(body)["actions"]
    calls = at_calls(http_app)
    assert len(calls) == 1, [c.headers for c in calls]
    assert len(http_app.requests_for("/jobs/a")) == 1
    call = calls[0]
    assert int(call.headers["X-Anarchon-Slot"]) == slot
    late = call.at - slot / 1000
    print(f"one-off run started {late * 1000:.0f} ms after its instant")
    assert 0 <= late < 0.2 + 1.0, late  # jitter 200ms, plus the claim and a busy machine
    ids = [m.headers.get("Nats-Msg-Id") for m in read_stream(nats_server.url)]
    assert ids.count(f"a:{slot}:at") == 1
    assert f"a:{cut_cli}:at" not in ids and f"a:{cut_api}:at" not in ids
    runs = [json.loads(line) for line in history.stdout.splitlines()]
    assert [(r["slot"], r["trigger"], r["status"]) for r in runs] == [(slot, "at", "succeeded")]
    assert "(at)" in table.stdout
    assert status == 200
    kinds = sorted((a["action"], a["via"]) for a in actions)
    assert kinds == [("at", "api"), ("at", "cli"), ("at", "cli"), ("cancel-at", "api"),
                     ("cancel-at", "cli")]  # fmt: skip


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_sidecar_killed_at_the_instant_still_gives_exactly_one_run(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    # on_lost: rerun, lease_ttl 2s: the killed runner's run is recorded lost, not rerun.
    lost = {"on_lost": "rerun", "retry": {"max": 1, "backoff": "1s"}}
    config = base(nats_server, http_app, [one_off("a", max_late="5s", **lost)])
    config["nats"]["lease_ttl"] = "2s"
    cfg = cli_config(tmp_path, config)
    # s0 stops itself at the instant (before it reads the key again and claims): killed then.
    frozen = {"ANARCHON_FAILPOINTS": "at.due=1*sigstop"}
    fleet = [("s0", config, frozen), ("s1", config, {}), ("s2", config, {})]
    with sidecars(tmp_path, fleet) as procs:
        slot = at("a", "-c", cfg, "3s")["queued"]["slot"]
        s0 = procs[0]
        assert s0.proc is not None
        wait_for(lambda: stopped(s0.proc.pid), 15, what="s0 stopped at the instant")
        os.kill(s0.proc.pid, signal.SIGKILL)
        s0.proc.wait(10)
        wait_for(lambda: at_calls(http_app), 15, what="the run by a survivor")
        # Then its runner is killed in the middle of the next one: nobody runs it again.
        http_app.delay["/jobs/a"] = 3.0
        second = at("a", "-c", cfg, "2s")["queued"]["slot"]
        first = wait_for(
            lambda: next(
                (r for r in at_calls(http_app) if int(r.headers["X-Anarchon-Slot"]) == second),
                None,
            ),
            15,
            what="the second one-off started",
        )
        runner = next(p for p in procs if p.name == first.headers["X-Anarchon-Instance"])
        runner.kill()
        wait_for(lambda: time.time() > second / 1000 + 5 + 1.5, 20, what="its window passed")
        wait_for(lambda: not job_status(cfg, "a")["at_pending"], 10, what="none pending")
        wait_for(
            lambda: any(
                json.loads(line)["status"] == "lost" and json.loads(line)["slot"] == second
                for line in history_of(cfg, "a")
            ),
            15,
            what="the killed run recorded lost",
        )
        wait_for(lambda: time.time() > second / 1000 + 5 + 3, 10, what="a rerun's window")
        survivors = [p for p in procs if p.proc and p.proc.poll() is None]
        hostile = sum(
            p.metric("anarchon_hostile_input_total", {"what": "due_key"}) or 0 for p in survivors
        )
        due = sum(
            p.metric("anarchon_attempts_due_total", {"job": "a", "reason": "lost"}) or 0
            for p in survivors
        )
    by_slot = [int(r.headers["X-Anarchon-Slot"]) for r in at_calls(http_app)]
    assert sorted(by_slot) == [slot, second]
    assert len(http_app.requests_for("/jobs/a")) == 2  # no rerun either
    assert hostile == 0 and due == 0
    assert at_calls(http_app)[0].headers["X-Anarchon-Instance"] in ("s1", "s2")


def test_hostile_at_keys_are_counted_and_never_run_and_the_page_form_queues_one(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"alice:{TOKEN}\n")
    config = base(nats_server, http_app, [one_off("a"), one_off("b")])
    config["admin"] = {"token_file": str(token_file)}
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        # The page's form, signed in, with the session's CSRF token (and refused without).
        login = csrf_in(page_of(procs[0], "/jobs/b"), "/login")
        code, headers, _ = form_post(procs[0], "/login", {"token": TOKEN, "csrf": login})
        assert code == 303
        cookie = headers["Set-Cookie"].split(";")[0]
        csrf = csrf_in(page_of(procs[0], "/jobs/b", cookie), "/jobs/b/at")
        assert form_post(procs[0], "/jobs/b/at", {"time": "3s"}, cookie)[0] == 403
        code, headers, _ = form_post(procs[0], "/jobs/b/at", {"time": "3s", "csrf": csrf}, cookie)
        assert code == 303 and "error" not in headers["Location"]
        wait_for(  # listed with its cancel button once the watch delivered it
            lambda: "/jobs/b/cancel-at" in page_of(procs[0], "/jobs/b", cookie),
            5,
            what="the pending one-off on the page",
        )
        assert "One-off runs" in page_of(procs[1], "/jobs/b")
        soon = round((time.time() + 3) * 1000)
        far = round((time.time() + 10 * 365 * 86400) * 1000)
        good = {"slot": soon, "by": "x", "queued_at": "y"}
        value = {
            "runs": [good, {"slot": soon + 1, "by": 7}, {"slot": far, "by": "x", "queued_at": "y"}]
        }

        async def forge(nc: Any) -> None:
            kv = await nc.jetstream().key_value("CRON_STATE")
            await kv.put("at.a", json.dumps(value).encode())
            await kv.put("at.a.1", json.dumps(value).encode())

        with_nats(nats_server.url, forge)
        hostile = {"what": "at_key"}
        wait_for(
            # Two hostile entries in at.a, one key at.a.1: counted by each sidecar that
            # saw them before the first one to see them cleaned them up.
            lambda: any(
                (p.metric("anarchon_hostile_input_total", hostile) or 0) >= 3 for p in procs
            ),
            10,
            what="the hostile entries counted",
        )
        wait_for(lambda: at_calls(http_app), 15, what="the good entry ran")
        wait_for(lambda: time.time() > soon / 1000 + 4, 10, what="its window passed")
        wait_for(lambda: not job_status(cfg, "a")["at_pending"], 10, what="the key cleaned")
        wait_for(lambda: at_calls(http_app, "/jobs/b"), 10, what="the page's one-off ran")
        logs = "".join(p.log() for p in procs)
    assert [int(r.headers["X-Anarchon-Slot"]) for r in at_calls(http_app)] == [soon]
    assert len(at_calls(http_app, "/jobs/b")) == 1
    assert "state bucket: at.a.1 refused" in logs and "hostile input" in logs


def test_a_raw_at_entry_on_an_instant_of_the_schedule_is_hostile_and_the_slot_runs_once(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Issue 48: the daemon refuses what the CLI refuses, an instant of the schedule."""
    config = base(nats_server, http_app, [job("e", schedule="*/2 * * * * *")])
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: http_app.requests_for("/jobs/e"), 20, what="a first scheduled run")
        now = time.time()
        on = (int(now) // 2 + 3) * 2 * 1000  # an even second 4-6 s ahead: on the schedule
        off = on + 1000  # an odd second: not on it, a real one-off
        value = {"runs": [{"slot": s, "by": "x", "queued_at": "y"} for s in (on, off)]}

        async def forge(nc: Any) -> None:
            kv = await nc.jetstream().key_value("CRON_STATE")
            await kv.put("at.e", json.dumps(value).encode())

        with_nats(nats_server.url, forge)
        hostile = {"what": "at_key"}
        wait_for(
            lambda: any((p.metric("anarchon_hostile_input_total", hostile) or 0) for p in procs),
            10,
            what="the entry on the schedule counted",
        )
        wait_for(lambda: at_calls(http_app, "/jobs/e"), 15, what="the one-off off the schedule")
        wait_for(  # what a second run of the slot would have been sent by now
            lambda: time.time() > off / 1000 + 3 + 1, 10, what="both windows passed"
        )
        logs = "".join(p.log() for p in procs)
    calls = [r for r in http_app.requests_for("/jobs/e") if int(r.headers["X-Anarchon-Slot"]) == on]
    assert [r.headers["X-Anarchon-Trigger"] for r in calls] == ["scheduled"]
    assert [int(r.headers["X-Anarchon-Slot"]) for r in at_calls(http_app, "/jobs/e")] == [off]
    assert "is an instant of the job's schedule" in logs


def test_a_one_off_is_never_run_late_nor_while_its_job_is_paused(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    retried = one_off("f", retry={"max": 2, "backoff": "1s"})
    config = base(nats_server, http_app, [one_off("a"), one_off("p"), retried])
    cfg = cli_config(tmp_path, config)
    http_app.status["/jobs/f"] = 500
    # No sidecar runs at the instant: the first one up after max_late drops it, late.
    slot = at("a", "-c", cfg, "1s")["queued"]["slot"]
    wait_for(lambda: time.time() > slot / 1000 + 3 + 0.5, 10, what="past max_late")
    with sidecars(tmp_path, [("s0", config, {})]) as procs:
        wait_for(lambda: not job_status(cfg, "a")["at_pending"], 10, what="the late one dropped")
        late = {"job": "a", "reason": "late"}
        wait_for(lambda: procs[0].metric("anarchon_claims_skipped_total", late) == 1, 5)
        assert run_cli("pause", "p", "-c", cfg).returncode == 0
        wait_for(lambda: procs[0].metric("anarchon_job_paused", {"job": "p"}) == 1, 5)
        paused_at = at("p", "-c", cfg, "1s")["queued"]["slot"]
        paused = {"job": "p", "reason": "paused"}
        wait_for(lambda: procs[0].metric("anarchon_claims_skipped_total", paused) == 1, 10)
        assert not job_status(cfg, "p")["at_pending"]
        assert time.time() > paused_at / 1000
        # A failed one-off is not retried (as run-now): no due key, no second call.
        failed = at("f", "-c", cfg, "1s")["queued"]["slot"]
        wait_for(lambda: http_app.requests_for("/jobs/f"), 10, what="the failing one-off")
        wait_for(lambda: time.time() > failed / 1000 + 1 + 3 + 1, 10, what="a retry's window")
        log = procs[0].log()
        due = procs[0].metric("anarchon_attempts_due_total", {"job": "f", "reason": "retry"})
        hostile = procs[0].metric("anarchon_hostile_input_total", {"what": "due_key"})
    assert len(http_app.requests_for("/jobs/f")) == 1
    assert not due and not hostile
    assert [r["status"] for r in json.loads(f"[{','.join(history_of(cfg, 'f'))}]")] == ["failed"]
    assert [r.path for r in http_app.requests] == ["/jobs/f"]
    assert "one-off run at" in log and "skipped: paused by" in log


def test_catch_up_does_not_take_a_one_off_claim_for_the_schedule_s() -> None:
    from sidecar.store.runs import last_scheduled_slot

    def claim(slot: int, **extra: Any) -> tuple[int, str, bytes]:
        body = {"job": "a", "slot": slot, "token": "t", "instance": "s0", "manual": False}
        return (1, "cron.a.claims", json.dumps({**body, **extra}).encode())

    # Newest first, as last_messages gives them.
    assert last_scheduled_slot([claim(2000)], "cron.", "a") == 2000
    assert last_scheduled_slot([claim(2500, trigger="at"), claim(2000)], "cron.", "a") is None
