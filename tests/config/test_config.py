"""Config parsing: every key of docs/CONFIG.md, every rule with its key path, secrets."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.config.addresses import redact_url
from sidecar.config.fields import format_duration, parse_duration
from sidecar.config.load import (
    Config,
    NatsConfig,
    Secrets,
    TargetConfig,
    load_config,
    load_secrets,
    parse_config,
)
from sidecar.core.errors import ConfigError
from tests.support import examples

SECRET = "s3cr3t-Value-42"

FULL_YAML = """\
instance_id: web-1
shutdown_grace: 40s
nats:
  servers: [nats://n1:4222, tls://n2.example:4223]
  stream: BILLING_CRON
  prefix: billing.cron.
  duplicate_window: 10m
  history_size: 2000
  replicas: 3
  user: sidecar
  password_file: PASSWORD_FILE
  tls: {ca_file: /etc/ca.pem, cert_file: /etc/cert.pem, key_file: /etc/key.pem}
  connect_timeout: 1500ms
  ack_timeout: 3s
metrics:
  listen: "[::]:9500"
target:
  url: http://app.internal:8081
  allow_remote: true
  timeout: 45s
  headers: {Authorization: Bearer abc, X-Env: prod}
  signing_secret_file: SIGNING_FILE
jobs:
  - name: sync
    schedule: "*/5 * * * *"
    timezone: Europe/Berlin
    jitter: 1s
    max_late: 1m30s
    history_size: 5000
    request:
      method: put
      path: /internal/sync
      headers: {x-env: staging, Content-Type: application/json}
      body: '{"full": true}'
      timeout: 2m
  - name: report_daily-2
    schedule: "30 0 6 * * *"
"""


def job(**overrides: Any) -> dict[str, Any]:
    """A valid job entry with ``overrides`` applied."""
    return {"name": "sync", "schedule": "*/5 * * * *", **overrides}


def config(**overrides: Any) -> dict[str, Any]:
    """A valid config (one job) with top-level ``overrides`` applied."""
    return {"instance_id": "web-1", "jobs": [job()], **overrides}


def error_of(data: object, env: dict[str, str] | None = None) -> ConfigError:
    """The ConfigError that parsing ``data`` raises."""
    with pytest.raises(ConfigError) as info:
        parse_config(data, env or {})
    return info.value


@pytest.fixture
def full_file(tmp_path: Path) -> Path:
    (tmp_path / "password").write_text(SECRET + "\n")
    (tmp_path / "signing").write_bytes(b"sign-key\r\n")
    path = tmp_path / "sidecar.yaml"
    path.write_text(
        FULL_YAML.replace("PASSWORD_FILE", str(tmp_path / "password")).replace(
            "SIGNING_FILE", str(tmp_path / "signing")
        )
    )
    return path


def test_full_config_is_normalised(full_file: Path) -> None:
    cfg = load_config(str(full_file), {})
    nats = cfg.nats
    assert cfg.instance_id == "web-1"
    assert cfg.shutdown_grace == 40.0
    assert nats.servers == ("nats://n1:4222", "tls://n2.example:4223")
    assert (nats.stream, nats.prefix) == ("BILLING_CRON", "billing.cron.")
    assert nats.duplicate_window == 600.0
    assert (nats.history_size, nats.replicas) == (2000, 3)
    assert nats.user == "sidecar"
    assert nats.password_file == str(full_file.parent / "password")
    assert nats.tls is not None and nats.tls.key_file == "/etc/key.pem"
    assert (nats.connect_timeout, nats.ack_timeout) == (1.5, 3.0)
    assert (cfg.metrics.host, cfg.metrics.port) == ("::", 9500)
    target = cfg.target
    assert target.allow_remote and target.timeout == 45.0
    assert target.base_url == "http://app.internal:8081"
    assert target.unix_socket is None
    sync, report = cfg.jobs
    assert sync.timezone == ZoneInfo("Europe/Berlin")
    assert sync.schedule.expr == "*/5 * * * *" and sync.schedule.tz == ZoneInfo("Europe/Berlin")
    assert (sync.jitter, sync.max_late, sync.history_size) == (1.0, 90.0, 5000)
    request = sync.request
    assert (request.method, request.path, request.timeout) == ("PUT", "/internal/sync", 120.0)
    assert request.body == '{"full": true}'
    # Job headers win over target headers, names compared case-insensitively.
    assert dict(request.headers) == {
        "Authorization": "Bearer abc",
        "x-env": "staging",
        "Content-Type": "application/json",
    }
    assert report.name == "report_daily-2" and report.timezone == ZoneInfo("UTC")
    assert report.request.path == "/jobs/report_daily-2"
    assert report.request.timeout == 45.0
    assert dict(report.request.headers) == {"Authorization": "Bearer abc", "X-Env": "prod"}
    assert cfg.effective_history_size == 5000
    assert cfg.job("sync") is sync
    with pytest.raises(TypeError):
        request.headers["X-New"] = "x"  # type: ignore[index]


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "host-a")
    cfg = parse_config({"jobs": [job()]}, {})
    assert cfg.instance_id == "host-a"
    assert cfg.nats == NatsConfig()
    assert cfg.nats.duplicate_window == 300.0 and cfg.nats.replicas is None
    assert (cfg.metrics.host, cfg.metrics.port) == ("0.0.0.0", 9464)
    assert cfg.target == TargetConfig()
    assert cfg.target.base_url == "http://127.0.0.1:8080"
    assert cfg.shutdown_grace == 25.0
    (only,) = cfg.jobs
    assert (only.jitter, only.max_late, only.history_size) == (2.0, 60.0, None)
    assert only.timezone == ZoneInfo("UTC")
    request = only.request
    assert (request.method, request.path, request.body, request.timeout) == (
        "POST",
        "/jobs/sync",
        "",
        30.0,
    )
    assert dict(request.headers) == {}
    assert cfg.effective_history_size == 1000


def test_nulls_mean_defaults() -> None:
    cfg = parse_config(config(nats=None, metrics=None, target={"headers": None}), {})
    assert cfg.nats == NatsConfig() and cfg.target.headers == {}
    nats = parse_config(config(nats={"servers": None, "tls": None, "replicas": None}), {}).nats
    assert nats == NatsConfig()


def test_one_server_url() -> None:
    nats = parse_config(config(nats={"servers": "tls://nats.internal:4222"}), {}).nats
    assert nats.servers == ("tls://nats.internal:4222",)


@pytest.mark.parametrize("key", ["token_file", "nkey_seed_file", "creds_file"])
def test_other_auth_methods(key: str) -> None:
    nats = parse_config(config(nats={key: "/etc/anarchon/x", "tls": {}}), {}).nats
    assert getattr(nats, key) == "/etc/anarchon/x"
    assert nats.tls is not None and nats.tls.ca_file is None


def test_unknown_job_lookup() -> None:
    cfg = parse_config(config(), {})
    with pytest.raises(ConfigError) as info:
        cfg.job("nope")
    assert info.value.key == "jobs" and "nope" in info.value.message


@pytest.mark.parametrize(
    ("url", "base_url", "socket_path"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080", None),
        ("http://localhost", "http://localhost:80", None),
        ("http://[::1]:9000/", "http://[::1]:9000", None),
        ("http://127.8.9.10:1", "http://127.8.9.10:1", None),
        ("unix:///run/app/app.sock", "http://localhost", "/run/app/app.sock"),
    ],
)
def test_target_urls(url: str, base_url: str, socket_path: str | None) -> None:
    target = parse_config(config(target={"url": url}), {}).target
    assert (target.base_url, target.unix_socket) == (base_url, socket_path)


def _set(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``data`` with the dotted ``path`` set (``jobs.0.x`` indexes)."""
    data = copy.deepcopy(data)
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


TWO_JOBS = config(jobs=[job(name="a"), job(name="b")])

# (where, value, the error's key, a fragment of its message)
RULES = [
    # unknown keys and wrong types, at every level
    ("colour", "red", "colour", "allowed: instance_id"),
    ("nats.colour", 1, "nats.colour", "allowed: servers"),
    ("nats.tls.colour", 1, "nats.tls.colour", "allowed: ca_file"),
    ("metrics.colour", 1, "metrics.colour", "allowed: listen"),
    ("target.colour", 1, "target.colour", "allowed: url"),
    ("jobs.1.colour", 1, "jobs[1].colour", "allowed: name"),
    ("jobs.1.request.colour", 1, "jobs[1].request.colour", "allowed: method"),
    ("nats", "nats://x:4222", "nats", "expected a map"),
    ("nats.tls", [], "nats.tls", "expected a map"),
    ("target", [], "target", "expected a map"),
    ("jobs", {"name": "a"}, "jobs", "list"),
    ("jobs", [], "jobs", "at least one"),
    ("jobs.1", "b", "jobs[1]", "expected a map"),
    ("jobs.1.request", "POST /x", "jobs[1].request", "expected a map"),
    ("instance_id", 7, "instance_id", "quote it"),
    ("instance_id", " ", "instance_id", "letters, digits, _ and - only"),
    ("instance_id", "web-1.example.com", "instance_id", "names a key in the state bucket"),
    ("nats.state_bucket", "CRON.STATE", "nats.state_bucket", "letters, digits, _ and - only"),
    ("nats.lease_ttl", "500ms", "nats.lease_ttl", "at least"),
    ("jobs.0.catchup", "some", "jobs[0].catchup", "expected one of none, latest, all"),
    # leases and attempts (docs/CONFIG.md)
    ("jobs.1.overlap", "forbid", "jobs[1].overlap", "expected one of allow, skip"),
    ("jobs.1.overlap", True, "jobs[1].overlap", "expected one of allow, skip"),
    ("jobs.1.overlap", "queue", "jobs[1].overlap", "allow, skip, replace, buffer_one"),
    ("jobs.1.cancel", {"grace": "1s"}, "jobs[1].cancel", "only used with overlap: replace"),
    ("jobs.1.on_lost", "retry", "jobs[1].on_lost", "expected one of record, rerun"),
    ("jobs.1.on_lost", "rerun", "jobs[1].on_lost", "needs retry.max of at least 1"),
    ("jobs.1.retry", 3, "jobs[1].retry", "expected a map"),
    ("jobs.1.retry.max", 11, "jobs[1].retry.max", "between 0 and 10"),
    ("jobs.1.retry.max", -1, "jobs[1].retry.max", "between 0 and 10"),
    ("jobs.1.retry.max", "2", "jobs[1].retry.max", "whole number"),
    ("jobs.1.retry.backoff", "500ms", "jobs[1].retry.backoff", "at least 1s"),
    ("jobs.1.retry.backoff", "soon", "jobs[1].retry.backoff", "not a duration"),
    ("jobs.1.retry.tries", 2, "jobs[1].retry.tries", "allowed: max, backoff"),
    ("shutdown_grace", "-1s", "shutdown_grace", "duration"),
    # durations
    ("jobs.1.jitter", -5, "jobs[1].jitter", "negative"),
    ("jobs.1.jitter", 1.5, "jobs[1].jitter", "without a unit"),
    ("jobs.1.max_late", "soon", "jobs[1].max_late", "not a duration"),
    ("nats.duplicate_window", "99ms", "nats.duplicate_window", "at least 100ms"),
    ("nats.connect_timeout", 0, "nats.connect_timeout", "at least 1ms"),
    ("nats.ack_timeout", "0s", "nats.ack_timeout", "at least"),
    ("target.timeout", True, "target.timeout", "boolean"),
    ("jobs.1.request.timeout", "0ms", "jobs[1].request.timeout", "at least"),
    # job names
    ("jobs.1.name", "a.b", "jobs[1].name", "'a.b' is not a job name: letters, digits, _ and -"),
    ("jobs.1.name", "a b", "jobs[1].name", "letters, digits"),
    ("jobs.1.name", "", "jobs[1].name", "letters, digits"),
    ("jobs.1.name", None, "jobs[1].name", "required"),
    ("jobs.1.name", "a", "jobs[1].name", "duplicate job name 'a'"),
    # jitter + max_late < duplicate_window
    ("jobs.1.max_late", "5m", "jobs[1].jitter", "(2s) + max_late (5m)"),
    ("jobs.1.jitter", "4m58s", "jobs[1].jitter", "nats.duplicate_window (5m)"),
    # history_ttl anywhere
    ("history_ttl", "1d", "history_ttl", "history is trimmed by count only; remove history_ttl"),
    ("nats.history_ttl", "1h", "nats.history_ttl", "trimmed by count only"),
    ("jobs.1.history_ttl", 5, "jobs[1].history_ttl", "trimmed by count only"),
    # schedules and timezones
    ("jobs.1.schedule", "61 * * * *", "jobs[1].schedule", "61"),
    ("jobs.1.schedule", "* * *", "jobs[1].schedule", "fields"),
    ("jobs.1.schedule", None, "jobs[1].schedule", "required"),
    ("jobs.1.timezone", "Mars/Olympus", "jobs[1].timezone", "unknown timezone"),
    ("jobs.1.timezone", "../etc/passwd", "jobs[1].timezone", "unknown timezone"),
    # target
    ("target.url", "https://127.0.0.1", "target.url", "http://HOST:PORT or unix:///"),
    ("target.url", "unix://run/app.sock", "target.url", "unix:///absolute/path"),
    ("target.url", "127.0.0.1:8080", "target.url", "http://HOST:PORT"),
    ("target.url", "http://10.1.2.3:8080", "target.url", "allow_remote"),
    ("target.url", "http://app.internal", "target.url", "not loopback"),
    ("target.url", "http://127.0.0.1:8080/api", "target.url", "request.path"),
    ("target.url", "http://127.0.0.1:99999", "target.url", "not a valid URL"),
    ("target.allow_remote", "yes", "target.allow_remote", "true or false"),
    # nats
    ("nats.servers", [], "nats.servers", "at least one"),
    ("nats.servers", "localhost:4222", "nats.servers[0]", "nats://HOST:PORT"),
    ("nats.servers", ["nats://a:1", "http://b:2"], "nats.servers[1]", "tls://"),
    ("nats.servers", ["nats://:4222"], "nats.servers[0]", "nats://"),
    ("nats.servers", ["nats://u:p@a:1"], "nats.servers[0]", "no credentials"),
    ("nats.servers", [4222], "nats.servers[0]", "string"),
    ("nats.stream", "MY CRON", "nats.stream", "whitespace"),
    ("nats.stream", "a.b", "nats.stream", "."),
    ("nats.stream", "A*", "nats.stream", "*"),
    ("nats.stream", "A>", "nats.stream", ">"),
    ("nats.stream", "", "nats.stream", "empty"),
    ("nats.prefix", "cron", "nats.prefix", "end with '.'"),
    ("nats.prefix", "cron.*.", "nats.prefix", "*>"),
    ("nats.prefix", "a..", "nats.prefix", "empty"),
    ("nats.prefix", ".", "nats.prefix", "empty"),
    ("nats.replicas", 0, "nats.replicas", "between 1 and 5"),
    ("nats.replicas", 6, "nats.replicas", "between 1 and 5"),
    ("nats.replicas", "3", "nats.replicas", "whole number"),
    ("nats.history_size", 0, "nats.history_size", "between 1"),
    ("jobs.1.history_size", True, "jobs[1].history_size", "whole number"),
    ("nats.password_file", "/p", "nats.password_file", "needs nats.user"),
    ("nats.tls", {"cert_file": "/c"}, "nats.tls", "cert_file and key_file"),
    # request
    ("jobs.1.request.method", "OPTIONS", "jobs[1].request.method", "GET, POST"),
    ("jobs.1.request.path", "jobs/b", "jobs[1].request.path", "start with /"),
    ("jobs.1.request.path", "/a b", "jobs[1].request.path", "spaces"),
    ("jobs.1.request.body", {"a": 1}, "jobs[1].request.body", "string"),
    # headers
    ("target.headers", ["A: b"], "target.headers", "map"),
    ("target.headers", {"X-Version": 2}, "target.headers.X-Version", "quote it"),
    ("target.headers", {"Bad Name": "x"}, "target.headers.'Bad Name'", "header name"),
    ("target.headers", {"A": "x\r\nB: y"}, "target.headers.A", "control"),
    ("target.headers", {"x-anarchon-job": "x"}, "target.headers.x-anarchon-job", "reserved"),
    (
        "jobs.1.request.headers",
        {"X-Anarchon-Slot": "1"},
        "jobs[1].request.headers.X-Anarchon-Slot",
        "reserved",
    ),
    # metrics
    ("metrics.listen", 9464, "metrics.listen", "write HOST:PORT, e.g. 0.0.0.0:9464 (every"),
    ("metrics.listen", "9464", "metrics.listen", "a port alone is not enough: write HOST:PORT"),
    ("metrics.listen", ":9464", "metrics.listen", "or 127.0.0.1:9464 (this host only)"),
    ("metrics.listen", "0.0.0.0:65536", "metrics.listen", "HOST:PORT"),
    ("metrics.listen", "[::1:9464", "metrics.listen", "HOST:PORT"),
    ("metrics.listen", ":::9464", "metrics.listen", "HOST:PORT"),
]


@pytest.mark.parametrize(
    ("where", "value", "key", "fragment"),
    RULES,
    ids=[f"{rule[0]}={rule[1]!r}" for rule in RULES],
)
def test_rule_names_the_key(where: str, value: Any, key: str, fragment: str) -> None:
    error = error_of(_set(TWO_JOBS, where, value))
    assert error.key == key
    assert fragment in error.message
    assert "\n" not in str(error)


@pytest.mark.parametrize(
    ("jobs", "nats", "key"),
    [
        # every second, 10 kept claims = 10s of memory < 62s of possible lateness
        (
            [job(schedule="* * * * * *", history_size=10)],
            {"history_size": 5},
            "jobs[0].history_size",
        ),
        ([job(schedule="* * * * * *")], {"history_size": 62}, "nats.history_size"),
        # every attempt of a slot is a claim: 200 x 1s / 4 claims a slot = 50s < 62s
        (
            [job(schedule="* * * * * *", retry={"max": 3})],
            {"history_size": 200},
            "nats.history_size",
        ),
        # the largest history size counts for every job
        (
            [job(name="a", schedule="* * * * * *"), job(name="b", history_size=10)],
            {"history_size": 40},
            "nats.history_size",
        ),
    ],
)
def test_history_rule(jobs: list[dict[str, Any]], nats: dict[str, Any], key: str) -> None:
    error = error_of(config(jobs=jobs, nats=nats))
    assert error.key == key
    assert "JetStream" in error.message and "jitter + max_late" in error.message


@pytest.mark.parametrize(
    ("jobs", "nats"),
    [
        ([job(schedule="* * * * * *")], {"history_size": 63}),
        ([job(name="a", schedule="* * * * * *"), job(name="b", history_size=63)], {}),
        ([job(schedule="* * * * * *", jitter=0, max_late="9s")], {"history_size": 10}),
    ],
)
def test_history_rule_passes(jobs: list[dict[str, Any]], nats: dict[str, Any]) -> None:
    parse_config(config(jobs=jobs, nats=nats), {})


def test_window_rule_message_shows_values() -> None:
    data = config(nats={"duplicate_window": "1m"}, jobs=[job(jitter="10s", max_late="50s")])
    error = error_of(data)
    assert error.key == "jobs[0].jitter"
    assert "10s" in error.message and "50s" in error.message and "1m" in error.message


def test_top_level_must_be_a_map() -> None:
    assert error_of(None).key == "config"
    assert error_of(["jobs"]).key == "config"


@pytest.mark.parametrize(
    ("token", "others"),
    [
        ("token", {"user": "u"}),
        ("token_file", {"nkey_seed_file": "/n"}),
        ("creds_file", {"user": "u"}),
    ],
)
def test_one_auth_method(token: str, others: dict[str, str]) -> None:
    error = error_of(config(nats={token: "/x", **others}))
    assert error.key.startswith("nats.") and "one way to authenticate" in error.message


# ---------------------------------------------------------------- env


def test_env_overrides() -> None:
    env = {
        "ANARCHON_INSTANCE_ID": "from-env",
        "ANARCHON_NATS_SERVERS": "nats://a:4222, tls://b:4223,",
        "ANARCHON_METRICS_LISTEN": "127.0.0.1:9999",
    }
    data = config(nats={"servers": "nats://file:4222", "stream": "S"}, metrics={"listen": "x:1"})
    cfg = parse_config(data, env)
    assert cfg.instance_id == "from-env"
    assert cfg.nats.servers == ("nats://a:4222", "tls://b:4223")
    assert cfg.nats.stream == "S"
    assert (cfg.metrics.host, cfg.metrics.port) == ("127.0.0.1", 9999)
    assert data["nats"]["servers"] == "nats://file:4222", "the input is not modified"


def test_empty_env_values_are_ignored() -> None:
    cfg = parse_config(config(), {"ANARCHON_INSTANCE_ID": "", "ANARCHON_NATS_SERVERS": ""})
    assert cfg.instance_id == "web-1" and cfg.nats == NatsConfig()


@pytest.mark.parametrize(
    ("variable", "value", "key"),
    [
        ("ANARCHON_NATS_SERVERS", "nats://a:1,http://b", "nats.servers[1]"),
        ("ANARCHON_NATS_SERVERS", ",", "nats.servers"),
        ("ANARCHON_METRICS_LISTEN", "nowhere", "metrics.listen"),
        ("ANARCHON_INSTANCE_ID", "\t", "instance_id"),
    ],
)
def test_env_override_errors_name_the_variable(variable: str, value: str, key: str) -> None:
    error = error_of(config(), {variable: value})
    assert error.key == key and variable in error.message


# ---------------------------------------------------------------- durations

DURATIONS = [
    (0, 0.0),
    (250, 0.25),
    (60000, 60.0),
    ("250ms", 0.25),
    ("2s", 2.0),
    ("5m", 300.0),
    ("1h", 3600.0),
    ("1m30s", 90.0),
    ("1h2m3s4ms", 3723.004),
    ("1.5s", 1.5),
    (" 2s ", 2.0),
    ("0s", 0.0),
]


@pytest.mark.parametrize(("value", "seconds"), DURATIONS)
def test_duration(value: object, seconds: float) -> None:
    assert parse_duration(value, "k") == pytest.approx(seconds)


BAD_DURATIONS = [-1, "-1s", 1.5, "2", "", "s", "2 s", "2sec", "30s1m", "1m1m", "2d", "1e3ms"]


@pytest.mark.parametrize("value", [*BAD_DURATIONS, True, None, [], {}, 10**30, "999999999h"])
def test_bad_duration(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(value, "jobs[0].jitter")
    assert info.value.key == "jobs[0].jitter"


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (0.25, "250ms"), (90, "1m30s"), (3600, "1h"), (62, "1m2s")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text, "k") == seconds


# ---------------------------------------------------------------- files


def test_load_config_from_env_path(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("jobs: [{name: a, schedule: '0 * * * *'}]\n")
    assert load_config(None, {"ANARCHON_CONFIG": str(path)}).jobs[0].name == "a"


def test_load_config_needs_a_path() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {})
    assert info.value.key == "config"
    assert info.value.message == "no config file: pass -c FILE or set ANARCHON_CONFIG"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "no such file"),
        ("", "empty"),
        ("# only a comment\n", "empty"),
        ("jobs:\n  - name: a\n   schedule: x\n", "line 3"),
        ("jobs: [\n", "line 2"),
        ("a: 1\nb: 2\na: 3\n", "duplicate key 'a'"),
        (b"\xff\xfe", "UTF-8"),
    ],
)
def test_load_config_file_errors(
    tmp_path: Path, content: str | bytes | None, fragment: str
) -> None:
    path = tmp_path / "c.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    error = info.value
    assert error.key == "config" and fragment in error.message and str(path) in error.message
    assert "\n" not in str(error) and "Traceback" not in str(error)


