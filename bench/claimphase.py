"""The claim phase of a burst (bench.burst): when each sidecar had decided all its claims.

A thread per sidecar scrapes its ``/metrics`` every ``EVERY`` seconds from just
before the instant and sums its ``anarchon_claims_won_total`` and
``anarchon_claims_lost_total`` (docs/METRICS.md): a claim is decided when it
is won or lost. The claim phase of a sidecar ends at the first scrape that
shows all its claims decided; the claim rate is its claims over the time from
the instant to then, apart from the runs that follow (the time to the last
trigger includes them).

A scrape is read when its answer is in: the sidecar renders ``/metrics`` at
most a second before (``sidecar/obs/exposition.py``, ``METRICS_MAX_AGE``;
less with fewer series), so the phase measured is at most that much longer
than the sidecar's, and the rate at most that much lower, never higher.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from typing import Any

EVERY = 0.1
# won + lost, and the claims that got no definite answer (reported, not counted).
DECIDED = re.compile(rb"^anarchon_claims_(?:won|lost)_total\{[^\n]*\} (\S+)$", re.M)
ERRORS = re.compile(rb"^anarchon_claim_errors_total\{[^\n]*\} (\S+)$", re.M)


def decided(body: bytes) -> tuple[int, int]:
    """(claims decided, claims in error) in one ``/metrics`` body."""
    won_lost = sum(float(v) for v in DECIDED.findall(body))
    errors = sum(float(v) for v in ERRORS.findall(body))
    return int(won_lost), int(errors)


class ClaimPhase(threading.Thread):
    """Scrapes one sidecar until it has decided `claims` claims or `until` (epoch s)."""

    def __init__(self, url: str, claims: int, start: float, until: float) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.claims = claims
        self.start_at = start
        self.until = until
        self.done_at: float | None = None  # epoch s of the first scrape showing all decided
        self.seen = 0  # the most claims decided in one scrape
        self.errors = 0
        self.scrapes = 0
        self.failed = 0

    def run(self) -> None:
        while time.time() < self.start_at:
            time.sleep(0.01)
        while time.time() < self.until:
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as resp:
                    body = bytes(resp.read())
            except OSError:
                self.failed += 1
            else:
                self.scrapes += 1
                self.seen, self.errors = decided(body)
                if self.seen >= self.claims:
                    self.done_at = time.time()
                    return
            time.sleep(max(0.0, EVERY - (time.monotonic() - started)))

    def result(self, instant: float) -> dict[str, Any]:
        """This sidecar's phase: seconds from `instant`, claims per second, what was seen."""
        took = self.done_at - instant if self.done_at is not None else None
        return {
            "claim_phase_s": took,
            "claims_per_s": self.claims / took if took else None,
            "decided": self.seen,
            "claim_errors": self.errors,
            "scrapes": self.scrapes,
            "failed_scrapes": self.failed,
        }
