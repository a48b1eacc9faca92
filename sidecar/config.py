"""The config of SPEC.md, parsed once into frozen dataclasses.

``load_config`` reads the YAML file, ``parse_config`` applies the env
overrides and checks every rule, raising :class:`ConfigError` with the key's
path (``jobs[1].jitter``). Units are normalised here: durations are float
seconds, timezones ``ZoneInfo``, schedules :class:`Calendar`. Secrets are not
read here but by ``load_secrets``, which only the commands that connect call,
so that ``check`` works where the secret files are absent.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from sidecar.alerting_config import (
    ExpectConfig,
    NotifyConfig,
    PingConfig,
    TracingConfig,
    parse_expect,
    parse_notify,
    parse_pause_after,
    parse_ping,
    parse_tracing,
)
from sidecar.calendar import Calendar, parse_calendar
from sidecar.candidates import ClaimConfig, check_fit, parse_claim
from sidecar.errors import ConfigError
from sidecar.schedule import ScheduleError
from sidecar.values import (
    CONTROL_RE,
    Section,
    boolean,
    format_duration,
    headers,
    listen_address,
    nats_url,
    read_file,
    read_text_file,
    read_yaml,
    short,
    string,
    subject_name,
    subject_prefix,
    target_url,
    type_name,
    zone,
)


def _no_headers() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True)
class TLSConfig:
    """TLS files for the NATS connection; all unset means TLS with system CAs."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True)
class PlacementConfig:
    """``nats.placement``: where a new stream's replicas go in a supercluster."""

    cluster: str | None = None
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class NatsConfig:
    """``nats:``: where the stream lives and how to reach it. Durations in seconds."""

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    stream: str = "CRON"
    prefix: str = "cron."
    duplicate_window: float = 300.0
    history_size: int = 1000
    replicas: int | None = None
    user: str | None = None
    password_file: str | None = None
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    nkey_seed_file: str | None = None
    creds_file: str | None = None
    tls: TLSConfig | None = None
    connect_timeout: float = 5.0
    ack_timeout: float = 2.0
    state_bucket: str = "CRON_STATE"  # parsed default: "<stream>_STATE"
    lease_ttl: float = 30.0
    domain: str | None = None  # the JetStream domain of the stream and the state bucket
    placement: PlacementConfig | None = None


@dataclass(frozen=True)
class MetricsConfig:
    """``metrics.listen`` split into host (IPv6 without brackets) and port."""

    host: str = "0.0.0.0"
    port: int = 9464


@dataclass(frozen=True)
class AdminConfig:
    """``admin:``: the fleet page on the admin port, and who may act through it."""

    page: bool = True  # GET /, /jobs/<job> and /api/v1/... beside /metrics
    token_file: str | None = None  # without it the page is read-only (every POST 403)


@dataclass(frozen=True)
class TargetConfig:
    """``target:``: the app every job's request goes to, and request defaults."""

    url: str = "http://127.0.0.1:8080"
    timeout: float = 30.0
    # Not in repr: a header may carry the app's credentials (Authorization).
    headers: Mapping[str, str] = field(default_factory=_no_headers, hash=False, repr=False)
    signing_secret_file: str | None = None
    signing_secret_next_file: str | None = None
    signing_v1: bool = True
    allow_remote: bool = False

    @property
    def unix_socket(self) -> str | None:
        """The socket path when ``url`` is ``unix:///path``, else None."""
        return unix_socket_of(self.url)

    @property
    def base_url(self) -> str:
        """``http://host:port`` for TCP, ``http://localhost`` for a unix socket."""
        return base_url_of(self.url)


def unix_socket_of(url: str) -> str | None:
    """The socket path of a ``unix:///path`` URL, else None."""
    return urlsplit(url).path if url.startswith("unix:") else None


def base_url_of(url: str) -> str:
    """``http://host:port`` for a TCP URL, ``http://localhost`` for a unix socket."""
    if unix_socket_of(url) is not None:
        return "http://localhost"
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{parts.port or 80}"