def test_load_config_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path), {})
    assert info.value.key == "config" and str(tmp_path) in info.value.message


# ---------------------------------------------------------------- secrets


def _with_files(tmp_path: Path, **files: str | None) -> Config:
    """A config whose secret keys point at files in ``tmp_path`` holding ``files``."""
    nats: dict[str, Any] = {}
    target: dict[str, Any] = {}
    for key, content in files.items():
        path = tmp_path / key
        if content is not None:
            path.write_text(content)
        (target if key == "signing_secret_file" else nats)[key] = str(path)
    if "password_file" in files:
        nats["user"] = "sidecar"
    return parse_config(config(nats=nats, target=target), {})


def test_secrets_from_files(tmp_path: Path) -> None:
    cfg = _with_files(tmp_path, password_file=SECRET + "\n", signing_secret_file=SECRET + "\n\n")
    secrets = load_secrets(cfg, {"ANARCHON_NATS_PASSWORD": "ignored"})
    assert secrets.nats_password == SECRET
    assert secrets.signing_secret == (SECRET + "\n").encode()  # only one newline stripped
    assert secrets.nats_token is None
    token = load_secrets(_with_files(tmp_path, token_file=SECRET), {})
    assert token.nats_token == SECRET


def test_secrets_from_env() -> None:
    cfg = parse_config(config(nats={"user": "sidecar"}), {})
    env = {"ANARCHON_NATS_PASSWORD": SECRET, "ANARCHON_SIGNING_SECRET": "sig"}
    secrets = load_secrets(cfg, env)
    assert (secrets.nats_password, secrets.signing_secret) == (SECRET, b"sig")
    plain = load_secrets(parse_config(config(), {}), {"ANARCHON_NATS_TOKEN": SECRET})
    assert plain == Secrets(nats_token=SECRET)
    assert load_secrets(parse_config(config(), {}), {}) == Secrets()


