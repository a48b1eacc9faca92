"""``buffer.<job>`` of a job whose overlap is not ``buffer_one`` here: counted, never run.

Every key family the daemon reads is checked before it acts on it
(sidecar/store/keyfamilies.py); a kept slot is checked against the stream
only for a ``buffer_one`` job (sidecar/run/overlapcheck.py), the only kind
that keeps one. Any other job's ``buffer.<job>`` is acted on by nobody, and
is counted here so that a forged one does not go unseen. Loaded at start
(small, no NATS reads), unlike the overlap code.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.run.context import Context

log = logging.getLogger(__name__)

# The family of kept slots (sidecar/run/keptslots.py buffer_key).
BUFFER = "buffer."
# (key, revision) pairs said already, at most this many remembered.
SAID_KEPT = 1000


class StrayBuffers:
    """``buffer.<job>`` of a job this sidecar runs with an overlap other than
    ``buffer_one``: no sidecar of this config keeps such a slot, and none takes it
    (sidecar/run/overlap.py acts on ``buffer_one`` jobs only). It is counted as
    hostile input (``what="buffer_key"``) and said once per revision, like a kept
    slot the stream does not back, but left in the bucket: a replica whose config
    makes the job ``buffer_one`` (a rolling config change) may have kept it. A
    key of a job this config does not have is another app's, and not looked at."""

    def __init__(self, ctx: Context) -> None:
        self.jobs = ctx.jobs
        self.view = ctx.fleet.view
        self.metrics = ctx.metrics
        self._said: set[tuple[str, int]] = set()

    def changed(self, key: str) -> None:
        """A key the watch delivered ("" after a re-sync: every ``buffer.*`` key)."""
        if key == "":
            keys = [k for k in self.view.keys if k.startswith(BUFFER)]
        elif key.startswith(BUFFER):
            keys = [key]
        else:
            return
        jobs = self.jobs
        for each in keys:
            entry = self.view.keys.get(each)
            job = jobs.get(each[len(BUFFER) :])
            if entry is None or job is None or job.overlap == "buffer_one":
                continue
            if (each, entry.revision) in self._said:
                continue
            if len(self._said) >= SAID_KEPT:
                self._said.clear()
            self._said.add((each, entry.revision))
            self.metrics.hostile_input_total.labels(what="buffer_key").inc()
            log.error(
                "state bucket: %s ignored: its job's overlap is not buffer_one here, so no "
                "sidecar of this config kept it; hostile input, or a replica's of another "
                "config (left in the bucket, nothing is run of it)",
                each[:200],
            )
