"""anarchon-sidecar: run each scheduled job exactly once across app replicas.

Every sidecar computes the same slots from the same schedule, claims each slot
in NATS JetStream by message de-duplication, and only the winner calls the
app's local endpoint.
"""

__version__ = "0.2.0.dev0"
