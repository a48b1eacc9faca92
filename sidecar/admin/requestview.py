"""A job's request as ``status --json`` and the page show it: the template, not secrets.

The config's request may carry the app's credentials (an ``Authorization``
header, a token in the query or the body: SECURITY.md), and ``status --json``
is read by people who may not read the config. So what is shown is the
request's shape and its run parameters (docs/TRIGGER.md, "Run parameters"),
never a value that could be a secret:

- the URL with its credentials redacted (``redact_url``), the method;
- the path, each query value shown only when it is nothing but placeholders
  (``slot={slot}``), else ``[redacted]``;
- each header by name; its value only when it has a placeholder, the job's
  ``answer.redact`` lists the headers to redact (none given means all are) and
  does not name it, and its name does not look like a credential;
- the body never: only the placeholders it has.

Also the calendar (or ``exclude`` entry) that keeps the job's next slot from
running, when it does.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl

from sidecar.config import params
from sidecar.config.addresses import redact_url
from sidecar.config.load import JobConfig
from sidecar.core.clock import rfc3339

REDACTED = "[redacted]"
# Header names that carry credentials whatever answer.redact says.
_CREDENTIAL = re.compile(r"auth|cookie|token|secret|key|passw|session|signature", re.I)


def _names(template: params.Template | None) -> list[str]:
    if template is None:
        return []
    return [part[0] for part in template.parts if not isinstance(part, str)]


def _only_placeholders(template: params.Template | None) -> bool:
    return template is not None and all(not isinstance(p, str) for p in template.parts)


def shown_path(path: str) -> str:
    """`path` with every query value that is not only placeholders redacted."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    shown = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        keep = _only_placeholders(params.cached(value, params.QUERY))
        shown.append(f"{name}={value if keep else REDACTED}")
    return f"{base}?{'&'.join(shown)}"


def shown_header(job: JobConfig, name: str, value: str) -> str:
    """A header's value as shown: its template, or ``[redacted]`` (module doc)."""
    redact = job.answer.redact
    template = params.cached(value, params.HEADER)
    hidden = redact is None or name.lower() in redact or _CREDENTIAL.search(name) is not None
    return value if template is not None and not hidden else REDACTED


def request_object(job: JobConfig) -> dict[str, Any]:
    """``request`` of a job's object in ``status --json`` and the API (module doc)."""
    req = job.request
    base = req.path.partition("?")[0]
    used: set[str] = set(_names(params.cached(base, params.PATH)))
    for _, value in parse_qsl(req.path.partition("?")[2], keep_blank_values=True):
        used.update(_names(params.cached(value, params.QUERY)))
    headers = {}
    for name, value in sorted(req.headers.items()):
        headers[name] = shown_header(job, name, value)
        used.update(_names(params.cached(value, params.HEADER)))
    body = sorted(set(_names(params.cached(req.body, params.BODY))))
    used.update(body)
    return {
        "method": req.method,
        "url": redact_url(req.url),
        "path": shown_path(req.path),
        "headers": headers,
        "body_params": body,
        # Every run parameter the request uses ({slot}, {run_id}...), sorted.
        "params": sorted(used),
    }


def next_excluded(job: JobConfig, now_ms: int) -> dict[str, str] | None:
    """The job's next slot after `now_ms` when an exclusion keeps it from running,
    and which (``calendar:<name> ...`` for a shared calendar); None when it runs,
    or the job has no exclusions (one slot looked at: cheap on every refresh)."""
    if job.after is not None or not (job.schedule.exclusions or job.schedule.shared):
        return None
    slot = job.schedule.next_slot(now_ms)
    found = job.schedule.excluded(slot)
    return None if found is None else {"slot": rfc3339(slot / 1000), "by": found.text}
