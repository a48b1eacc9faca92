"""The config of docs/CONFIG.md, parsed once into frozen dataclasses.

``load_config`` reads the YAML file, ``parse_config`` applies the env
overrides and checks every rule, raising :class:`ConfigError` with the key's
path (``jobs[1].jitter``). Units are normalised here: durations are float
seconds, timezones ``ZoneInfo``, schedules :class:`Calendar`. Secrets are not
read here but by ``load_secrets``, which only the commands that connect call,
so that ``check`` works where the secret files are absent.

This module is the config's front: the top level with its sections (one
parser each: ``nats``, ``metrics``, ``admin``, ``target``, ``defaults``),
the env overrides and the secrets. The dataclasses are in
``sidecar.config.model``, a ``jobs:`` entry is read by ``sidecar.config.job_entry``
and the notify/ping/tracing sections by ``sidecar.config.alerting``; every
public name is importable from here.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from sidecar.config.addresses import (
    listen_address,
    nats_url,
    subject_name,
    subject_prefix,
    target_url,
)
from sidecar.config.alerting import parse_notify, parse_tracing
from sidecar.config.bucketrules import parse_bucket_jobs
from sidecar.config.calendars import parse_calendars
from sidecar.config.fields import boolean, headers, read_file, read_text_file, short, type_name
from sidecar.config.job_entry import (
    CATCHUP,
    JOB_KEYS,
    MAX_RETRIES,
    ON_LOST,
    OVERLAP,
    parse_claim,
    parse_job,
)
from sidecar.config.job_rules import check_chains, check_concurrency, check_fit, check_windows
from sidecar.config.keys import BUCKET_NAME, INSTANCE_ID, JOB_NAME, ConfigSection
from sidecar.config.model import (
    AdminConfig,
    Config,
    JobConfig,
    MetricsConfig,
    NatsConfig,
    PlacementConfig,
    RequestConfig,
    RetryConfig,
    Secrets,
    TargetConfig,
    TLSConfig,
    base_url_of,
    unix_socket_of,
)
from sidecar.config.yamlfile import read_yaml
from sidecar.core.errors import ConfigError

__all__ = [
    "BUCKET_NAME",
    "CATCHUP",
    "INSTANCE_ID",
    "JOB_NAME",
    "MAX_RETRIES",
    "ON_LOST",
    "OVERLAP",
    "AdminConfig",
    "Config",
    "ConfigError",
    "JobConfig",
    "MetricsConfig",
    "NatsConfig",
    "PlacementConfig",
    "RequestConfig",
    "RetryConfig",
    "Secrets",
    "TLSConfig",
    "TargetConfig",
    "base_url_of",
    "load_config",
    "load_secrets",
    "parse_config",
    "unix_socket_of",
]

_AUTH_KEYS = ("user", "token", "token_file", "nkey_seed_file", "creds_file")


def parse_config(data: object, env: Mapping[str, str], base_dir: str | None = None) -> Config:
    """Validate the loaded YAML ``data`` with the env overrides into a Config;
    `base_dir`: where relative calendar files are (the config file's directory)."""
    if data is None:
        raise ConfigError("config", "the config is empty")
    if not isinstance(data, dict):
        raise ConfigError("config", f"expected a map of keys at the top, got {type_name(data)}")
    data, sources = _apply_env(data, env)
    try:
        return _parse(data, base_dir)
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
    "bucket_jobs",
    "calendars",
)