@dataclass(frozen=True, kw_only=True)
class RequestConfig:
    """One job's trigger request, with the target's defaults already applied."""

    method: str = "POST"
    path: str
    # Not in repr: a header may carry the app's credentials (Authorization).
    headers: Mapping[str, str] = field(default_factory=_no_headers, hash=False, repr=False)
    body: str = ""
    timeout: float = 30.0
    url: str = TargetConfig.url  # the job's own ``request.url``, else ``target.url``

    @property
    def unix_socket(self) -> str | None:
        return unix_socket_of(self.url)

    @property
    def base_url(self) -> str:
        return base_url_of(self.url)


@dataclass(frozen=True)
class RetryConfig:
    """``jobs[].retry``: extra attempts after a failed (or lost) one. Seconds."""

    max: int = 0
    backoff: float = 30.0


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """One entry of ``jobs:``. Durations in seconds."""

    name: str
    schedule: Calendar  # one expression or several, spread and exclusions applied
    timezone: ZoneInfo
    jitter: float = 2.0
    max_late: float = 60.0
    history_size: int | None = None
    request: RequestConfig
    catchup: str = "none"  # none, latest or all (FLEET.md)
    overlap: str = "allow"  # or skip: no run while one of this job is alive
    on_lost: str = "record"  # or rerun: a lost run's next attempt is due at once
    retry: RetryConfig = field(default_factory=RetryConfig)
    ping: PingConfig | None = None  # Healthchecks-style pings by the runner
    pause_after: int | None = None  # consecutive failed or lost runs, fleet-wide
    expect: ExpectConfig | None = None  # duration expectations (anomalies)
    claim: ClaimConfig = field(default_factory=ClaimConfig)  # candidates (sidecar/candidates.py)


@dataclass(frozen=True)
class Config:
    """The whole config, valid by construction through ``parse_config``."""

    instance_id: str
    nats: NatsConfig
    metrics: MetricsConfig
    target: TargetConfig
    jobs: tuple[JobConfig, ...]
    shutdown_grace: float = 25.0
    admin: AdminConfig = field(default_factory=AdminConfig)
    notify: tuple[NotifyConfig, ...] = ()
    tracing: TracingConfig = field(default_factory=TracingConfig)

    @property
    def effective_history_size(self) -> int:
        """The stream's per-subject limit: the largest of all history sizes."""
        sizes = [job.history_size for job in self.jobs if job.history_size is not None]
        return max([self.nats.history_size, *sizes])

    @property
    def job_names(self) -> tuple[str, ...]:
        return tuple(job.name for job in self.jobs)

    def job(self, name: str) -> JobConfig:
        """The job called ``name``; ConfigError("jobs", ...) when there is none."""
        for job in self.jobs:
            if job.name == name:
                return job
        raise ConfigError("jobs", f"no job named {name!r}")


@dataclass(frozen=True)
class Secrets:
    """Secret values read by ``load_secrets``; never shown by ``repr``."""

    nats_password: str | None = field(default=None, repr=False)
    nats_token: str | None = field(default=None, repr=False)
    signing_secret: bytes | None = field(default=None, repr=False)
    signing_secret_next: bytes | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={'<set>' if getattr(self, name) is not None else None}"
            for name in ("nats_password", "nats_token", "signing_secret", "signing_secret_next")
        )
        return f"Secrets({shown})"


# ---------------------------------------------------------------- parsing

_HISTORY_TTL = "history is trimmed by count only; remove history_ttl"
JOB_NAME = re.compile(r"[A-Za-z0-9_-]+")
INSTANCE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
CATCHUP = ("none", "latest", "all")
OVERLAP = ("allow", "skip")
ON_LOST = ("record", "rerun")
MAX_RETRIES = 10
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_AUTH_KEYS = ("user", "token", "token_file", "nkey_seed_file", "creds_file")


class _Section(Section):
    """A config map; ``history_ttl`` gets its own message wherever it appears."""

    refused = MappingProxyType({"history_ttl": _HISTORY_TTL})


