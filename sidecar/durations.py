"""Single config values: durations above all, and the other scalar checks.

Every function here takes a raw YAML value and the key's path and returns the
normalised value or raises :class:`ConfigError` naming that key; none looks
at more than one value. ``sidecar.config`` puts them together.

A duration is a string with units, largest first, each at most once
(``250ms``, ``2s``, ``5m``, ``1h``, ``1m30s``, ``1.5s``), or a plain integer
meaning milliseconds. Everything else (negatives, floats without a unit,
bare numeric strings, booleans) is refused. Durations become float seconds.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from sidecar.errors import ConfigError

#: Ten years: far beyond any sensible timeout or window, and well inside
#: what JetStream's nanosecond fields and a float can hold exactly enough.
MAX_DURATION = 10 * 365 * 24 * 3600.0

_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_DURATION_RE = re.compile(
    r"(?:(?P<h>\d+(?:\.\d+)?)h)?"
    r"(?:(?P<m>\d+(?:\.\d+)?)m(?!s))?"
    r"(?:(?P<s>\d+(?:\.\d+)?)s)?"
    r"(?:(?P<ms>\d+(?:\.\d+)?)ms)?"
)
_PLAIN_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")
_EXAMPLES = "e.g. 250ms, 2s, 5m, 1h, 1m30s, or an integer in milliseconds"


def parse_duration(value: object, key: str) -> float:
    """Return ``value`` as float seconds, or raise ``ConfigError(key, ...)``."""
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a duration ({_EXAMPLES}), got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, f"must not be negative, got {value}")
        if value > MAX_DURATION * 1000:  # exact int/float comparison, no overflow
            raise ConfigError(key, f"too long: at most {format_duration(MAX_DURATION)}")
        return value / 1000
    if isinstance(value, float):
        raise ConfigError(key, "a number without a unit means milliseconds and must be whole")
    if not isinstance(value, str):
        raise ConfigError(key, f"expected a duration ({_EXAMPLES}), got {type_name(value)}")
    text = value.strip()
    match = _DURATION_RE.fullmatch(text)
    if not text or match is None:
        raise ConfigError(key, f"not a duration: {short(value)} ({_EXAMPLES})")
    seconds = sum(
        float(amount) * _UNITS[unit] for unit, amount in match.groupdict().items() if amount
    )
    if seconds > MAX_DURATION:
        raise ConfigError(key, f"too long: at most {format_duration(MAX_DURATION)}")
    return seconds


def format_duration(seconds: float) -> str:
    """Render float seconds the way the config writes them (``1m30s``, ``250ms``)."""
    total_ms = round(seconds * 1000)
    if total_ms == 0:
        return "0s"
    parts = []
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    for amount, unit in ((hours, "h"), (minutes, "m"), (secs, "s"), (millis, "ms")):
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts)


def type_name(value: object) -> str:
    """Describe a YAML value's type in the config's words ("a list", "a map", ...)."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a map"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def key_text(name: object) -> str:
    """A map key as a path part: plain names as they are, anything else quoted."""
    return name if isinstance(name, str) and _PLAIN_KEY_RE.fullmatch(name) else short(name, 40)


def short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to one short line, for echoing a bad value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: ASCII control characters, which no name, path or header value may contain.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_HOST_RE = re.compile(r"[A-Za-z0-9.-]+")
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def string(value: object, key: str) -> str:
    """A string; numbers and booleans are refused with a hint to quote them."""
    if not isinstance(value, str):
        hint = " (quote it)" if isinstance(value, int | float) else ""
        raise ConfigError(key, f"expected a string, got {type_name(value)}{hint}")
    return value


def boolean(value: object, key: str) -> bool:
    """``true`` or ``false``, nothing that merely looks like one."""
    if not isinstance(value, bool):
        raise ConfigError(key, f"expected true or false, got {type_name(value)}")
    return value