def _parse(data: dict[Any, Any], base_dir: str | None) -> Config:
    top = ConfigSection(data, "", _TOP_KEYS)
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
    nats = _parse_nats(
        ConfigSection(data.get("nats"), "nats", tuple(NatsConfig.__dataclass_fields__))
    )
    metrics = ConfigSection(data.get("metrics"), "metrics", ("listen", "per_job_histograms"))
    admin_sec = ConfigSection(data.get("admin"), "admin", ("page", "token_file"))
    admin = AdminConfig(
        page=admin_sec.get("page", True, boolean), token_file=admin_sec.text("token_file", None)
    )
    if admin.token_file == "":
        raise ConfigError(
            "admin.token_file", "must not be empty (leave it out for a read-only page)"
        )
    target = _parse_target(data.get("target"))
    defaults = ConfigSection(data.get("defaults"), "defaults", ("ping", "claim"))
    raw_jobs = data.get("jobs")
    if not isinstance(raw_jobs, list) or not raw_jobs:
        got = "none" if raw_jobs is None else type_name(raw_jobs)
        raise ConfigError("jobs", f"expected a list of at least one job, got {got}")
    jobs: list[JobConfig] = []
    names: set[str] = set()  # a set: comparing with every earlier job took 0.14 s at 1,000
    claim = parse_claim(defaults)
    calendars = parse_calendars(data.get("calendars"), base_dir)
    for index, raw in enumerate(raw_jobs):
        sec = ConfigSection(raw, f"jobs[{index}]", JOB_KEYS)
        job = parse_job(sec, target, defaults, claim, calendars)
        if job.name in names:
            raise ConfigError(f"jobs[{index}].name", f"duplicate job name {job.name!r}")
        names.add(job.name)
        jobs.append(job)
    check_chains(jobs)
    config = Config(
        instance_id=instance_id,
        nats=nats,
        metrics=MetricsConfig(
            *metrics.get("listen", ("0.0.0.0", 9464), listen_address),
            per_job_histograms=metrics.get("per_job_histograms", (), job_globs),
        ),
        target=target,
        jobs=tuple(jobs),
        shutdown_grace=top.duration("shutdown_grace", 25.0),
        admin=admin,
        notify=parse_notify(data.get("notify")),
        tracing=parse_tracing(data.get("tracing")),
        bucket_jobs=parse_bucket_jobs(data.get("bucket_jobs")),
        defaults=MappingProxyType(dict(defaults.data)),
        calendars=calendars,
    )
    check_concurrency(config.jobs)
    size = config.effective_history_size  # once, not once per job
    for index, job in enumerate(config.jobs):
        check_windows(config, job, f"jobs[{index}]", size)
        check_fit(job, nats.ack_timeout, f"jobs[{index}]")
    return config


# A glob of job names: a job name's characters and fnmatch's * ? [ ] !
JOB_GLOB = re.compile(r"[A-Za-z0-9_*?\[\]!-]+")
MAX_JOB_GLOBS = 100  # each is matched at a job's first observation of each histogram


def job_globs(value: object, key: str) -> tuple[str, ...]:
    """``metrics.per_job_histograms``: a list of job name globs (``nightly-*``)."""
    if not isinstance(value, list) or len(value) > MAX_JOB_GLOBS:
        raise ConfigError(
            key,
            f"expected a list of at most {MAX_JOB_GLOBS} job names or globs "
            f"(e.g. [nightly-*, billing]), got {short(value)}",
        )
    for index, glob in enumerate(value):
        if not isinstance(glob, str) or not JOB_GLOB.fullmatch(glob):
            raise ConfigError(
                f"{key}[{index}]",
                f"{short(glob)} is not a job name or glob: letters, digits, _ and -, "
                "with * ? [...] to match several",
            )
    return tuple(value)


def _parse_nats(sec: ConfigSection) -> NatsConfig:
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
        tls_sec = ConfigSection(sec.data["tls"], "nats.tls", ("ca_file", "cert_file", "key_file"))
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
        place = ConfigSection(sec.data["placement"], "nats.placement", ("cluster", "tags"))
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
    sec = ConfigSection(data, "target", tuple(TargetConfig.__dataclass_fields__))
    allow_remote = sec.get("allow_remote", False, boolean)
    return TargetConfig(
        url=sec.get("url", TargetConfig.url, lambda v, k: target_url(v, k, allow_remote)),
        timeout=sec.duration("timeout", 30.0, minimum_ms=1),
        headers=MappingProxyType(sec.get("headers", {}, headers)),
        signing_secret_file=sec.text("signing_secret_file", None),
        signing_secret_next_file=sec.text("signing_secret_next_file", None),
        signing_v1=sec.get("signing_v1", True, boolean),
        allow_remote=allow_remote,
        max_in_flight=sec.integer("max_in_flight", 256, 1, MAX_IN_FLIGHT),
    )


# target.max_in_flight at most: connections one process may hold open at once.
MAX_IN_FLIGHT = 10_000


def load_config(path: str | None, env: Mapping[str, str]) -> Config:
    """Read and parse the config file: ``path``, else env ``ANARCHON_CONFIG``."""
    path = path or env.get("ANARCHON_CONFIG") or None
    if path is None:
        raise ConfigError("config", "no config file: pass -c FILE or set ANARCHON_CONFIG")
    data = read_yaml(path)
    if data is None:
        raise ConfigError("config", f"{path}: the file is empty")
    return parse_config(data, env, os.path.dirname(os.path.abspath(path)))


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
