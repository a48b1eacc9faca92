"""Run parameters: ``{slot}``, ``{run_id}``... in a job's request, parsed once, rendered per run.

A placeholder is ``{name}`` with a name of :data:`PLACEHOLDERS`; it may stand
in ``request.path`` (its query too), a value of ``request.query`` or
``request.headers``, and ``request.body`` (docs/TRIGGER.md, "Run parameters"). ``{{name}}`` is the
literal text ``{name}``; every other brace is sent as written, so a JSON body
needs no escaping. Something that looks like a placeholder but is not one
(``{sloot}``, ``{ slot }``, ``{slot:%Y}``) is a config error naming the key.

Each value is escaped for where it stands (:data:`PATH`, :data:`QUERY`,
:data:`HEADER`, :data:`JSON_STRING`, :data:`JSON_VALUE`, :data:`TEXT`), and
that is decided when the text is parsed, so rendering is a join of parts. The
parse is cached by (text, where): config load parses (and so checks) every
text, and a request changed on its way (the cancel request of
sidecar/run/stoprequests.py, a kept run's extra header) finds its parts there.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING
from urllib.parse import quote

from sidecar.core.errors import ConfigError

if TYPE_CHECKING:
    from sidecar.config.model import RequestConfig

# The placeholders, each with what it carries (the same values and formats as
# the X-Anarchon-* headers of docs/TRIGGER.md).
PLACEHOLDERS: Mapping[str, str] = {
    "scheduled_at": "the slot, RFC 3339 UTC with milliseconds (X-Anarchon-Scheduled-At)",
    "slot": "the slot, UTC epoch milliseconds (X-Anarchon-Slot)",
    "run_id": "the run id, the claim's token (X-Anarchon-Run-Id)",
    "attempt": "the attempt, 1, 2... (X-Anarchon-Attempt)",
    "trigger": "why it was sent (X-Anarchon-Trigger; manual where that is not sent)",
    "job": "the job name (X-Anarchon-Job)",
    "instance": "the instance_id of the sidecar sending it (X-Anarchon-Instance)",
}
# The placeholders whose value is a number: bare in a JSON body, not quoted.
NUMBERS = frozenset({"slot", "attempt"})

# Where a text stands; a placeholder's own place in a body refines TEXT/JSON.
PATH = "path"  # request.path before '?': one path segment
QUERY = "query"  # request.path after '?': a query value
HEADER = "header"  # a header's value
BODY = "body"  # request.body: JSON when it parses as JSON, else TEXT
JSON_STRING = "json-string"  # inside a JSON string of a JSON body
JSON_VALUE = "json-value"  # where a JSON value stands in a JSON body
TEXT = "text"  # a body that is not JSON: the value as it is

# ``{{name}}`` (the literal ``{name}``), ``{name}``, or something meant as one.
_TOKEN = re.compile(
    r"\{\{(?P<lit>[A-Za-z_]\w*)\}\}"
    r"|\{(?P<name>[A-Za-z_]\w*)\}"
    r"|(?P<bad>\{\s*[A-Za-z_]\w*\s*(?:[:!.\[][^{}\s\"]*)?\})"
)
# Control characters, which a header value must not gain (CR and LF above all).
_CTL = re.compile(r"[\x00-\x1f\x7f]")
_KNOWN = ", ".join(f"{{{name}}}" for name in PLACEHOLDERS)


@dataclass(frozen=True)
class Template:
    """A text split into literal parts and placeholders, each with its escaping.

    ``parts``: a literal string, or a (name, escaping) pair.
    """

    parts: tuple[str | tuple[str, str], ...]

    def render(self, values: Mapping[str, str]) -> str:
        """The text with every placeholder replaced by its value, escaped for its place."""
        return "".join(
            part if isinstance(part, str) else escape(values[part[0]], part[0], part[1])
            for part in self.parts
        )


def escape(value: str, name: str, where: str) -> str:
    """`value` (of the placeholder `name`) as it is written where it stands."""
    if where in (PATH, QUERY):
        # A path segment or a query value: '/', '?', '&', '=', '+', '#', '%'
        # and spaces encoded; ':' and '@' are allowed in both (RFC 3986).
        return quote(value, safe=":@")
    if where == HEADER:
        return _CTL.sub(lambda m: f"%{ord(m.group()):02X}", value)
    if where == JSON_STRING:
        return json.dumps(value)[1:-1]
    if where == JSON_VALUE:
        return value if name in NUMBERS else json.dumps(value)
    return value


def query_text(text: str, template: Template | None) -> str:
    """A value of ``request.query`` as it goes into the path: its text percent-encoded
    as a query value, its placeholders kept for rendering (they are escaped then)."""
    if template is None:
        return quote(text, safe=":@")
    return "".join(
        quote(part, safe=":@") if isinstance(part, str) else f"{{{part[0]}}}"
        for part in template.parts
    )


def parse(text: str, where: str, key: str) -> Template | None:
    """The template of `text` standing `where`; None when it has no placeholder.

    ConfigError(key) for an unknown placeholder or a malformed one.
    """
    if "{" not in text:
        return None  # the common case, without a regex
    try:
        return _parse(text, where)
    except ValueError as exc:
        raise ConfigError(key, str(exc)) from None


def cached(text: str, where: str) -> Template | None:
    """`parse` without a key, for rendering: the texts were checked at config load."""
    if "{" not in text:
        return None
    return _parse(text, where)


@functools.lru_cache(maxsize=1024)
def _parse(text: str, where: str) -> Template | None:
    spans: list[tuple[int, int, str | None, str]] = []  # start, end, name, literal
    for match in _TOKEN.finditer(text):
        if match.group("bad") is not None:
            raise ValueError(
                f"malformed placeholder {match.group()}: write {{name}} without spaces or "
                f"a format (known: {_KNOWN}; {{{{name}}}} for the text {{name}})"
            )
        if (lit := match.group("lit")) is not None:
            spans.append((match.start(), match.end(), None, f"{{{lit}}}"))
            continue
        name = match.group("name")
        if name not in PLACEHOLDERS:
            raise ValueError(
                f"unknown placeholder {{{name}}}; known: {_KNOWN} "
                f"({{{{{name}}}}} for the text {{{name}}})"
            )
        spans.append((match.start(), match.end(), name, ""))
    if not spans:
        return None
    places = _places(text, spans, where)
    parts: list[str | tuple[str, str]] = []
    at = 0
    for (start, end, name, literal), place in zip(spans, places, strict=True):
        parts.append(text[at:start])
        parts.append(literal if name is None else (name, place))
        at = end
    parts.append(text[at:])
    # Adjacent literals joined, empty ones dropped: rendering is one pass over few parts.
    merged: list[str | tuple[str, str]] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        elif part != "":
            merged.append(part)
    return Template(tuple(merged))


def _places(text: str, spans: list[tuple[int, int, str | None, str]], where: str) -> list[str]:
    """The escaping of each span: by `where`, and for a body by its place in the JSON."""
    if where == PATH:
        query_at = text.find("?")
        return [QUERY if 0 <= query_at < start else PATH for start, *_ in spans]
    if where != BODY:
        return [where] * len(spans)
    inside = _in_json_string(text, [start for start, *_ in spans])
    places = [JSON_STRING if flag else JSON_VALUE for flag in inside]
    # JSON only when the body is JSON with its placeholders in: an example of each.
    example, at = [], 0
    for (start, end, name, literal), place in zip(spans, places, strict=True):
        example.append(text[at:start])
        if name is None:
            example.append(literal)
        else:
            example.append(escape("1" if name in NUMBERS else "x", name, place))
        at = end
    example.append(text[at:])
    try:
        json.loads("".join(example))
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json parses
        return [TEXT] * len(spans)
    return places


def _in_json_string(text: str, starts: list[int]) -> list[bool]:
    """For each offset in `starts` (ascending), whether it lies inside a JSON string."""
    result: list[bool] = []
    inside = escaped = False
    wanted = iter(starts)
    nxt = next(wanted, None)
    for i, char in enumerate(text):
        while nxt is not None and nxt == i:
            result.append(inside)
            nxt = next(wanted, None)
        if nxt is None:
            break
        if escaped:
            escaped = False
        elif inside and char == "\\":
            escaped = True
        elif char == '"':
            inside = not inside
    return result


def values(
    job: str, slot: int, run_id: str, attempt: int, trigger: str | None, instance: str, at: str
) -> dict[str, str]:
    """The placeholders' values of one request; `at`: the slot as RFC 3339 (the header's)."""
    return {
        "scheduled_at": at,
        "slot": str(slot),
        "run_id": run_id,
        "attempt": str(attempt),
        "trigger": trigger or "manual",
        "job": job,
        "instance": instance,
    }


def render_request(req: RequestConfig, run: Mapping[str, str]) -> RequestConfig:
    """`req` with its path, header values and body rendered with `run`'s values (the
    request as sent and signed); ``params`` off, so nothing renders it again."""
    path = cached(req.path, PATH)
    body = cached(req.body, BODY)
    headers = {}
    for name, text in req.headers.items():
        template = cached(text, HEADER)
        headers[name] = text if template is None else template.render(run)
    return dataclasses.replace(
        req,
        path=req.path if path is None else path.render(run),
        headers=MappingProxyType(headers),
        body=req.body if body is None else body.render(run),
        params=False,
    )