def headers(value: object, key: str) -> dict[str, str]:
    """A map of HTTP header names to string values; ``X-Anarchon-*`` is reserved."""
    if not isinstance(value, dict):
        raise ConfigError(key, f"expected a map of header names to strings, got {type_name(value)}")
    result: dict[str, str] = {}
    for name, text in value.items():
        name_key = f"{key}.{key_text(name)}"
        if not isinstance(name, str) or not _HEADER_NAME_RE.fullmatch(name):
            raise ConfigError(name_key, "not a valid header name")
        if name.lower().startswith("x-anarchon-"):
            raise ConfigError(name_key, "X-Anarchon-* headers are reserved for the sidecar")
        if CONTROL_RE.search(string(text, name_key).replace("\t", "")):
            raise ConfigError(name_key, "header values must not contain control characters")
        result[name] = text
    return result


def nats_url(value: object, key: str) -> str:
    """A ``nats://`` or ``tls://`` server URL with a host and no credentials."""
    text = string(value, key).strip()
    expected = f"expected nats://HOST:PORT or tls://HOST:PORT, got {short(text)}"
    try:
        parts = urlsplit(text)
        _ = parts.port  # raises on a port that is not a number in 0..65535
    except ValueError:
        raise ConfigError(key, expected) from None
    if parts.scheme not in ("nats", "tls") or not parts.hostname:
        raise ConfigError(key, expected)
    if parts.username is not None or parts.password is not None:
        raise ConfigError(key, "no credentials in the URL: use nats.user / nats.password_file")
    return text


def subject_name(value: object, key: str, what: str, forbidden: str) -> str:
    """A NATS name or subject token: not empty, no whitespace, none of ``forbidden``."""
    text = string(value, key)
    if not text or any(char in forbidden or char.isspace() for char in text):
        raise ConfigError(key, f"{what} must not be empty or contain whitespace or {forbidden}")
    if CONTROL_RE.search(text):
        raise ConfigError(key, f"{what} must not contain control characters")
    return text


def subject_prefix(value: object, key: str) -> str:
    """A subject prefix: valid tokens without wildcards, ending with ``.``."""
    text = string(value, key)
    if not text.endswith("."):
        raise ConfigError(key, f"must end with '.', e.g. 'cron.', got {short(text)}")
    for token in text[:-1].split("."):
        subject_name(token, key, "each subject token of the prefix", "*>")
    return text


def listen_address(value: object, key: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` as (host without brackets, port)."""
    text = string(value, key).strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            sep = ""
    else:
        host, sep, port = text.rpartition(":")
        sep = sep if _HOST_RE.fullmatch(host) else ""
    if not sep or not (port.isascii() and port.isdigit() and len(port) <= 5) or int(port) > 65535:
        raise ConfigError(
            key, f"expected HOST:PORT, e.g. 0.0.0.0:9464 or [::]:9464, got {short(text)}"
        )
    return host, int(port)


def target_url(value: object, key: str, allow_remote: bool) -> str:
    """``http://HOST:PORT`` (loopback unless ``allow_remote``) or ``unix:///path``."""
    text = string(value, key).strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ConfigError(key, f"not a valid URL: {short(text)}") from None
    if parts.scheme == "unix" and text.startswith("unix:///") and len(parts.path) > 1:
        if parts.query or parts.fragment:
            raise ConfigError(key, "a unix socket URL has no query or fragment")
        return text
    if parts.scheme != "http" or not parts.hostname:
        raise ConfigError(
            key, f"expected http://HOST:PORT or unix:///absolute/path, got {short(text)}"
        )
    if parts.username is not None or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(
            key, "give only http://HOST:PORT; paths belong in each job's request.path"
        )
    if port == 0:
        raise ConfigError(key, "port 0 is not a port the app can listen on")
    if not allow_remote and not is_loopback(parts.hostname):
        raise ConfigError(
            key,
            f"host {parts.hostname!r} is not loopback (127.0.0.0/8, ::1, localhost); "
            "set target.allow_remote: true to trigger a remote app",
        )
    return text


def is_loopback(host: str) -> bool:
    """Whether ``host`` is localhost, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def zone(value: object, key: str) -> ZoneInfo:
    """An IANA timezone name as ``ZoneInfo``."""
    name = string(value, key)
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError):
        raise ConfigError(key, f"unknown timezone {short(name)} (use an IANA name)") from None
