"""Telling people: pings, notifications, auto-pause, anomalies and traces, with real
sidecar processes against a real nats-server, a real app, and real HTTP receivers
(tests/receivers.py) standing in for Healthchecks, a webhook and an OTLP collector.

Every count here is over the whole fleet: what the receivers got from all the
sidecars together.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.receivers import Receiver, receiver
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    job,
    results,
    run_cli,
    sidecars,
    slow_run,
    wait_for,
    write_config,
)

SECRET = "k3y-0f-the-check"


@pytest.fixture
def hooks() -> Iterator[Receiver]:
    yield from receiver()


def base(url: str, app: RecordingApp, jobs: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {
        "nats": {"servers": [url], "lease_ttl": "2s"},
        "target": {"url": app.url, "timeout": "20s"},
        "jobs": jobs,
        **top,
    }


def total(procs: list[Sidecar], name: str, labels: dict[str, str]) -> float:
    return sum(p.metric(name, labels) or 0 for p in procs if p.proc and p.proc.poll() is None)


def rid(token: str) -> str:
    return str(uuid.UUID(hex=token))


def events(hooks: Receiver, path: str = "/json") -> Counter[str]:
    return Counter(r.json()["event"] for r in hooks.received(path))


def logs(procs: list[Sidecar]) -> str:
    return "".join(p.log() for p in procs)


def test_each_run_is_pinged_once_by_its_runner_with_start_and_end_paired_by_rid(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, hooks: Receiver
) -> None:
    # A check that takes connections and never answers: its job's runs go on, on time.
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(100)
    hung_port = hung.getsockname()[1]
    hooks.status[f"/gone/{SECRET}"] = 404
    config = base(
        nats_server.url,
        http_app,
        [
            job("work"),
            job("dead", ping={"url": f"http://127.0.0.1:{hung_port}/{SECRET}", "start": True}),
            job("gone", ping={"url": f"{hooks.url}/gone/{SECRET}"}),
        ],
        defaults={"ping": {"url": f"{hooks.url}/ping/{{job}}/{SECRET}", "start": True}},
    )
    base_path = f"/ping/work/{SECRET}"
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: len(http_app.requests_for("/jobs/work")) >= 3, 20, what="runs")
        http_app.status["/jobs/work"] = 500
        failing_from = len(http_app.requests_for("/jobs/work"))
        wait_for(
            lambda: len(http_app.requests_for("/jobs/work")) >= failing_from + 3, 20, what="fails"
        )
        dead_runs = http_app.requests_for("/jobs/dead")
        for p in procs:
            assert p.terminate(40) == 0
    hung.close()
    tokens = {r.headers["X-Anarchon-Run-Id"] for r in http_app.requests_for("/jobs/work")}
    stored = {m.data["token"]: m.data for m in results(nats_server.url, "work")}
    pings = hooks.received(base_path)
    by_rid: dict[str, list[str]] = {}
    for p in pings:
        assert len(p.query["rid"]) == 1
        by_rid.setdefault(p.query["rid"][0], []).append(p.path)
    # Every run: exactly one /start and one end ping, from the runner, none for anything else.
    assert set(by_rid) == {rid(t) for t in tokens}
    for token in tokens:
        status = stored[token]["status"]
        end = base_path if status == "succeeded" else f"{base_path}/fail"
        assert sorted(by_rid[rid(token)]) == sorted([f"{base_path}/start", end]), token
        start = next(
            p for p in pings if p.path.endswith("/start") and p.query["rid"] == [rid(token)]
        )
        last = next(p for p in pings if p.path == end and p.query["rid"] == [rid(token)])
        assert start.at <= last.at
        assert last.headers["Content-Type"].startswith("text/plain")
        assert f"status: {status}\n" in last.text and "job: work\n" in last.text
        assert "trigger: scheduled\n" in last.text and f"run_id: {token}\n" in last.text
        assert last.text.endswith("\n\nok")  # the app's answer
        if status == "failed":
            assert "error: HTTP 500: ok\n" in last.text
    assert {s["status"] for s in stored.values()} == {"succeeded", "failed"}
    # The hung check delayed nothing: a run every second, each soon after its slot.
    assert len(dead_runs) >= 5
    assert all(r.at - int(r.headers["X-Anarchon-Slot"]) / 1000 < 1.0 for r in dead_runs)
    # A refused ping is said in the log, its URL's key in no log line.
    text = logs(procs)
    assert SECRET not in text
    assert f"ping to http://127.0.0.1:{hooks.port}/*** not delivered: HTTP 404" in text


def test_state_changes_are_notified_once_for_the_fleet_and_pause_after_pauses_everywhere(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, hooks: Receiver
) -> None:
    secret_file = tmp_path / "signing"
    secret_file.write_bytes(b"webhook-secret")
    http_app.status["/jobs/work"] = 500
    config = base(
        nats_server.url,
        http_app,
        [job("work", pause_after=3)],
        notify=[
            {"url": f"{hooks.url}/json/{SECRET}"},
            {
                "url": f"{hooks.url}/slack/{SECRET}",
                "format": "slack",
                "events": ["auto_paused", "recovered"],
            },
        ],
    )
    config["target"]["signing_secret_file"] = str(secret_file)
    cli = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: events(hooks)["auto_paused"], 30, what="auto_paused sent")

        def paused() -> dict[str, Any]:
            status = json.loads(run_cli("status", "-c", cli, "--json").stdout)
            found: dict[str, Any] = status["jobs"][0]
            return found if found["paused"] else {}

        job_status = wait_for(paused, 10, what="status shows the pause")
        wait_for(
            lambda: all(p.metric("anarchon_job_auto_paused", {"job": "work"}) == 1 for p in procs),
            10,
            what="every sidecar's auto-paused gauge",
        )
        counted = min(
            p.metric("anarchon_job_consecutive_failures", {"job": "work"}) or 0 for p in procs
        )
        # Claims published before the pause was stored still run; then nothing.
        time.sleep(2.5)
        ran = len(http_app.requests_for("/jobs/work"))
        time.sleep(2.5)
        assert len(http_app.requests_for("/jobs/work")) == ran
        http_app.status["/jobs/work"] = 200
        assert run_cli("resume", "work", "-c", cli).returncode == 0
        wait_for(lambda: events(hooks)["recovered"], 20, what="recovered sent")
        wait_for(
            lambda: all(
                p.metric("anarchon_job_consecutive_failures", {"job": "work"}) == 0 for p in procs
            ),
            10,
            what="the count back to 0",
        )
        time.sleep(3)  # a second copy of any event would come now
        sent = {
            e: total(procs, "anarchon_notifications_total", {"event": e, "outcome": "sent"})
            for e in ("failing", "auto_paused", "recovered")
        }
    assert job_status["paused_by"] == "auto"
    assert job_status["paused_reason"] == "auto: 3 consecutive failures"
    assert counted >= 3
    # Exactly once for the fleet, however many sidecars saw the runs.
    assert events(hooks) == Counter({"failing": 1, "auto_paused": 1, "recovered": 1})
    # Two targets get auto_paused and recovered; failing goes to the json one only.
    assert sent == {"failing": 1, "auto_paused": 2, "recovered": 2}
    slack = [r.json() for r in hooks.received("/slack")]
    assert len(slack) == 2 and all(set(s) == {"text"} for s in slack)
    assert any("paused on every sidecar after 3 consecutive" in s["text"] for s in slack)
    failing = next(r.json() for r in hooks.received("/json") if r.json()["event"] == "failing")
    assert failing["consecutive_failures"] == 1 and failing["status"] == "failed"
    assert failing["error"] == "HTTP 500: ok" and failing["trigger"] == "scheduled"
    assert set(failing) >= {
        "event", "job", "slot", "scheduled_at", "status", "error", "instance", "run_id",
        "attempt", "trigger", "duration_ms", "consecutive_failures",
    }  # fmt: skip
    for r in hooks.received("/"):
        t, v1 = (part.split("=", 1)[1] for part in r.headers["X-Anarchon-Signature"].split(","))
        mac = hmac.new(b"webhook-secret", f"{t}.".encode() + r.body, hashlib.sha256)
        assert hmac.compare_digest(v1, mac.hexdigest())
    assert SECRET not in logs(procs)


def test_a_runner_killed_mid_run_gives_one_fail_ping_and_one_lost_notification(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, hooks: Receiver
) -> None:
    path = "/jobs/solo"
    config = base(
        nats_server.url,
        http_app,
        [job("solo", overlap="skip", ping={"url": f"{hooks.url}/ping/{SECRET}", "start": True})],
        notify=[{"url": f"{hooks.url}/json/{SECRET}"}],
    )
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        wait_for(lambda: len(http_app.requests_for(path)) >= 2, 20, what="healthy runs")
        first, victim = slow_run(http_app, procs, path, 8.0)
        time.sleep(0.5)
        victim.kill()  # SIGKILL
        http_app.delay[path] = 0.0
        token = first.headers["X-Anarchon-Run-Id"]
        wait_for(lambda: events(hooks)["recovered"], 20, what="recovered after the lost run")
        time.sleep(3)  # a second /fail or lost would come now
        alive = [p for p in procs if p is not victim]
        lost_counted = total(alive, "anarchon_runs_lost_total", {"job": "solo"})
    fails = hooks.received(f"/ping/{SECRET}/fail")
    assert [f.query["rid"] for f in fails] == [[rid(token)]]
    assert "status: lost\n" in fails[0].text and "lease lock.solo expired" in fails[0].text
    starts = [s for s in hooks.received(f"/ping/{SECRET}/start") if s.query["rid"] == [rid(token)]]
    assert len(starts) == 1
    lost = [r.json() for r in hooks.received("/json") if r.json()["event"] == "lost"]
    assert len(lost) == 1 and lost[0]["run_id"] == token and lost[0]["instance"] == victim.name
    assert lost[0]["reported_by"] != victim.name
    assert events(hooks) == Counter({"failing": 1, "lost": 1, "recovered": 1})
    assert lost_counted == 1


def test_runs_outside_their_expected_duration_are_marked_counted_notified_and_overdue_shows(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, hooks: Receiver
) -> None:
    http_app.delay["/jobs/slow"] = 1.5
    config = base(
        nats_server.url,
        http_app,
        [
            job("quick", expect={"min": "1s"}),
            job("slow", overlap="skip", expect={"max": "500ms"}),
            job("fine", expect={"min": "1ms", "max": "10s"}),
        ],
        notify=[{"url": f"{hooks.url}/json", "events": ["anomaly"]}],
    )
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        wait_for(
            lambda: total(procs, "anarchon_runs_overdue", {"job": "slow"}) == 1,
            20,
            what="a slow run visible as overdue before it ends",
        )
        wait_for(
            lambda: sum(1 for r in http_app.requests_for("/jobs/slow") if r.finished) >= 2,
            20,
            what="slow runs ended",
        )
        wait_for(lambda: len(http_app.requests_for("/jobs/fine")) >= 3, 10, what="fine runs")
        for p in procs:
            assert p.terminate(40) == 0
    counts: dict[str, Counter[str | None]] = {}
    for name in ("quick", "slow", "fine"):
        ran = [m.data for m in results(nats_server.url, name) if m.data["status"] != "skipped"]
        counts[name] = Counter(r.get("anomaly") for r in ran)
    assert set(counts["quick"]) == {"short"}
    assert set(counts["slow"]) == {"long"} and counts["slow"]["long"] >= 2
    assert set(counts["fine"]) == {None}
    got = Counter((r.json()["job"], r.json()["anomaly"]) for r in hooks.received("/json"))
    assert got == Counter(
        {("quick", "short"): counts["quick"]["short"], ("slow", "long"): counts["slow"]["long"]}
    )
    cli = write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config})
    res = run_cli("history", "slow", "-c", str(cli), "--json")
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert any(r["anomaly"] == "long" for r in rows)


def test_every_trigger_carries_its_own_traceparent_and_the_span_is_exported_over_otlp(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, hooks: Receiver
) -> None:
    trace_pb2 = pytest.importorskip(
        "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
        reason="the otel extra is not installed",
    )
    config = base(
        nats_server.url,
        http_app,
        [job("work")],
        tracing={"otlp_endpoint": f"{hooks.url}/otlp", "service_name": "billing-cron"},
    )
    config["target"]["headers"] = {"tracestate": "vendor=kept"}
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(2)]) as procs:
        wait_for(lambda: len(http_app.requests_for("/jobs/work")) >= 3, 20, what="runs")
        for p in procs:
            assert p.terminate(40) == 0
    requests = http_app.requests_for("/jobs/work")
    parents = {}
    for r in requests:
        version, trace_id, span_id, flags = r.headers["traceparent"].split("-")
        assert (version, flags, len(trace_id), len(span_id)) == ("00", "01", 32, 16)
        assert r.headers["tracestate"] == "vendor=kept"
        parents[r.headers["X-Anarchon-Run-Id"]] = (trace_id, span_id)
    assert len({t for t, _ in parents.values()}) == len(requests)  # a new trace per run
    stored = {m.data["token"]: m.data for m in results(nats_server.url, "work")}
    for token, (trace_id, _) in parents.items():
        assert stored[token]["trace_id"] == trace_id
    cli = write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config})
    rows = [
        json.loads(x)
        for x in run_cli("history", "work", "-c", str(cli), "--json").stdout.split("\n")
        if x
    ]
    assert {r["token"]: r["trace_id"] for r in rows if r["token"] in parents} == {
        t: p[0] for t, p in parents.items()
    }
    spans = {}
    for got in hooks.received("/otlp/v1/traces"):
        assert got.headers["Content-Type"] == "application/x-protobuf"
        req = trace_pb2.ExportTraceServiceRequest.FromString(got.body)
        rs = req.resource_spans[0]
        service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
        assert service == "billing-cron"
        for span in rs.scope_spans[0].spans:
            attrs = {a.key: a.value for a in span.attributes}
            spans[(span.trace_id.hex(), span.span_id.hex())] = attrs
    # Each run's span, with the ids the app saw as its parent.
    assert set(spans) == set(parents.values())
    attrs = next(iter(spans.values()))
    assert attrs["faas.trigger"].string_value == "timer"
    assert attrs["faas.cron"].string_value == "* * * * * *"
    assert attrs["faas.time"].string_value.endswith("Z")
    assert attrs["anarchon.job"].string_value == "work"
    assert attrs["anarchon.outcome"].string_value == "succeeded"
    assert attrs["anarchon.attempt"].int_value == 1


def test_run_now_pings_and_counts_like_a_scheduled_run(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, hooks: Receiver
) -> None:
    http_app.status["/jobs/work"] = 500
    config = base(
        nats_server.url,
        http_app,
        [job("work", schedule="0 0 1 1 *", ping={"url": f"{hooks.url}/ping", "start": True})],
        notify=[{"url": f"{hooks.url}/json"}],
    )
    cli = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))
    res = run_cli("run-now", "work", "-c", cli)
    assert res.returncode == 1, res.stderr
    (request,) = http_app.requests_for("/jobs/work")
    token = request.headers["X-Anarchon-Run-Id"]
    # Sent before run-now exited: its drain waits for them.
    assert sorted(r.path for r in hooks.received("/ping")) == ["/ping/fail", "/ping/start"]
    fail = hooks.received("/ping/fail")[0]
    assert fail.query["rid"] == [rid(token)] and "trigger: manual\n" in fail.text
    (failing,) = [r.json() for r in hooks.received("/json")]
    assert (failing["event"], failing["trigger"], failing["run_id"]) == ("failing", "manual", token)