def _merge_headers(base: Mapping[str, str], extra: Mapping[str, str]) -> Mapping[str, str]:
    """``base`` overridden by ``extra``, header names compared case-insensitively."""
    lowered = {name.lower() for name in extra}
    merged = {name: text for name, text in base.items() if name.lower() not in lowered}
    return MappingProxyType({**merged, **extra})


def parse_config(data: object, env: Mapping[str, str]) -> Config:
    """Validate the loaded YAML ``data`` with the env overrides into a Config."""
    if data is None:
        raise ConfigError("config", "the config is empty")
    if not isinstance(data, dict):
        raise ConfigError("config", f"expected a map of keys at the top, got {type_name(data)}")
    data, sources = _apply_env(data, env)
    try:
        return _parse(data)
    except ConfigError as exc:
        for path, variable in sources.items():
            if exc.key == path or exc.key.startswith((f"{path}.", f"{path}[")):
                raise ConfigError(exc.key, f"{exc.message} (set by {variable})") from None
        raise


def _apply_env(
    data: dict[Any, Any], env: Mapping[str, str]
) -> tuple[dict[Any, Any], dict[str, str]]:
    """A copy of ``data`` with ANARCHON_* overrides, and which keys they set."""
    data = dict(data)
    sources: dict[str, str] = {}

    def override(section: str | None, name: str, variable: str, value: object) -> None:
        if section is None:
            data[name] = value
        else:
            part = data.get(section)
            if not isinstance(part, dict | None):
                return  # the type error is reported by the parser
            data[section] = {**(part or {}), name: value}
        sources[f"{section}.{name}" if section else name] = variable

    if env.get("ANARCHON_INSTANCE_ID"):
        override(None, "instance_id", "ANARCHON_INSTANCE_ID", env["ANARCHON_INSTANCE_ID"])
    if env.get("ANARCHON_NATS_SERVERS"):
        servers = [url.strip() for url in env["ANARCHON_NATS_SERVERS"].split(",") if url.strip()]
        override("nats", "servers", "ANARCHON_NATS_SERVERS", servers)
    if env.get("ANARCHON_METRICS_LISTEN"):
        override("metrics", "listen", "ANARCHON_METRICS_LISTEN", env["ANARCHON_METRICS_LISTEN"])
    return data, sources


_TOP_KEYS = (
    "instance_id",
    "nats",
    "metrics",
    "target",
    "jobs",
    "shutdown_grace",
    "admin",
    "defaults",
    "notify",
    "tracing",
)


def _parse(data: dict[Any, Any]) -> Config:
    top = _Section(data, "", _TOP_KEYS)
    instance_id = top.text("instance_id", None)
    if instance_id is None:
        # The host name, made a key token: "web-1.example.com" -> "web-1-example-com".
        instance_id = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()) or "sidecar"
    if not INSTANCE_ID.fullmatch(instance_id):
        raise ConfigError(
            "instance_id",
            f"letters, digits, _ and - only (it names a key in the state bucket), "
            f"got {short(instance_id)}",
        )
    nats = _parse_nats(_Section(data.get("nats"), "nats", tuple(NatsConfig.__dataclass_fields__)))
    metrics = _Section(data.get("metrics"), "metrics", ("listen",))
    admin_sec = _Section(data.get("admin"), "admin", ("page", "token_file"))
    admin = AdminConfig(
        page=admin_sec.get("page", True, boolean), token_file=admin_sec.text("token_file", None)
    )
    if admin.token_file == "":
        raise ConfigError(
            "admin.token_file", "must not be empty (leave it out for a read-only page)"
        )
    target = _parse_target(data.get("target"))
    defaults = _Section(data.get("defaults"), "defaults", ("ping", "claim"))
    raw_jobs = data.get("jobs")
    if not isinstance(raw_jobs, list) or not raw_jobs:
        got = "none" if raw_jobs is None else type_name(raw_jobs)
        raise ConfigError("jobs", f"expected a list of at least one job, got {got}")
    jobs: list[JobConfig] = []
    names: set[str] = set()  # a set: comparing with every earlier job took 0.14 s at 1,000
    for index, raw in enumerate(raw_jobs):
        job = _parse_job(_Section(raw, f"jobs[{index}]", _JOB_KEYS), target, defaults)
        if job.name in names:
            raise ConfigError(f"jobs[{index}].name", f"duplicate job name {job.name!r}")
        names.add(job.name)
        jobs.append(job)
    config = Config(
        instance_id=instance_id,
        nats=nats,
        metrics=MetricsConfig(*metrics.get("listen", ("0.0.0.0", 9464), listen_address)),
        target=target,
        jobs=tuple(jobs),
        shutdown_grace=top.duration("shutdown_grace", 25.0),
        admin=admin,
        notify=parse_notify(data.get("notify")),
        tracing=parse_tracing(data.get("tracing")),
    )
    size = config.effective_history_size  # once, not once per job
    for index, job in enumerate(config.jobs):
        _check_windows(config, job, f"jobs[{index}]", size)
        check_fit(job, nats.ack_timeout, f"jobs[{index}]")
    return config