def test_inline_token() -> None:
    cfg = parse_config(config(nats={"token": SECRET}), {})
    assert load_secrets(cfg, {"ANARCHON_NATS_TOKEN": "other"}).nats_token == SECRET


@pytest.mark.parametrize(
    ("files", "key", "fragment"),
    [
        ({"password_file": None}, "nats.password_file", "does not exist"),
        ({"password_file": "\n"}, "nats.password_file", "empty"),
        ({"token_file": ""}, "nats.token_file", "empty"),
        ({"signing_secret_file": None}, "target.signing_secret_file", "does not exist"),
        ({"nkey_seed_file": None}, "nats.nkey_seed_file", "does not exist"),
        ({"creds_file": ""}, "nats.creds_file", "empty"),
    ],
)
def test_secret_file_errors(
    tmp_path: Path, files: dict[str, str | None], key: str, fragment: str
) -> None:
    cfg = _with_files(tmp_path, **files)
    with pytest.raises(ConfigError) as info:
        load_secrets(cfg, {})
    assert info.value.key == key and fragment in info.value.message


def test_user_needs_a_password() -> None:
    cfg = parse_config(config(nats={"user": "sidecar"}), {})
    with pytest.raises(ConfigError) as info:
        load_secrets(cfg, {})
    assert info.value.key == "nats.password_file"


