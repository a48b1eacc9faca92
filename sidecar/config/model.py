"""What a valid config is: the frozen dataclasses ``parse_config`` builds.

Every section of docs/CONFIG.md has its dataclass here, with units already
normalised (durations float seconds, timezones ``ZoneInfo``, schedules
:class:`Calendar`), and :class:`Secrets`, the values ``load_secrets`` reads.
No parsing here: the rules live in ``sidecar.config.load`` (top level, ``nats``,
``target``) and ``sidecar.config.job_entry`` (``jobs:``). Import these names from
``sidecar.config.load``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from sidecar.config.alerting import ExpectConfig, NotifyConfig, PingConfig, TracingConfig
from sidecar.config.bucketrules import BucketJobsConfig
from sidecar.core.errors import ConfigError
from sidecar.core.excerpt import DEFAULT_ANSWER_BYTES
from sidecar.when.slots import Calendar

if TYPE_CHECKING:  # loaded by the first ``calendars:`` entry (sidecar/config/calendars.py)
    from sidecar.when.shared import SharedCalendar


def _no_headers() -> Mapping[str, str]:
    return MappingProxyType({})


# ``claim``: at most this many candidates; the others claim after the fallback (s).
MAX_CANDIDATES = 1000
DEFAULT_FALLBACK = 1.0


@dataclass(frozen=True, slots=True)
class ClaimConfig:
    """``jobs[].claim`` (or ``defaults.claim``): who claims a slot at its time. Seconds."""

    candidates: int = 0  # 0: every live instance claims (the reference's behaviour)
    fallback: float = DEFAULT_FALLBACK  # after jitter: the others claim unless the run was seen


def _no_defaults() -> Mapping[str, Any]:
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
    """``metrics.listen`` split into host (IPv6 without brackets) and port, and the
    globs of the jobs whose histograms have series of their own (docs/METRICS.md)."""

    host: str = "0.0.0.0"
    port: int = 9464
    per_job_histograms: tuple[str, ...] = ()


@dataclass(frozen=True)
class AdminConfig:
    """``admin:``: the fleet page on the admin port, and who may act through it."""

    page: bool = True  # GET /, /jobs/<job> and /api/v1/... beside /metrics
    token_file: str | None = None  # without it the page is read-only (every POST 403)


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


DEFAULT_URL = "http://127.0.0.1:8080"


class _Addressed:
    """``unix_socket`` and ``base_url`` of a config that has a ``url``."""

    __slots__ = ()  # its subclasses may have slots (a job's request: issue 49)
    url: str

    @property
    def unix_socket(self) -> str | None:
        """The socket path when ``url`` is ``unix:///path``, else None."""
        return unix_socket_of(self.url)

    @property
    def base_url(self) -> str:
        """``http://host:port`` for TCP, ``http://localhost`` for a unix socket."""
        return base_url_of(self.url)


@dataclass(frozen=True)
class TargetConfig(_Addressed):
    """``target:``: the app every job's request goes to, and request defaults."""

    url: str = DEFAULT_URL
    timeout: float = 30.0
    # Not in repr: a header may carry the app's credentials (Authorization).
    headers: Mapping[str, str] = field(default_factory=_no_headers, hash=False, repr=False)
    signing_secret_file: str | None = None
    signing_secret_next_file: str | None = None
    signing_v1: bool = True
    allow_remote: bool = False
    # At most this many trigger requests in flight at once from this sidecar to
    # its app (a burst of due jobs waits its turn, up to slot + max_late).
    max_in_flight: int = 256


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestConfig(_Addressed):
    """One job's trigger request, with the target's defaults already applied."""

    method: str = "POST"
    path: str
    # Not in repr: a header may carry the app's credentials (Authorization).
    headers: Mapping[str, str] = field(default_factory=_no_headers, hash=False, repr=False)
    body: str = ""
    timeout: float = 30.0
    url: str = DEFAULT_URL  # the job's own ``request.url``, else ``target.url``
    # Whether path, a header or body has a run parameter (sidecar/config/params.py):
    # a request without one is sent as written, never rendered.
    params: bool = False