def _parse_nats(sec: _Section) -> NatsConfig:
    raw_servers = sec.get("servers", NatsConfig.servers, lambda value, key: value)
    if isinstance(raw_servers, str):
        raw_servers = [raw_servers]
    if not isinstance(raw_servers, list | tuple) or not raw_servers:
        raise ConfigError(sec.key("servers"), "expected a URL or a list of at least one URL")
    servers = tuple(nats_url(url, f"nats.servers[{i}]") for i, url in enumerate(raw_servers))
    auth = [name for name in _AUTH_KEYS if sec.has(name)]
    if len(auth) > 1:
        methods = "user (+ password_file), token or token_file, nkey_seed_file, creds_file"
        raise ConfigError(sec.key(auth[1]), f"choose one way to authenticate: {methods}")
    if sec.has("password_file") and not sec.has("user"):
        raise ConfigError(sec.key("password_file"), "needs nats.user")
    tls = None
    if sec.has("tls"):
        tls_sec = _Section(sec.data["tls"], "nats.tls", ("ca_file", "cert_file", "key_file"))
        tls = TLSConfig(
            *(tls_sec.text(name, None) for name in ("ca_file", "cert_file", "key_file"))
        )
        if (tls.cert_file is None) != (tls.key_file is None):
            raise ConfigError("nats.tls", "cert_file and key_file go together")
    token = sec.text("token", None)
    if token == "":
        raise ConfigError(sec.key("token"), "must not be empty")
    placement = None
    if sec.has("placement"):
        place = _Section(sec.data["placement"], "nats.placement", ("cluster", "tags"))
        raw_tags = place.get("tags", [], lambda v, k: v)
        if not isinstance(raw_tags, list) or not all(isinstance(t, str) and t for t in raw_tags):
            raise ConfigError(place.key("tags"), "expected a list of non-empty strings")
        placement = PlacementConfig(place.text("cluster", None), tuple(raw_tags))
        if placement.cluster is None and not placement.tags:
            raise ConfigError("nats.placement", "set cluster, tags or both")
    domain = sec.text("domain", None)
    if domain is not None and not BUCKET_NAME.fullmatch(domain):
        raise ConfigError(sec.key("domain"), f"letters, digits, _ and - only, got {short(domain)}")
    stream = sec.get("stream", "CRON", lambda v, k: subject_name(v, k, "the stream name", ".*>/\\"))
    bucket = sec.text("state_bucket", f"{stream}_STATE")
    if not BUCKET_NAME.fullmatch(bucket):
        raise ConfigError(
            sec.key("state_bucket"), f"letters, digits, _ and - only, got {short(bucket)}"
        )
    return NatsConfig(
        servers=servers,
        stream=stream,
        prefix=sec.get("prefix", "cron.", subject_prefix),
        duplicate_window=sec.duration("duplicate_window", 300.0, minimum_ms=100),
        history_size=sec.integer("history_size", 1000, 1, 2**63 - 1),
        replicas=sec.integer("replicas", None, 1, 5),
        user=sec.text("user", None),
        password_file=sec.text("password_file", None),
        token=token,
        token_file=sec.text("token_file", None),
        nkey_seed_file=sec.text("nkey_seed_file", None),
        creds_file=sec.text("creds_file", None),
        tls=tls,
        connect_timeout=sec.duration("connect_timeout", 5.0, minimum_ms=1),
        ack_timeout=sec.duration("ack_timeout", 2.0, minimum_ms=1),
        state_bucket=bucket,
        lease_ttl=sec.duration("lease_ttl", 30.0, minimum_ms=1000),
        domain=domain,
        placement=placement,
    )