def test_check_needs_no_secret_files(tmp_path: Path) -> None:
    # parse_config alone (what `check` runs) never opens a secret file.
    _with_files(tmp_path, password_file=None, signing_secret_file=None)


def test_secrets_never_shown(tmp_path: Path) -> None:
    cfg = _with_files(tmp_path, password_file=SECRET, signing_secret_file=SECRET)
    secrets = load_secrets(cfg, {})
    inline = parse_config(config(nats={"token": SECRET}), {})
    shown = [repr(cfg), str(cfg), repr(secrets), str(secrets), repr(inline), repr(inline.nats)]
    assert not any(SECRET in text for text in shown)
    assert "nats_password=<set>" in repr(secrets)
    messages = [
        str(error_of(config(nats={"token": SECRET, "user": "u"}))),
        str(error_of(config(nats={"token": SECRET, "tokn": SECRET}))),
    ]
    unreadable = tmp_path / "binary"
    unreadable.write_bytes(SECRET.encode() + b"\xff")
    cfg = parse_config(config(nats={"token_file": str(unreadable)}), {})
    with pytest.raises(ConfigError) as info:
        load_secrets(cfg, {})
    messages.append(str(info.value))
    assert not any(SECRET in text for text in messages)


# ---------------------------------------------------------------- fuzz

