"""A trace per run: W3C trace context from the run's token, and its span.

Every run has its own trace: the trace id and the sidecar's span id are
derived from the run's token (``X-Anarchon-Run-Id``), so every sidecar
computes the same ids for a run without storing them: the runner sends
``traceparent: 00-<trace id>-<span id>-01`` (sampled) with the trigger, the
result record carries ``trace_id``, and the sidecar that records the run
(its runner, or whoever records it lost) can export the run's span with
exactly the ids the app saw as its parent. ``tracestate`` is not touched.

Export is optional (``tracing.otlp_endpoint``) and needs the ``otel`` extra
(``sidecar.obs.otlp``, imported only then); without it the ids still work.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.core.wire import span_id_of, trace_id_of

_HEX32 = re.compile(r"[0-9a-f]{32}")


def run_uuid(token: str) -> str:
    """The run id as a UUID (Healthchecks' ``rid`` must be one): the token itself
    when it is 32 hex digits, else a name-based UUID of it."""
    if _HEX32.fullmatch(token):
        return str(uuid.UUID(hex=token))
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"anarchon-run:{token}"))


@dataclass(frozen=True)
class RunSpan:
    """What is exported of one run: ids, times (epoch seconds) and attributes."""

    token: str
    name: str
    start: float
    end: float
    ok: bool
    attributes: dict[str, str | int | bool] = field(default_factory=dict)
    error: str | None = None

    @property
    def trace_id(self) -> str:
        return trace_id_of(self.token)

    @property
    def span_id(self) -> str:
        return span_id_of(self.token)


class SpanExporter(Protocol):
    def export(self, span: RunSpan) -> None: ...

    async def drain(self) -> None: ...


def span_attributes(
    job: str,
    slot: int,
    attempt: int,
    trigger: str,
    status: str,
    cron: str,
    scheduled_at: str,
    instance: str,
    http_status: int | None,
) -> dict[str, str | int | bool]:
    """The run's attributes, with OpenTelemetry's FaaS ones for a timer-started run."""
    attrs: dict[str, str | int | bool] = {
        "faas.trigger": "timer",
        "faas.cron": cron,
        "faas.time": scheduled_at,
        "anarchon.job": job,
        "anarchon.slot": slot,
        "anarchon.attempt": attempt,
        "anarchon.trigger": trigger,
        "anarchon.outcome": status,
        "anarchon.instance": instance,
    }
    if http_status is not None:
        attrs["http.response.status_code"] = http_status
    return attrs