def _parse_target(data: object) -> TargetConfig:
    sec = _Section(data, "target", tuple(TargetConfig.__dataclass_fields__))
    allow_remote = sec.get("allow_remote", False, boolean)
    return TargetConfig(
        url=sec.get("url", TargetConfig.url, lambda v, k: target_url(v, k, allow_remote)),
        timeout=sec.duration("timeout", 30.0, minimum_ms=1),
        headers=MappingProxyType(sec.get("headers", {}, headers)),
        signing_secret_file=sec.text("signing_secret_file", None),
        signing_secret_next_file=sec.text("signing_secret_next_file", None),
        signing_v1=sec.get("signing_v1", True, boolean),
        allow_remote=allow_remote,
    )


_JOB_KEYS = (
    "name",
    "schedule",
    "timezone",
    "jitter",
    "max_late",
    "history_size",
    "request",
    "catchup",
    "overlap",
    "on_lost",
    "retry",
    "spread",
    "exclude",
    "ping",
    "pause_after",
    "expect",
    "claim",
)
BUCKET_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _parse_job(sec: _Section, target: TargetConfig, defaults: _Section) -> JobConfig:
    name = sec.get("name", None, string)
    if name is None:
        raise ConfigError(sec.key("name"), "required: letters, digits, _ and - only")
    if not JOB_NAME.fullmatch(name):
        raise ConfigError(
            sec.key("name"),
            f"{short(name)} is not a job name: letters, digits, _ and - only "
            "(it is a token of the NATS subjects)",
        )
    timezone = sec.get("timezone", ZoneInfo("UTC"), zone)
    schedule = _parse_calendar(sec, name, timezone)
    req = _Section(sec.data.get("request"), sec.key("request"), _REQUEST_KEYS)
    method = req.text("method", "POST").upper()
    if method not in _METHODS:
        raise ConfigError(req.key("method"), f"expected one of {', '.join(_METHODS)}")
    path = req.text("path", f"/jobs/{name}")
    if not path.startswith("/") or CONTROL_RE.search(path) or " " in path:
        raise ConfigError(
            req.key("path"), "must start with / and contain no spaces or control chars"
        )
    # Sent and signed (v2) exactly as written: only what HTTP allows in a
    # request target as is, so nothing on the way re-encodes it.
    if not path.isascii() or "#" in path:
        raise ConfigError(
            req.key("path"),
            "ASCII only and no '#': percent-encode other characters (e.g. %C3%A4 for ä)",
        )
    request = RequestConfig(
        method=method,
        path=path,
        headers=_merge_headers(target.headers, req.get("headers", {}, headers)),
        body=req.text("body", ""),
        timeout=req.duration("timeout", target.timeout, minimum_ms=1),
        url=req.get("url", target.url, lambda v, k: target_url(v, k, target.allow_remote)),
    )
    retry = _parse_retry(_Section(sec.data.get("retry"), sec.key("retry"), ("max", "backoff")))
    on_lost = sec.get("on_lost", "record", _one_of(ON_LOST))
    if on_lost == "rerun" and retry.max < 1:
        raise ConfigError(
            sec.key("on_lost"),
            "rerun needs retry.max of at least 1 (the rerun is the next attempt)",
        )
    return JobConfig(
        name=name,
        schedule=schedule,
        timezone=timezone,
        jitter=sec.duration("jitter", 2.0),
        max_late=sec.duration("max_late", 60.0),
        history_size=sec.integer("history_size", None, 1, 2**63 - 1),
        request=request,
        catchup=sec.get("catchup", "none", _one_of(CATCHUP)),
        overlap=sec.get("overlap", "allow", _one_of(OVERLAP)),
        on_lost=on_lost,
        retry=retry,
        ping=_job_ping(sec, defaults, name),
        pause_after=parse_pause_after(sec),
        expect=parse_expect(sec.data["expect"], sec.key("expect")) if sec.has("expect") else None,
        claim=parse_claim(sec, defaults),
    )