KEYS = [
    "instance_id", "nats", "metrics", "target", "jobs", "shutdown_grace", "servers", "stream",
    "prefix", "duplicate_window", "history_size", "replicas", "user", "password_file", "token",
    "tls", "ca_file", "listen", "url", "timeout", "headers", "allow_remote", "name", "schedule",
    "timezone", "jitter", "max_late", "request", "method", "path", "body", "history_ttl", "query",
]  # fmt: skip
VALUES = [
    "*/5 * * * *", "0 0 * * *", "* * * * * *", "UTC", "Europe/Berlin", "5m", "250ms", "1m30s",
    "nats://127.0.0.1:4222", "http://127.0.0.1:8080", "unix:///x.sock", "[::]:9464", "POST",
    "/jobs/a", "cron.", "CRON", "sync",
]  # fmt: skip
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.sampled_from(VALUES)
)
TREES = st.recursive(
    LEAVES,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(KEYS) | st.text(max_size=8) | st.integers(), children, max_size=5
        )
    ),
    max_leaves=30,
)
JOBS = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["a", "b", "a.b"]) | LEAVES, "schedule": st.sampled_from(VALUES)},
        optional={
            key: TREES for key in ("timezone", "jitter", "max_late", "history_size", "request")
        },
    ),
    max_size=3,
)
FULL = yaml.safe_load(FULL_YAML)


