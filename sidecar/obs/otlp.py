"""The run spans over OTLP/HTTP (protobuf), for ``tracing.otlp_endpoint``.

Needs the ``otel`` extra (``opentelemetry-proto``, which brings protobuf);
only sidecar/obs/tracing.py imports this module, and only when an endpoint is
configured, so the default install never loads it. Each span goes out as its
own ``ExportTraceServiceRequest`` POSTed to ``<endpoint>/v1/traces`` in the
background, with the bounded retries of sidecar/obs/outbound.py.
"""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from sidecar import __version__
from sidecar.config.alerting import TracingConfig
from sidecar.obs.outbound import Outbox
from sidecar.obs.tracing import RunSpan

TRACES_PATH = "/v1/traces"


def traces_url(endpoint: str) -> str:
    """``<endpoint>/v1/traces`` unless the endpoint names that path already."""
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def _value(value: str | int | bool) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    return AnyValue(string_value=value)


def encode(span: RunSpan, service: str, instance: str) -> bytes:
    """One span as an OTLP ExportTraceServiceRequest."""
    status = (
        Status(code=Status.STATUS_CODE_OK)
        if span.ok
        else Status(code=Status.STATUS_CODE_ERROR, message=span.error or "")
    )
    proto = Span(
        trace_id=bytes.fromhex(span.trace_id),
        span_id=bytes.fromhex(span.span_id),
        name=span.name,
        kind=Span.SPAN_KIND_CLIENT,
        start_time_unix_nano=int(span.start * 1e9),
        end_time_unix_nano=int(span.end * 1e9),
        attributes=[KeyValue(key=k, value=_value(v)) for k, v in span.attributes.items()],
        status=status,
    )
    resource = Resource(
        attributes=[
            KeyValue(key="service.name", value=_value(service)),
            KeyValue(key="service.instance.id", value=_value(instance)),
            KeyValue(key="service.version", value=_value(__version__)),
        ]
    )
    scope = InstrumentationScope(name="anarchon-sidecar", version=__version__)
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(resource=resource, scope_spans=[ScopeSpans(scope=scope, spans=[proto])])
        ]
    )
    return bytes(request.SerializeToString())


class OtlpExporter:
    """Sends each run's span in the background; ``drain`` on shutdown."""

    def __init__(self, config: TracingConfig, instance: str) -> None:
        assert config.otlp_endpoint is not None
        self.url = traces_url(config.otlp_endpoint)
        self.service = config.service_name
        self.instance = instance
        self.outbox = Outbox(attempts=3, timeout=config.timeout, give_up=30.0)

    def export(self, span: RunSpan) -> None:
        body = encode(span, self.service, self.instance)
        headers = {"Content-Type": "application/x-protobuf"}
        self.outbox.send(f"span of run {span.token}", self.url, body, headers)

    async def drain(self) -> None:
        await self.outbox.drain()
