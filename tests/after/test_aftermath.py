"""The pieces of telling people: the health rule, anomalies, the config, masking,
bounded background sends, and the compare-and-set count against a real nats-server.
The whole behaviour, with sidecar processes, is in tests/after/test_alerts.py."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from sidecar.after.health import apply, claim_event, reset, transition
from sidecar.after.notices import anomaly_of, event_payload, ping_body, trigger_kind
from sidecar.config.alerting import EVENTS, mask_url
from sidecar.config.load import parse_config
from sidecar.core.errors import ConfigError
from sidecar.core.wire import ResultRecord, span_id_of, trace_id_of, traceparent
from sidecar.obs import outbound
from sidecar.obs.outbound import Outbox
from sidecar.obs.tracing import run_uuid
from sidecar.store.bucketcheck import StateSpec
from sidecar.store.kv import Keys
from sidecar.store.state import ensure_bucket
from tests.receivers import Receiver, receiver
from tests.support import (
    NatsServer,
    RecordingApp,
    base,
    job,
    run_cli,
    sidecars,
    slots,
    wait_for,
    write_config,
)

SECRET = "abc123-key"


@pytest.fixture
def hooks() -> Iterator[Receiver]:
    yield from receiver()


def config(**top: Any) -> Any:
    jobs = top.pop("jobs", [{"name": "sync", "schedule": "* * * * *"}])
    return parse_config({"jobs": jobs, **top}, {})


def error_of(**top: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config(**top)
    return info.value


# ---------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("prev", "status", "pause_after", "failures", "state", "events"),
    [
        (None, "failed", None, 1, "failing", ("failing",)),  # after start
        (None, "succeeded", None, 0, "ok", ()),
        ({"failures": 0, "state": "ok"}, "failed", None, 1, "failing", ("failing",)),
        ({"failures": 1, "state": "failing"}, "failed", None, 2, "failing", ()),
        ({"failures": 1, "state": "failing"}, "lost", None, 2, "failing", ("lost",)),
        ({"failures": 0, "state": "ok"}, "lost", None, 1, "failing", ("failing", "lost")),
        ({"failures": 2, "state": "failing"}, "failed", 3, 3, "failing", ("auto_paused",)),
        # Asked again: the pause key's create makes it once (tests/after/test_alerts.py).
        ({"failures": 3, "state": "failing"}, "failed", 3, 4, "failing", ("auto_paused",)),
        (None, "failed", 1, 1, "failing", ("failing", "auto_paused")),
        ({"failures": 4, "state": "failing"}, "succeeded", 3, 0, "ok", ("recovered",)),
        ({"failures": 0, "state": "ok"}, "succeeded", None, 0, "ok", ()),
        # After resume: the count is 0, the state kept.
        ({"failures": 0, "state": "failing"}, "succeeded", None, 0, "ok", ("recovered",)),
        ({"failures": 0, "state": "failing"}, "failed", 2, 1, "failing", ()),
        ({"failures": "x", "state": "ok"}, "failed", None, 1, "failing", ("failing",)),
        ({"failures": 2, "state": "failing"}, "skipped", 3, 2, "failing", ()),
    ],
)
def test_transition(
    prev: dict[str, Any] | None,
    status: str,
    pause_after: int | None,
    failures: int,
    state: str,
    events: tuple[str, ...],
) -> None:
    value, made = transition(prev, status, "run", pause_after)
    assert (value["failures"], value["state"], made) == (failures, state, events)
    assert value["run"] == "run" and value["events"] == list(events)


def test_anomaly_of() -> None:
    job = config(
        jobs=[{"name": "a", "schedule": "* * * * *", "expect": {"min": "2s", "max": "1m"}}]
    ).jobs[0]
    assert anomaly_of(job, "succeeded", 1999) == "short"
    assert anomaly_of(job, "failed", 10) is None  # a quick failure is a failure, not short
    assert anomaly_of(job, "succeeded", 2000) is None
    assert anomaly_of(job, "succeeded", 60_001) == "long"
    assert anomaly_of(job, "failed", 60_001) == "long"
    assert anomaly_of(job, "lost", 600_000) is None
    plain = config().jobs[0]
    assert anomaly_of(plain, "succeeded", 0) is None


def test_the_sender_is_made_with_the_hook_when_the_config_pings_or_notifies() -> None:
    """Made at start, not by the first run's /start ping (its import would delay
    that run's trigger); never made for a config without pings or notifications."""
    from sidecar.after.aftermath import Aftermath
    from sidecar.core.clock import Clock

    def outbox_of(**top: Any) -> Outbox | None:
        after = Aftermath(config(**top), None, Clock(), lambda: None)
        made: Outbox | None = after._outbox
        return made

    assert outbox_of() is None
    pinged = [{"name": "a", "schedule": "* * * * *", "ping": {"url": "https://hc.example/a"}}]
    assert isinstance(outbox_of(jobs=pinged), Outbox)
    assert isinstance(outbox_of(notify=[{"url": "http://127.0.0.1:9/hook"}]), Outbox)


