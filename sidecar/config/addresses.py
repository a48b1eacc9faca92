"""Addresses in the config: NATS server URLs and subjects, the app's URL, a listen
address, and how a URL with credentials is shown (``redact_url``: in every
message, log line and output). Each check takes a raw YAML value and its key's
path and returns the normalised value or raises :class:`ConfigError` naming that
key (sidecar/config/fields.py: the same for other single values).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from urllib.parse import urlsplit

from sidecar.config.fields import CONTROL_RE, short, string
from sidecar.core.errors import ConfigError

_HOST_RE = re.compile(r"[A-Za-z0-9.-]+")
#: What a URL's password (or a userinfo that is all token) reads as when echoed.
MASK = "***"
_PLAIN_USER_RE = re.compile(r"[A-Za-z0-9._~-]+")


def redact_url(url: str) -> str:
    """``url`` with its credentials masked, for every message, log line and output.

    ``nats://admin:pw@host`` reads ``nats://admin:***@host``; a userinfo
    without a password (``nats://tok@host``, a token to nats-py) reads
    ``nats://***@host``. Made for malformed URLs too (they are what config
    errors echo): everything up to the last ``@`` counts as userinfo, so a
    password holding ``/``, ``:`` or ``@`` is masked whole, at the price of
    masking too much of an odd URL rather than too little.
    """
    head, sep, rest = url.partition("//")
    if not sep or "@" in head:  # no authority marker: the userinfo starts the text
        head, sep, rest = "", "", url
    if "@" not in rest or (head.lower() == "unix:" and rest.startswith("/")):
        return url  # unix:///run/a@b.sock has no authority, only a path
    userinfo, _, host = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:{MASK}" if colon and _PLAIN_USER_RE.fullmatch(user) else MASK
    return f"{head}{sep}{shown}@{host}"


def nats_url(value: object, key: str) -> str:
    """A ``nats://`` or ``tls://`` server URL with a host and no credentials."""
    text = string(value, key).strip()
    expected = f"expected nats://HOST:PORT or tls://HOST:PORT, got {short(redact_url(text))}"
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
    port_alone = str(value).strip().lstrip(":")
    if not isinstance(value, bool) and port_alone.isascii() and port_alone.isdigit():
        # Which interfaces to serve on is a choice to make, not to guess.
        raise ConfigError(
            key,
            f"a port alone is not enough: write HOST:PORT, e.g. 0.0.0.0:{port_alone} "
            f"(every interface) or 127.0.0.1:{port_alone} (this host only)",
        )
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
        raise ConfigError(key, f"not a valid URL: {short(redact_url(text))}") from None
    if parts.scheme == "unix" and text.startswith("unix:///") and len(parts.path) > 1:
        if parts.query or parts.fragment:
            raise ConfigError(key, "a unix socket URL has no query or fragment")
        return text
    if parts.scheme != "http" or not parts.hostname:
        raise ConfigError(
            key,
            f"expected http://HOST:PORT or unix:///absolute/path, got {short(redact_url(text))}",
        )
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            key, "no credentials in the URL: give only http://HOST:PORT, headers in target.headers"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
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


def is_remote(url: str) -> bool:
    """Whether a (valid) ``target.url`` names a host that is not loopback."""
    return not url.startswith("unix:") and not is_loopback(urlsplit(url).hostname or "")


@functools.lru_cache(maxsize=64)  # every job of a config names the same few hosts
def is_loopback(host: str) -> bool:
    """Whether ``host`` is localhost, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
