"""The config of what tells people about runs: pings, notifications, pause_after,
duration expectations, tracing.

``sidecar.config.load`` calls the parsers here for its sections (``defaults.ping``,
``jobs[].ping``, ``jobs[].pause_after``, ``jobs[].expect``, ``notify``,
``tracing``); they raise :class:`ConfigError` naming the key. A ping or webhook
URL carries the secret of its check or channel, so no error echoes more of it
than its scheme and host (``mask_url``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from sidecar.config.addresses import redact_url
from sidecar.config.fields import Section, boolean, short, string, type_name
from sidecar.core.errors import ConfigError

EVENTS = ("failing", "recovered", "lost", "auto_paused", "anomaly")
FORMATS = ("json", "slack")
MAX_PAUSE_AFTER = 1000
JOB_PLACEHOLDER = "{job}"


@dataclass(frozen=True)
class PingConfig:
    """``ping:``: a Healthchecks-style check's base URL (a secret) and whether to send /start."""

    url: str
    start: bool = False

    def __repr__(self) -> str:
        return f"PingConfig(url={mask_url(self.url)!r}, start={self.start})"


@dataclass(frozen=True)
class ExpectConfig:
    """``expect:``: how long a run should take; None: no bound. Seconds."""

    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class NotifyConfig:
    """One entry of ``notify:``: a webhook (its URL is a secret), its events and format."""

    url: str
    events: tuple[str, ...] = EVENTS
    format: str = "json"

    def __repr__(self) -> str:
        return f"NotifyConfig(url={mask_url(self.url)!r}, events={self.events}, {self.format})"


@dataclass(frozen=True)
class TracingConfig:
    """``tracing:``: where the run spans go over OTLP/HTTP (needs the ``otel`` extra)."""

    otlp_endpoint: str | None = None
    service_name: str = "anarchon-sidecar"
    timeout: float = 10.0


def mask_url(url: str) -> str:
    """``https://hc-ping.com/***``: scheme and host only; the path, query and any
    userinfo carry the check's or channel's key."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<a URL>/***"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme or '?'}://{host}{port}/***"


def http_url(value: object, key: str) -> str:
    """An ``http://`` or ``https://`` URL with a host; errors show it masked."""
    text = string(value, key).strip()
    try:
        parts = urlsplit(text)
        _ = parts.port
    except ValueError:
        raise ConfigError(key, f"not a valid URL: {mask_url(text)}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(key, f"expected an http:// or https:// URL, got {mask_url(text)}")
    if parts.fragment:
        raise ConfigError(key, "a URL with a #fragment cannot be sent")
    if any(c.isspace() or ord(c) < 32 for c in text):
        raise ConfigError(key, "no spaces or control characters in the URL")
    return text


def parse_ping(data: object, path: str, job: str | None) -> PingConfig:
    """``ping: {url, start}``; ``{job}`` in the URL becomes `job` (None: defaults)."""
    if isinstance(data, str):
        data = {"url": data}
    sec = Section(data, path, ("url", "start"))
    raw = sec.get("url", None, string)
    if raw is None:
        raise ConfigError(sec.key("url"), "required: the check's ping URL")
    url = http_url(raw if job is None else raw.replace(JOB_PLACEHOLDER, job), sec.key("url"))
    return PingConfig(url=url.rstrip("/"), start=sec.get("start", False, boolean))


def parse_expect(data: object, path: str) -> ExpectConfig:
    sec = Section(data, path, ("min", "max"))
    low = sec.duration("min", -1.0) if sec.has("min") else None
    high = sec.duration("max", -1.0, minimum_ms=1) if sec.has("max") else None
    if low is None and high is None:
        raise ConfigError(path, "set min, max or both (e.g. {min: 5m, max: 30m})")
    if low is not None and high is not None and low >= high:
        raise ConfigError(sec.key("max"), "must be longer than min")
    return ExpectConfig(low, high)


def parse_notify(data: object) -> tuple[NotifyConfig, ...]:
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ConfigError("notify", f"expected a list of webhooks, got {type_name(data)}")
    out = []
    for index, raw in enumerate(data):
        path = f"notify[{index}]"
        sec = Section(raw, path, ("url", "events", "format"))
        url = sec.get("url", None, http_url)
        if url is None:
            raise ConfigError(sec.key("url"), "required: the webhook URL")
        events = sec.get("events", list(EVENTS), lambda v, k: v)
        if not isinstance(events, list) or not events:
            raise ConfigError(sec.key("events"), f"expected a list of: {', '.join(EVENTS)}")
        for i, event in enumerate(events):
            if event not in EVENTS:
                raise ConfigError(
                    f"{sec.key('events')}[{i}]",
                    f"expected one of {', '.join(EVENTS)}, got {short(event)}",
                )
        fmt = sec.text("format", "json")
        if fmt not in FORMATS:
            raise ConfigError(sec.key("format"), f"expected one of {', '.join(FORMATS)}")
        out.append(NotifyConfig(url, tuple(dict.fromkeys(events)), fmt))
    return tuple(out)


def parse_tracing(data: object) -> TracingConfig:
    sec = Section(data, "tracing", ("otlp_endpoint", "service_name", "timeout"))
    endpoint = sec.get("otlp_endpoint", None, http_url)
    return TracingConfig(
        otlp_endpoint=endpoint,
        service_name=sec.text("service_name", "anarchon-sidecar"),
        timeout=sec.duration("timeout", 10.0, minimum_ms=1),
    )


def parse_pause_after(sec: Section) -> int | None:
    return sec.integer("pause_after", None, 1, MAX_PAUSE_AFTER)


def describe_job(
    ping: PingConfig | None, pause_after: int | None, expect: ExpectConfig | None
) -> str:
    """``check``'s line of a job's ping, pause_after and expect; "" when none is set."""
    from sidecar.config.fields import format_duration

    parts = []
    if ping is not None:
        parts.append(f"ping {mask_url(ping.url)}" + (" (with /start)" if ping.start else ""))
    if pause_after is not None:
        parts.append(f"pause after {pause_after} failures in a row")
    if expect is not None:
        low = format_duration(expect.min) if expect.min is not None else "0s"
        high = format_duration(expect.max) if expect.max is not None else "any"
        parts.append(f"expect {low} to {high}")
    return "  " + ", ".join(parts) if parts else ""


def describe_notify(notify: tuple[NotifyConfig, ...], tracing: TracingConfig) -> list[str]:
    """``check``'s lines of the webhooks and the trace export, URLs masked."""
    lines = [f"notify {mask_url(n.url)} ({n.format}): {', '.join(n.events)}" for n in notify]
    if tracing.otlp_endpoint is not None:
        where = redact_url(tracing.otlp_endpoint)
        lines.append(f"spans to {where} (OTLP/HTTP, needs the otel extra)")
    return lines