# ---------------------------------------------------------------------- config


def test_config_reads_every_key_and_fills_the_job_into_default_ping_urls() -> None:
    cfg = config(
        jobs=[
            {"name": "a", "schedule": "* * * * *", "pause_after": 3, "expect": {"max": "5m"}},
            {"name": "b", "schedule": "* * * * *", "ping": {"url": "https://hc.example/own"}},
        ],
        defaults={"ping": {"url": "https://hc.example/ping/KEY/{job}", "start": True}},
        notify=[
            {"url": "https://hooks.example/T0/B0/X", "format": "slack", "events": ["failing"]},
            {"url": "http://127.0.0.1:9/hook"},
        ],
        tracing={"otlp_endpoint": "http://127.0.0.1:4318"},
    )
    a, b = cfg.jobs
    assert a.ping is not None and a.ping.url == "https://hc.example/ping/KEY/a" and a.ping.start
    assert b.ping is not None and b.ping.url == "https://hc.example/own" and not b.ping.start
    assert a.pause_after == 3 and b.pause_after is None
    assert a.expect is not None and (a.expect.min, a.expect.max) == (None, 300.0)
    assert cfg.notify[0].format == "slack" and cfg.notify[0].events == ("failing",)
    assert cfg.notify[1].events == EVENTS and cfg.notify[1].format == "json"
    assert cfg.tracing.otlp_endpoint == "http://127.0.0.1:4318"
    # No URL's key in a repr.
    assert "KEY" not in repr(cfg.jobs) and "B0" not in repr(cfg.notify)


@pytest.mark.parametrize(
    ("top", "key", "text"),
    [
        ({"notify": {"url": "x"}}, "notify", "expected a list"),
        ({"notify": [{"events": ["failing"]}]}, "notify[0].url", "required"),
        ({"notify": [{"url": f"ftp://h/{SECRET}"}]}, "notify[0].url", "ftp://h/***"),
        ({"notify": [{"url": "http://h/", "events": ["boom"]}]}, "notify[0].events[0]", "boom"),
        ({"notify": [{"url": "http://h/", "events": []}]}, "notify[0].events", "a list of"),
        ({"notify": [{"url": "http://h/", "format": "xml"}]}, "notify[0].format", "json, slack"),
        ({"defaults": {"ping": {"start": True}}}, "defaults.ping.url", "required"),
        ({"defaults": {"other": 1}}, "defaults.other", "unknown key"),
        ({"tracing": {"otlp_endpoint": "grpc://h:4317"}}, "tracing.otlp_endpoint", "http"),
    ],
)
def test_config_errors_name_the_key_and_never_show_a_url_key(
    top: dict[str, Any], key: str, text: str
) -> None:
    err = error_of(**top)
    assert err.key == key and text in err.message
    assert SECRET not in str(err)


@pytest.mark.parametrize(
    ("extra", "key", "text"),
    [
        ({"pause_after": 0}, "jobs[0].pause_after", "between 1 and 1000"),
        ({"pause_after": True}, "jobs[0].pause_after", "whole number"),
        ({"expect": {}}, "jobs[0].expect", "set min, max or both"),
        ({"expect": {"min": "5m", "max": "1m"}}, "jobs[0].expect.max", "longer than min"),
        ({"expect": {"max": "1h", "avg": "2m"}}, "jobs[0].expect.avg", "unknown key"),
        ({"ping": {"url": f"http://h/{SECRET}", "start": "yes"}}, "jobs[0].ping.start", "true"),
        ({"ping": {"url": f"nats://h/{SECRET}"}}, "jobs[0].ping.url", "nats://h/***"),
    ],
)
def test_job_config_errors(extra: dict[str, Any], key: str, text: str) -> None:
    err = error_of(jobs=[{"name": "a", "schedule": "* * * * *", **extra}])
    assert err.key == key and text in err.message, err
    assert SECRET not in str(err)


