"""The span exporter a config asks for: OTLP/HTTP, or none.

Kept apart from sidecar/obs/tracing.py so that sidecar/obs/otlp.py (and the
``otel`` extra behind it) is imported only when ``tracing.otlp_endpoint`` is
set; the trace ids work without it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.config.load import Config
    from sidecar.obs.tracing import SpanExporter

log = logging.getLogger(__name__)


def span_exporter(config: Config) -> SpanExporter | None:
    """The OTLP/HTTP exporter when ``tracing.otlp_endpoint`` is set and the ``otel``
    extra is installed; None otherwise (said once at start when it is missing)."""
    tracing = config.tracing
    if tracing.otlp_endpoint is None:
        return None
    try:
        from sidecar.obs.otlp import OtlpExporter
    except ImportError as exc:
        log.error(
            "tracing.otlp_endpoint is set but the otel extra is not installed (%s): spans "
            "are not exported; traceparent and trace ids still work "
            "(pip install 'anarchon-sidecar[otel]')",
            exc.name,
        )
        return None
    return OtlpExporter(tracing, config.instance_id)