def _paths(node: object, prefix: str = "") -> list[str]:
    """Every dotted path in ``node`` (list items by index), for ``_set``."""
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else []
    )
    paths = []
    for key, child in items:
        path = f"{prefix}{key}"
        paths += [path, *_paths(child, path + ".")]
    return paths


# One random change deep inside a valid config reaches every validator.
MUTATED = st.builds(
    lambda path, value: _set(FULL, path, value),
    st.sampled_from(_paths(FULL)),
    TREES,
)
CONFIGS = (
    TREES
    | MUTATED
    | st.fixed_dictionaries(
        {"jobs": JOBS},
        optional={key: TREES for key in ("nats", "metrics", "target", "instance_id")},
    )
)


@settings(max_examples=examples(200), deadline=None)
@given(data=CONFIGS, env=st.dictionaries(st.sampled_from(["ANARCHON_NATS_SERVERS"]), st.text()))
def test_fuzz_only_config_errors(data: object, env: dict[str, str]) -> None:
    try:
        cfg = parse_config(data, env)
    except ConfigError as error:
        assert error.key and "\n" not in str(error)
    else:
        assert cfg.jobs


# ---------------------------------------------------------------- credentials in URLs

PASSWORD = "Sup3rS3cret"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://admin:Sup3rS3cret@127.0.0.1:4222", "nats://admin:***@127.0.0.1:4222"),
        ("nats://Sup3rS3cret@127.0.0.1:4222", "nats://***@127.0.0.1:4222"),
        ("nats://:Sup3rS3cret@h", "nats://***@h"),
        ("admin:Sup3rS3cret@h:4222", "admin:***@h:4222"),
        ("127.0.0.1:4222", "127.0.0.1:4222"),  # a netloc without userinfo
        ("admin:Sup3rS3cret@h:4222", "admin:***@h:4222"),  # a netloc with one
        ("nats://admin:Sup3r/S3c@ret@h:99", "nats://admin:***@h:99"),  # '/' and '@' in it
        ("nats://a b:Sup3rS3cret@h", "nats://***@h"),  # no plain user name: all masked
        ("admin:Sup3rS3cret@h//x", "admin:***@h//x"),
        ("nats://h:4222", "nats://h:4222"),
        ("unix:///run/app@1.sock", "unix:///run/app@1.sock"),  # a path, no userinfo
        ("nats:///admin:Sup3rS3cret@h", "nats://***@h"),  # a third slash: masked anyway
        ("", ""),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


