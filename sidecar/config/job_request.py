"""A job's request and its cancel request: ``jobs[].request`` and ``jobs[].cancel``.

The target's defaults (URL, timeout, headers) under the job's own keys; the path
and the query as sent and signed; the run parameters found (docs/TRIGGER.md).
Errors name the key's path (``jobs[1].request.path``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from urllib.parse import quote

from sidecar.config import params
from sidecar.config.addresses import target_url
from sidecar.config.fields import CONTROL_RE, format_duration, headers, key_text
from sidecar.config.interning import keep
from sidecar.config.keys import ConfigSection
from sidecar.config.model import CancelConfig, RequestConfig, TargetConfig
from sidecar.core.errors import ConfigError

_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_REQUEST_KEYS = ("method", "path", "query", "headers", "body", "timeout", "url")
_CANCEL_KEYS = ("method", "path", "grace")
# jobs[].cancel.grace when unset: how long a cancelled run may take to answer.
CANCEL_GRACE = 5.0


def parse_request(sec: ConfigSection, name: str, target: TargetConfig) -> RequestConfig:
    """``jobs[].request``: the target's defaults under the job's own keys."""
    req = ConfigSection(sec.data.get("request"), sec.key("request"), _REQUEST_KEYS)
    method = _method(req.text("method", "POST"))
    if method not in _METHODS:
        raise ConfigError(req.key("method"), f"expected one of {', '.join(_METHODS)}")
    path = _request_path(req, f"/jobs/{name}")
    path = _with_query(req, path)
    own_headers = req.get("headers", {}, headers)
    merged = _merge_headers(target.headers, own_headers)
    body = req.text("body", "")
    return RequestConfig(
        method=method,
        path=path,
        headers=merged,
        body=body,
        timeout=req.duration("timeout", target.timeout, minimum_ms=1),
        url=req.get("url", target.url, lambda v, k: target_url(v, k, target.allow_remote)),
        params=_check_params(req, path, merged, own_headers, body),
    )


def _merge_headers(base: Mapping[str, str], extra: Mapping[str, str]) -> Mapping[str, str]:
    """``base`` overridden by ``extra``, header names compared case-insensitively."""
    if not extra and isinstance(base, MappingProxyType):
        return base  # the target's own: one mapping for every job that adds none
    lowered = {name.lower() for name in extra}
    merged = {name: text for name, text in base.items() if name.lower() not in lowered}
    return _shared_headers({**merged, **extra})


# Equal merged headers shared by the jobs that have them (issue 49); bounded.
_HEADERS: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}


def _shared_headers(headers: dict[str, str]) -> Mapping[str, str]:
    """A read-only `headers`, or an equal one made before (order kept: it is sent)."""
    key = tuple(headers.items())
    kept = _HEADERS.get(key)
    if kept is None:
        kept = MappingProxyType(headers)
        keep(_HEADERS, key, kept)
    return kept


def _with_query(req: ConfigSection, path: str) -> str:
    """`path` with ``request.query`` appended: names and values plain text, which
    are percent-encoded here (run parameters in a value stay, rendered per run)."""
    raw = req.data.get("query")
    if raw is None:
        return path
    if not isinstance(raw, dict):
        raise ConfigError(req.key("query"), "expected a map of query names to values")
    pairs = []
    for name, value in raw.items():
        key = f"{req.key('query')}.{key_text(name)}"
        if not isinstance(name, str) or not name or CONTROL_RE.search(name):
            raise ConfigError(key, "not a query name: a non-empty string")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ConfigError(key, "expected a string (or a number)")
        text = str(value)
        if CONTROL_RE.search(text):
            raise ConfigError(key, "must not contain control characters")
        encoded = params.query_text(text, params.parse(text, params.QUERY, key))
        pairs.append(f"{quote(name, safe='')}={encoded}")
    if not pairs:
        return path
    return path + ("&" if "?" in path else "?") + "&".join(pairs)


def _check_params(
    req: ConfigSection,
    path: str,
    merged: Mapping[str, str],
    own_headers: Mapping[str, str],
    body: str,
) -> bool:
    """Whether the request has run parameters; ConfigError naming the key of an
    unknown or malformed one (a header of ``target.headers`` by its own key)."""
    found = params.parse(path, params.PATH, req.key("path")) is not None
    for name, text in merged.items():
        key = (
            f"{req.key('headers')}.{key_text(name)}"
            if name in own_headers
            else f"target.headers.{key_text(name)}"
        )
        found = params.parse(text, params.HEADER, key) is not None or found
    return params.parse(body, params.BODY, req.key("body")) is not None or found


def parse_cancel(sec: ConfigSection, request: RequestConfig, overlap: str) -> CancelConfig:
    """``jobs[].cancel``: the request that asks the app to stop a run (``overlap: replace``)."""
    if sec.has("cancel") and overlap != "replace":
        raise ConfigError(sec.key("cancel"), "only used with overlap: replace")
    can = ConfigSection(sec.data.get("cancel"), sec.key("cancel"), _CANCEL_KEYS)
    method = _method(can.text("method", "DELETE"))
    if method not in _METHODS:
        raise ConfigError(can.key("method"), f"expected one of {', '.join(_METHODS)}")
    path = _request_path(can, request.path)
    # Rendered with the run's values as the trigger's path is (docs/TRIGGER.md).
    cancel_params = params.parse(path, params.PATH, can.key("path")) is not None
    if method == request.method and path == request.path:
        raise ConfigError(
            can.key("method"),
            f"{method} {path} is the trigger itself: give the cancel request another "
            "method or path",
        )
    grace = can.duration("grace", CANCEL_GRACE, minimum_ms=100)
    max_late = sec.duration("max_late", 60.0)
    if overlap == "replace" and grace >= max_late:
        raise ConfigError(
            can.key("grace"),
            f"{format_duration(grace)} must be shorter than max_late "
            f"({format_duration(max_late)}): the new slot waits at most max_late for the "
            "replaced run to end",
        )
    if overlap != "replace" and path == request.path:
        # Never sent (only ``replace`` cancels): "" for the request's own path, as
        # sidecar/run/overlap.py reads it, so that the jobs of equal settings share
        # one CancelConfig (``interned``, issue 49) instead of one per path.
        path = ""
    return CancelConfig(method=method, path=path, grace=grace, params=cancel_params)


def _method(text: str) -> str:
    """A request's method in capitals: one of ``_METHODS``'s own strings when it is
    one (not a new string per job), else as written for the caller's error."""
    upper = text.upper()
    for known in _METHODS:
        if upper == known:
            return known
    return upper


def _request_path(sec: ConfigSection, default: str) -> str:
    """``path`` of a request (or of its cancel): a request target as written."""
    path = sec.text("path", default)
    if not path.startswith("/") or CONTROL_RE.search(path) or " " in path:
        raise ConfigError(
            sec.key("path"), "must start with / and contain no spaces or control chars"
        )
    # Sent and signed (v2) exactly as written: only what HTTP allows in a
    # request target as is, so nothing on the way re-encodes it.
    if not path.isascii() or "#" in path:
        raise ConfigError(
            sec.key("path"),
            "ASCII only and no '#': percent-encode other characters (e.g. %C3%A4 for ä)",
        )
    return path