def _parse_calendar(sec: _Section, name: str, timezone: ZoneInfo) -> Calendar:
    """``schedule`` (one expression or a list), ``spread`` and ``exclude`` of a job."""
    raw = sec.data.get("schedule")
    if raw is None:
        raise ConfigError(sec.key("schedule"), "required, e.g. '*/5 * * * *'")
    if isinstance(raw, list):
        if not raw:
            raise ConfigError(sec.key("schedule"), "expected one expression or a list of them")
        exprs = [string(v, f"{sec.key('schedule')}[{i}]") for i, v in enumerate(raw)]
        keys = [f"{sec.key('schedule')}[{i}]" for i in range(len(raw))]
    else:
        exprs = [string(raw, sec.key("schedule"))]
        keys = [sec.key("schedule")]
    for expr, key in zip(exprs, keys, strict=True):
        try:
            parse_calendar(expr, timezone)
        except ScheduleError as exc:
            raise ConfigError(key, " ".join(str(exc).split())) from exc
    spread = sec.duration("spread", 0.0)
    if 0 < spread < 1:
        raise ConfigError(sec.key("spread"), "0, or at least 1s (offsets are whole seconds)")
    excludes = sec.data.get("exclude") or []
    if not isinstance(excludes, list):
        raise ConfigError(sec.key("exclude"), "expected a list of dates and ISO 8601 intervals")
    for i, text in enumerate(excludes):
        key = f"{sec.key('exclude')}[{i}]"
        try:
            parse_calendar(exprs, timezone, exclude=[string(text, key)])
        except ValueError as exc:
            raise ConfigError(key, str(exc)) from exc
    calendar = parse_calendar(exprs, timezone, name, spread, [str(t) for t in excludes])
    if spread and spread * 1000 >= (interval := calendar.min_interval_ms()):
        # A slot moved past the next one's time would blur which slot is which.
        raise ConfigError(
            sec.key("spread"),
            f"spread ({format_duration(spread)}) must be shorter than the schedule's "
            f"shortest interval ({format_duration(interval / 1000)})",
        )
    return calendar


def _job_ping(sec: _Section, defaults: _Section, name: str) -> PingConfig | None:
    """The job's own ``ping``, else ``defaults.ping`` with ``{job}`` filled in."""
    if sec.has("ping"):
        return parse_ping(sec.data["ping"], sec.key("ping"), name)
    if defaults.has("ping"):
        return parse_ping(defaults.data["ping"], "defaults.ping", name)
    return None


def _parse_retry(sec: _Section) -> RetryConfig:
    return RetryConfig(
        max=sec.integer("max", 0, 0, MAX_RETRIES),
        backoff=sec.duration("backoff", 30.0, minimum_ms=1000),
    )