BAD_URLS = [
    "nats://admin:Sup3rS3cret@127.0.0.1:99999",  # port out of range
    "nats://admin:Sup3rS3cret@127.0.0.1:x",  # port not a number
    "nats://admin:Sup3rS3cret@[::1",  # unclosed IPv6 bracket
    "nats://Sup3rS3cret@127.0.0.1:99999",  # a token as the whole userinfo
    "http://admin:Sup3rS3cret@127.0.0.1:4222",  # not nats://
    "admin:Sup3rS3cret@127.0.0.1:4222",  # no scheme
    "nats://admin:Sup3r/S3cret@127.0.0.1:4222",  # an unencoded '/' in the password
    "nats:///admin:Sup3rS3cret@127.0.0.1:4222",  # no host: a third slash
]


def _assert_masked(error: ConfigError, url: str) -> None:
    assert PASSWORD not in str(error)
    assert "Sup3r" not in str(error)
    if "got" in error.message or "valid URL" in error.message:
        assert "***@" in str(error), error


@pytest.mark.parametrize("url", BAD_URLS)
def test_bad_server_urls_are_echoed_without_credentials(url: str) -> None:
    error = error_of(config(nats={"servers": [url]}))
    assert error.key == "nats.servers[0]"
    _assert_masked(error, url)


@pytest.mark.parametrize("url", BAD_URLS)
def test_bad_server_urls_from_env_are_echoed_without_credentials(url: str) -> None:
    error = error_of(config(), {"ANARCHON_NATS_SERVERS": f"nats://ok:4222,{url}"})
    assert error.key == "nats.servers[1]" and "ANARCHON_NATS_SERVERS" in error.message
    _assert_masked(error, url)


