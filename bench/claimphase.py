"""The claim phase of a burst (bench.burst): when each sidecar had decided all its claims.

A thread per sidecar scrapes its ``/metrics`` every ``EVERY`` seconds from just
before the instant and sums its ``anarchon_claims_won_total`` and
``anarchon_claims_lost_total`` (docs/METRICS.md): a claim is decided when it
is won or lost. A slot it did not claim (``anarchon_claims_skipped_total``:
``late`` on a machine too busy) or whose claim got no definite answer
(``anarchon_claim_errors_total``: its ack timed out, asked again and still
none) is settled without a decision, and so is a slot left to its claim candidates
whose run was seen (``anarchon_claims_deferred_total{outcome="seen"}``, with
``claim.candidates``). The scrapes stop once every slot is settled, or when
told (``stop``). The claim
phase of a sidecar ends at the first scrape that shows as many claims decided
as the last one; the claim rate is those claims over the time from the
instant to then, apart from the runs that follow (the time to the last
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
SKIPPED = re.compile(rb"^anarchon_claims_skipped_total\{[^\n]*\} (\S+)$", re.M)
ERRORS = re.compile(rb"^anarchon_claim_errors_total\{[^\n]*\} (\S+)$", re.M)
SEEN = re.compile(rb'^anarchon_claims_deferred_total\{[^\n]*outcome="seen"[^\n]*\} (\S+)$', re.M)


def counted(body: bytes) -> tuple[int, int, int, int]:
    """(claims decided, slots skipped, claims in error, slots left to their candidates
    and seen run) in one ``/metrics`` body."""
    decided, skipped, errors, seen = (
        int(sum(float(v) for v in pattern.findall(body)))
        for pattern in (DECIDED, SKIPPED, ERRORS, SEEN)
    )
    return decided, skipped, errors, seen


class ClaimPhase(threading.Thread):
    """Scrapes one sidecar until it has decided `claims` claims or `until` (epoch s)."""

    def __init__(self, url: str, claims: int, start: float, until: float) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.claims = claims
        self.start_at = start
        self.until = until
        self.stop = threading.Event()
        # (epoch s when read, claims decided, slots skipped, claims in error, slots
        # left to their candidates) per scrape.
        self.history: list[tuple[float, int, int, int, int]] = []
        self.failed = 0

    def run(self) -> None:
        while time.time() < self.start_at:
            time.sleep(0.01)
        while time.time() < self.until and not self.stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as resp:
                    body = bytes(resp.read())
            except OSError:
                self.failed += 1
            else:
                decided, skipped, errors, seen = counted(body)
                self.history.append((time.time(), decided, skipped, errors, seen))
                if decided + skipped + errors + seen >= self.claims:
                    return
            time.sleep(max(0.0, EVERY - (time.monotonic() - started)))

    def result(self, instant: float) -> dict[str, Any]:
        """This sidecar's phase: seconds from `instant` to its last claim decided,
        claims per second over it, and what the last scrape showed."""
        if not self.history:
            return {"claim_phase_s": None, "claims_per_s": None, "failed_scrapes": self.failed}
        _, decided, skipped, errors, seen = self.history[-1]
        done_at = next(at for at, d, *_ in self.history if d == decided)
        took = done_at - instant if decided else None
        return {
            "claim_phase_s": took,
            "claims_per_s": decided / took if took else None,
            "decided": decided,
            "skipped": skipped,
            "claim_errors": errors,
            "deferred_seen": seen,
            "all_settled": decided + skipped + errors + seen >= self.claims,
            "scrapes": len(self.history),
            "failed_scrapes": self.failed,
        }
