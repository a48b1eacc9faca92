"""The bottom: the wire format, errors, clocks, backoff, task sets; no sidecar import."""
