"""Claims published pipelined: many in flight on one connection, acks gathered.

A burst (thousands of slots due at one instant, docs/PERFORMANCE.md) used to
send every claim as its own ``js.publish``: a request each, a timer each, and
all of them at once. The server answers them in turn, so the last ones of the
instant waited longer than ``nats.ack_timeout`` for an answer that was only
queued: they timed out, were published again and had their stored claim read,
three requests where one would have done, and no run started for seconds.

A claimer's claims go through a pipe of their own (sidecar/store/pipe.py, which
says how: one inbox, at most ``WINDOW`` in flight, one timer per ``GRAIN``, the
wire of ``js.publish``), apart from the state bucket's and results' writes, so
that a run's lease and result never wait for room behind the instant's claims.
What a claim decides from its ack (a duplicate, error 10158, a timeout asked
again with the same id and token) is sidecar/run/claim.py's, unchanged.
"""

from __future__ import annotations

from sidecar.store.pipe import GRAIN, NO_RESPONDERS, WINDOW, Expiry, Window
from sidecar.store.pipe import Pipe as Pipeline

__all__ = ["GRAIN", "NO_RESPONDERS", "WINDOW", "Expiry", "Pipeline", "Window"]