def test_mask_url_keeps_scheme_and_host_only() -> None:
    assert mask_url("https://hc-ping.com/0b1c2d3e") == "https://hc-ping.com/***"
    assert mask_url("http://user:pw@127.0.0.1:8080/x?k=1") == "http://127.0.0.1:8080/***"
    assert mask_url("http://[::1]:9/p") == "http://[::1]:9/***"
    assert mask_url("http://[bad/x") == "<a URL>/***"


# ---------------------------------------------------------------------- bodies


def record(**extra: Any) -> ResultRecord:
    fields: dict[str, Any] = {
        "job": "sync",
        "slot": 1_764_842_400_000,
        "token": "0f" * 16,
        "instance": "web-1",
        "status": "failed",
        "started_at": "2025-12-04T10:00:00.100Z",
        "finished_at": "2025-12-04T10:00:01.300Z",
        "duration_ms": 1200,
        "http_status": 500,
        "error": "HTTP 500: boom",
        **extra,
    }
    return ResultRecord(**fields)


def test_ping_body_is_a_short_summary_with_at_most_10_kib_of_the_answer() -> None:
    body = ping_body(record(), "scheduled", b"x" * 20_000).decode()
    head, _, answer = body.partition("\n\n")
    assert head.splitlines() == [
        "status: failed",
        "job: sync",
        "slot: 2025-12-04T10:00:00.000Z (1764842400000)",
        "attempt: 1",
        "trigger: scheduled",
        "duration_ms: 1200",
        "instance: web-1",
        f"run_id: {'0f' * 16}",
        f"trace_id: {trace_id_of('0f' * 16)}",
        "http_status: 500",
        "error: HTTP 500: boom",
    ]
    assert answer == "x" * 10 * 1024


def test_event_payload_and_trigger_kind() -> None:
    cfg = config(jobs=[{"name": "sync", "schedule": "* * * * *", "pause_after": 2}])
    payload = event_payload(
        "auto_paused", cfg.jobs[0], record(attempt=2), "retry", {"failures": 2}, "web-2"
    )
    assert payload["consecutive_failures"] == 2 and payload["attempt"] == 2
    assert payload["reported_by"] == "web-2" and payload["instance"] == "web-1"
    assert "resume sync" in payload["message"]
    assert trigger_kind(True, 1) == "manual"
    assert trigger_kind(False, 2) == "retry"
    assert trigger_kind(False, 1) == "scheduled"
    assert trigger_kind(False, 1, "rerun") == "rerun"


def test_trace_ids_are_derived_from_the_run_and_differ_per_run() -> None:
    a, b = "0f" * 16, "1e" * 16
    assert traceparent(a) == f"00-{trace_id_of(a)}-{span_id_of(a)}-01"
    assert trace_id_of(a) != trace_id_of(b) and len(trace_id_of(a)) == 32
    assert run_uuid(a) == "0f0f0f0f-0f0f-0f0f-0f0f-0f0f0f0f0f0f"
    assert len(run_uuid("not-hex")) == 36


# ---------------------------------------------------------------------- sends


async def test_sends_are_retried_with_backoff_then_given_up_and_never_block(
    hooks: Receiver,
) -> None:
    box = Outbox(attempts=4, backoff=0.05, give_up=5.0, timeout=2.0)
    outcomes: list[bool] = []
    hooks.fail_first["/flaky"] = 2
    hooks.status["/gone"] = 404
    hooks.status["/down"] = 503
    started = time.monotonic()
    for path in ("/flaky", "/gone", "/down"):
        box.send("test", f"{hooks.url}{path}", b"hi", {}, outcomes.append)
    assert time.monotonic() - started < 0.05  # queued, not sent
    await box.drain(timeout=10)
    got = Counter(r.path for r in hooks.received())
    assert got == Counter({"/flaky": 3, "/gone": 1, "/down": 4})
    assert sorted(outcomes) == [False, False, True]


async def test_the_drain_and_the_queue_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    held: list[asyncio.StreamWriter] = []

    async def never_answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setattr(outbound, "MAX_QUEUED", 1)
    box = Outbox(attempts=3, backoff=0.05, timeout=30.0)
    outcomes: list[bool] = []
    box.send("test", f"http://127.0.0.1:{port}/x", b"", {}, outcomes.append)
    box.send("test", f"http://127.0.0.1:{port}/y", b"", {}, outcomes.append)  # dropped
    await asyncio.sleep(0.05)
    assert outcomes == [False]
    started = time.monotonic()
    await box.drain(timeout=0.5)
    assert time.monotonic() - started < 2.0 and not box.tasks
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