@pytest.mark.parametrize("url", [u.replace("nats://", "http://") for u in BAD_URLS])
def test_bad_target_urls_are_echoed_without_credentials(url: str) -> None:
    error = error_of(config(target={"url": url}))
    assert error.key == "target.url"
    _assert_masked(error, url)
    error = error_of(config(jobs=[job(request={"url": url})]))
    assert error.key == "jobs[0].request.url"
    _assert_masked(error, url)


def test_a_well_formed_target_url_with_credentials_is_refused() -> None:
    for url in ("http://admin:Sup3rS3cret@127.0.0.1:8080", "http://Sup3rS3cret@127.0.0.1:8080"):
        error = error_of(config(target={"url": url}))
        assert error.key == "target.url" and "no credentials" in error.message
        assert PASSWORD not in str(error)


def test_overlap_replace_and_its_cancel_request_parse_and_are_checked() -> None:
    got = parse_config(config(jobs=[job(overlap="replace")]), {}).jobs[0]
    assert (got.overlap, got.cancel.method, got.cancel.path, got.cancel.grace) == (
        "replace",
        "DELETE",
        "/jobs/sync",
        5.0,
    )
    spec = job(overlap="replace", cancel={"method": "post", "path": "/stop", "grace": "2s"})
    got = parse_config(config(jobs=[spec]), {}).jobs[0]
    assert (got.cancel.method, got.cancel.path, got.cancel.grace) == ("POST", "/stop", 2.0)
    assert parse_config(config(jobs=[job(overlap="buffer_one")]), {}).jobs[0].overlap == (
        "buffer_one"
    )
    for cancel, key, words in (
        ({"grace": "60s"}, "jobs[0].cancel.grace", "shorter than max_late"),
        ({"method": "POST"}, "jobs[0].cancel.method", "is the trigger itself"),
        ({"path": "stop"}, "jobs[0].cancel.path", "must start with /"),
        ({"method": "KILL"}, "jobs[0].cancel.method", "expected one of"),
        ({"grace": "10ms"}, "jobs[0].cancel.grace", "at least"),
        ({"when": "now"}, "jobs[0].cancel.when", "allowed: method, path, grace"),
    ):
        error = error_of(config(jobs=[job(overlap="replace", cancel=cancel)]))
        assert (error.key, words in error.message) == (key, True), error


def test_lease_and_attempt_keys_default_to_the_references_behaviour_and_parse() -> None:
    plain = parse_config(config(), {}).jobs[0]
    assert (plain.overlap, plain.on_lost, plain.retry.max, plain.retry.backoff) == (
        "allow",
        "record",
        0,
        30.0,
    )
    assert parse_config(config(), {}).nats.lease_ttl == 30.0
    spec = job(overlap="skip", on_lost="rerun", retry={"max": 2, "backoff": "1m"})
    parsed = parse_config(config(jobs=[spec], nats={"lease_ttl": "5s"}), {})
    got = parsed.jobs[0]
    assert (got.overlap, got.on_lost, got.retry.max, got.retry.backoff) == (
        "skip",
        "rerun",
        2,
        60.0,
    )
    assert parsed.nats.lease_ttl == 5.0
    # Enough history for every attempt: 300 x 1s / 4 claims a slot = 75s > 62s.
    every_second = job(schedule="* * * * * *", retry={"max": 3})
    parse_config(config(jobs=[every_second], nats={"history_size": 300}), {})


@pytest.mark.parametrize(("macro", "instead"), [("@daily", "0 0 * * *"), ("@hourly", "0 * * * *")])
def test_a_cron_macro_is_refused_with_what_to_write(macro: str, instead: str) -> None:
    """docs/CONFIG.md: macros are refused, `@every 1d` is the interval (issue 51)."""
    error = error_of(config(jobs=[job(schedule=macro)]))
    assert error.key == "jobs[0].schedule", error
    assert f"'{macro}': cron macros are not supported; write '{instead}'" in error.message
    assert "'@every 1d'" in error.message


# ---------------------------------------------------------------- metrics


def test_per_job_histograms_are_job_globs() -> None:
    """Issue 49: the jobs whose histograms have series of their own."""
    assert parse_config(config(), {}).metrics.per_job_histograms == ()
    data = config(metrics={"per_job_histograms": ["nightly-*", "billing", "r[0-9]?"]})
    cfg = parse_config(data, {})
    assert cfg.metrics.per_job_histograms == ("nightly-*", "billing", "r[0-9]?")
    err = error_of(config(metrics={"per_job_histograms": "nightly-*"}))
    assert err.key == "metrics.per_job_histograms"
    assert "list of at most 100 job names or globs" in err.message
    err = error_of(config(metrics={"per_job_histograms": ["ok", "a.b"]}))
    assert err.key == "metrics.per_job_histograms[1]"
    assert "'a.b' is not a job name or glob" in err.message
    err = error_of(config(metrics={"per_job_histograms": [f"j{i}" for i in range(101)]}))
    assert err.key == "metrics.per_job_histograms"