def _one_of(choices: tuple[str, ...]) -> Callable[[object, str], str]:
    def convert(value: object, key: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(key, f"expected one of {', '.join(choices)}, got {short(value)}")
        return value

    return convert


_REQUEST_KEYS = ("method", "path", "headers", "body", "timeout", "url")


def _check_windows(config: Config, job: JobConfig, path: str, size: int) -> None:
    """The two timing rules that keep a slot from running twice; `size`: the history size."""
    late = job.jitter + job.max_late
    late_ms = round(late * 1000)
    window = config.nats.duplicate_window
    if late_ms >= round(window * 1000):
        raise ConfigError(
            f"{path}.jitter",
            f"jitter ({format_duration(job.jitter)}) + max_late ({format_duration(job.max_late)})"
            f" must be shorter than nats.duplicate_window ({format_duration(window)})",
        )
    # Every attempt of a slot is a claim on the job's subject (retry).
    per_slot = 1 + job.retry.max
    if size * job.schedule.interval_floor_ms() > late_ms * per_slot:
        # Even the shortest interval any schedule can have is enough: skip
        # min_interval_ms(), which walks a year of slots (10-15 ms a job).
        return
    interval_ms = job.schedule.min_interval_ms()
    if size * interval_ms <= late_ms * per_slot:
        attempts = f" / {per_slot} claims a slot (1 + retry.max)" if per_slot > 1 else ""
        raise ConfigError(
            f"{path}.history_size" if job.history_size is not None else "nats.history_size",
            f"history_size {size} x the shortest interval {format_duration(interval_ms / 1000)}"
            f"{attempts} = {format_duration(size * interval_ms / 1000 / per_slot)} does not "
            f"cover jitter + max_late ({format_duration(late)}): after a restart JetStream "
            "rebuilds its duplicate memory only from the claims still stored, so a late "
            "instance could claim an already trimmed slot again; raise history_size",
        )


def load_config(path: str | None, env: Mapping[str, str]) -> Config:
    """Read and parse the config file: ``path``, else env ``ANARCHON_CONFIG``."""
    path = path or env.get("ANARCHON_CONFIG") or None
    if path is None:
        raise ConfigError("config", "no config file: pass -c FILE or set ANARCHON_CONFIG")
    data = read_yaml(path)
    if data is None:
        raise ConfigError("config", f"{path}: the file is empty")
    return parse_config(data, env)


def load_secrets(config: Config, env: Mapping[str, str]) -> Secrets:
    """Read the secrets the connecting commands need; a configured file wins over env.

    The password is read only with ``nats.user``, the env token only when no
    other way to authenticate is configured. Key files nats-py reads itself
    (nkey seed, creds, TLS) are checked for readability here.
    """
    nats = config.nats
    password = None
    if nats.user is not None:
        if nats.password_file is not None:
            password = read_text_file(nats.password_file, "nats.password_file")
        else:
            password = env.get("ANARCHON_NATS_PASSWORD") or None
        if password is None:
            raise ConfigError(
                "nats.password_file",
                "nats.user needs a password: set this or ANARCHON_NATS_PASSWORD",
            )
    token = nats.token
    if nats.token_file is not None:
        token = read_text_file(nats.token_file, "nats.token_file")
    elif token is None and not (nats.user or nats.nkey_seed_file or nats.creds_file):
        token = env.get("ANARCHON_NATS_TOKEN") or None
    signing: bytes | None = None
    if config.target.signing_secret_file is not None:
        signing = read_file(config.target.signing_secret_file, "target.signing_secret_file")
    elif env.get("ANARCHON_SIGNING_SECRET"):
        signing = env["ANARCHON_SIGNING_SECRET"].encode("utf-8", "surrogateescape")
    signing_next: bytes | None = None
    if config.target.signing_secret_next_file is not None:
        signing_next = read_file(
            config.target.signing_secret_next_file, "target.signing_secret_next_file"
        )
    elif env.get("ANARCHON_SIGNING_SECRET_NEXT"):
        signing_next = env["ANARCHON_SIGNING_SECRET_NEXT"].encode("utf-8", "surrogateescape")
    if signing_next is not None and signing is None:
        raise ConfigError(
            "target.signing_secret_next_file",
            "a next signing secret needs a current one: set target.signing_secret_file"
            " or ANARCHON_SIGNING_SECRET",
        )
    files = {"nats.nkey_seed_file": nats.nkey_seed_file, "nats.creds_file": nats.creds_file}
    if nats.tls is not None:
        files.update({f"nats.tls.{k}": v for k, v in vars(nats.tls).items()})
    for key, file in files.items():
        if file is not None:
            read_file(file, key)
    return Secrets(
        nats_password=password,
        nats_token=token,
        signing_secret=signing,
        signing_secret_next=signing_next,
    )