@dataclass(frozen=True, slots=True)
class AnswerConfig:
    """``jobs[].answer``: what a result keeps of the app's answer (docs/TRIGGER.md)."""

    size: int = DEFAULT_ANSWER_BYTES  # answer.bytes; 0: nothing; at most MAX_ANSWER_BYTES
    # Request headers (lower case) whose values are redacted from the answer;
    # None: every header the request sends from the config.
    redact: tuple[str, ...] | None = None

    def secrets(self, headers: Mapping[str, str]) -> list[str]:
        """The values of `headers` (the request as sent) to redact from the answer."""
        if self.redact is None:
            return list(headers.values())
        return [value for name, value in headers.items() if name.lower() in self.redact]


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """``jobs[].retry``: extra attempts after a failed (or lost) one. Seconds."""

    max: int = 0
    backoff: float = 30.0


@dataclass(frozen=True, slots=True)
class CancelConfig:
    """``jobs[].cancel``: how the app is asked to stop a run that ``overlap: replace``
    replaces (docs/TRIGGER.md). `grace`: seconds its run has to answer after it."""

    method: str = "DELETE"
    path: str = ""  # "": the job's request path
    grace: float = 5.0
    params: bool = False  # whether path has a run parameter (sidecar/config/params.py)


@dataclass(frozen=True, slots=True)
class ConcurrencyConfig:
    """``jobs[].concurrency``: at most `limit` runs of every job with this `key` alive
    at once, fleet-wide (sidecar/run/concurrency.py, docs/CONFIG.md)."""

    key: str
    limit: int


@dataclass(frozen=True, slots=True)
class AfterConfig:
    """``jobs[].after``: the job runs once after each run of `job` that ended `on`
    (success, failure or always; docs/CONFIG.md, sidecar/run/chains.py)."""

    job: str
    on: str = "success"

    def words(self) -> str:
        """How ``check``, ``status`` and the page say it: ``after A on success``."""
        return f"after {self.job} on {self.on}"


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    """One entry of ``jobs:``. Durations in seconds."""

    name: str
    schedule: Calendar  # one expression or several, spread and exclusions applied
    timezone: ZoneInfo
    jitter: float = 2.0
    max_late: float = 60.0
    history_size: int | None = None
    request: RequestConfig
    catchup: str = "none"  # none, latest or all (docs/GUARANTEES.md, catch-up)
    overlap: str = "allow"  # skip, replace, buffer_one: sidecar/run/overlap.py
    cancel: CancelConfig = field(default_factory=CancelConfig)  # overlap: replace
    on_lost: str = "record"  # or rerun: a lost run's next attempt is due at once
    retry: RetryConfig = field(default_factory=RetryConfig)
    ping: PingConfig | None = None  # Healthchecks-style pings by the runner
    pause_after: int | None = None  # consecutive failed or lost runs, fleet-wide
    expect: ExpectConfig | None = None  # duration expectations (anomalies)
    claim: ClaimConfig = field(
        default_factory=ClaimConfig
    )  # candidates (sidecar/fleet/candidates.py)
    # At most this many slots run, fleet-wide (a counter in the state bucket:
    # sidecar/run/runcap.py); None: no cap.
    max_runs: int | None = None
    # A limit shared with other jobs (slot keys conc.<key>.<n>); None: no limit.
    concurrency: ConcurrencyConfig | None = None
    # ``one``: once per slot for the fleet; ``every``: once per slot on every live
    # instance, each triggering its own app (docs/GUARANTEES.md).
    run_on: str = "one"
    answer: AnswerConfig = field(default_factory=AnswerConfig)
    # Runs after another job's runs instead of on a schedule (``schedule`` is then
    # a calendar with no slot: sidecar/config/job_entry.py ``NO_SLOTS``); None: scheduled.
    after: AfterConfig | None = None


def _no_calendars() -> Mapping[str, SharedCalendar]:
    return MappingProxyType({})


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
    bucket_jobs: BucketJobsConfig = field(default_factory=BucketJobsConfig)
    # ``defaults:`` as written: a job of the state bucket is parsed with it, as the
    # file's jobs were (sidecar/admin/bucket_jobs.py).
    defaults: Mapping[str, Any] = field(
        default_factory=_no_defaults, compare=False, hash=False, repr=False
    )
    # ``calendars:`` (sidecar/config/calendars.py): a job of the state bucket names
    # them as the file's jobs do.
    calendars: Mapping[str, SharedCalendar] = field(
        default_factory=_no_calendars, compare=False, hash=False, repr=False
    )

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