# ---------------------------------------------------------------------- the fleet count


async def test_concurrent_outcomes_count_once_each_and_each_transition_is_made_once(
    nc: NATS,
) -> None:
    keys = Keys(await ensure_bucket(nc.jetstream(), StateSpec("CRON_STATE", 1, 60.0)))
    made = await asyncio.gather(*(apply(keys, "sync", "failed", f"run{i}", 5) for i in range(12)))
    events = Counter(e for _, evs in made for e in evs)
    # failing once; auto_paused by each of the 5th to 12th failures.
    assert events == Counter({"failing": 1, "auto_paused": 8})
    last = await keys.last("health.sync")
    assert last is not None and last[1] is not None and last[1]["failures"] == 12
    # An outcome applied again (its answer lost) is not counted twice.
    again = await apply(keys, "sync", "failed", last[1]["run"], 5)
    assert again[0]["failures"] == 12
    # Resume: the count restarts, the state stays failing, a success recovers.
    assert await reset(keys, "sync")
    value, evs = await apply(keys, "sync", "succeeded", "ok1", 5)
    assert (value["failures"], evs, value["recovered_after"]) == (0, ("recovered",), 0)
    assert not await reset(keys, "other")
    # One sender per event.
    claims = await asyncio.gather(*(claim_event(keys, "sync", "r1", "lost", 60) for _ in range(5)))
    assert sorted(claims) == [False] * 4 + [True]


def test_check_shows_pings_webhooks_and_expectations_with_their_urls_masked(
    tmp_path: Path,
) -> None:
    cfg = {
        "jobs": [{"name": "sync", "schedule": "* * * * *", "pause_after": 4}],
        "defaults": {"ping": {"url": f"https://hc.example/{SECRET}/{{job}}", "start": True}},
        "notify": [{"url": f"https://hooks.example/{SECRET}", "events": ["lost"]}],
    }
    res = run_cli("check", "-c", str(write_config(tmp_path / "c.yaml", cfg)))
    assert res.returncode == 0, res.stderr
    assert "notify https://hooks.example/*** (json): lost\n" in res.stdout
    assert "  ping https://hc.example/*** (with /start), pause after 4 failures in a row\n" in (
        res.stdout
    )
    assert SECRET not in res.stdout + res.stderr


# ---------------------------------------------------------------------- hung receivers


class Hung:
    """A receiver that accepts every connection and never answers; counts the open ones."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.accepted = 0
        self.most_open = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
                conn.setblocking(False)
                self.conns.append(conn)
                self.accepted += 1
            except TimeoutError:
                pass
            for conn in list(self.conns):  # closed by the sender: forgotten
                try:
                    while conn.recv(65536):  # the request: read, never answered
                        pass
                    conn.close()
                    self.conns.remove(conn)
                except BlockingIOError:
                    pass
                except OSError:
                    self.conns.remove(conn)
            self.most_open = max(self.most_open, len(self.conns))

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        for conn in self.conns:
            conn.close()
        self.sock.close()


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_hung_ping_receiver_costs_a_few_connections_and_never_a_trigger(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    hung = Hung()
    url = f"http://127.0.0.1:{hung.port}/ping/{{job}}"
    jobs = [job(f"j{i}", jitter="100ms") for i in range(3)]
    config = {
        **base(nats_server, http_app, jobs),
        "defaults": {"ping": {"url": url, "start": True}},
    }
    try:
        with sidecars(tmp_path, [("s0", config, {})]) as procs:
            pid = procs[0].proc.pid if procs[0].proc else 0
            wait_for(lambda: hung.accepted >= 1, 10, what="the first ping")
            first = open_fds(pid)
            most = first
            started = time.monotonic()
            while time.monotonic() - started < 12:  # 6 pings a second, 10 s send timeout
                most = max(most, open_fds(pid))
                time.sleep(0.1)
            runs = {name: slots(http_app, f"/jobs/{name}") for name in ("j0", "j1", "j2")}
            late = [r.at - int(r.headers["X-Anarchon-Slot"]) / 1000 for r in http_app.requests]
    finally:
        hung.stop()
    assert hung.most_open <= outbound.MAX_CONNECTIONS, hung.most_open
    assert most - first <= outbound.MAX_CONNECTIONS + 2, (first, most)
    for name, ran in runs.items():  # the slots of the 12 s reached the app, on time
        assert len(ran) >= 10 and len(set(ran)) == len(ran), (name, ran)
    assert max(late) < 2.0, max(late)
