"""Permissions violations reported by the NATS server: a reason, a metric, one line.

A publish to a subject the user may not publish to is dropped by the server,
which tells the client with an asynchronous ``-ERR 'Permissions Violation for
Publish to "<subject>"'``; the request it belonged to then just times out.
Without this, every lease create was retried until the slot's deadline and the
sidecar stayed ready, saying nothing (issue: the documented permissions broke
leases). ``Denials`` takes those errors from the connection's ``error_cb``:
nats-py hands the text over in lower case; the subject's case is restored
from the names the sidecar uses (``known``), so the line names the subject as
it is. It counts them (``nats_permission_denied_total{operation}``), logs one line
naming the subject and the permissions file, makes ``/readyz`` answer 503
with the reason while violations keep coming, and lets a writer stop retrying
at once when its own subject was refused (``denied(subject)``).

Refusals are said once, not once a minute or once per subject: the first
one names its subject and the permissions file; the line comes again only
when refusals had stopped for HOLD seconds and start again (something
changed). The metric counts every one, and /readyz names the latest. Whoever fails because
of a refusal asks ``about(name)`` and says the refusal, not its own timeout
(the state bucket said ``cannot open state bucket CRON_STATE: TimeoutError()``
every few seconds).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.obs.ratelog import RateLimitedLog

if TYPE_CHECKING:
    from sidecar.obs.metrics import Metrics

log = logging.getLogger(__name__)

# The server's text, e.g. Permissions Violation for Publish to "$KV.CRON_STATE.lock.x"
# or Permissions Violation for Subscription to "cron.>" (using queue "q").
VIOLATION = re.compile(
    r"permissions violation for (?P<op>publish|subscription) to \"(?P<subject>[^\"]*)\"",
    re.IGNORECASE,
)
# Not ready while the last violation is younger than this (seconds): a denial
# that a retry loop repeats keeps it 503; one that stopped clears it.
HOLD = 120.0
# What the sidecar does without when refused (not a readiness problem, not
# counted): advisories, and raising a stream (it is then used as it is).
OPTIONAL = re.compile(r"\$JS\.(EVENT\.|([^.]+\.)?API\.STREAM\.UPDATE\.)")
# Subjects remembered for ``denied`` (bounded: each is one line of a config).
MAX_SUBJECTS = 256
# Tokens of the JetStream and KV subjects the sidecar uses, as they are spelt.
API_TOKENS = (
    "$JS", "API", "INFO", "STREAM", "CREATE", "UPDATE", "MSG", "GET", "DIRECT", "CONSUMER",
    "DELETE", "NAMES", "FC", "EVENT", "ADVISORY", "$KV", "_INBOX",
)  # fmt: skip


@dataclass(frozen=True)
class Denial:
    operation: str  # publish, subscribe
    subject: str
    at: float  # monotonic


def parse_violation(text: str) -> tuple[str, str] | None:
    """(operation, subject) of a permissions violation's text, else None."""
    m = VIOLATION.search(text)
    if m is None:
        return None
    op = "publish" if m.group("op").lower() == "publish" else "subscribe"
    return op, m.group("subject")


@dataclass
class Denials:
    """The permissions violations of one connection."""

    metrics: Metrics | None = None
    user: str | None = None
    clock: Callable[[], float] = time.monotonic
    last: Denial | None = None
    _subjects: dict[tuple[str, str], float] = field(default_factory=dict)
    # Monotonic time of the last refusal: a refusal is said when there was none
    # within HOLD seconds before it (a new episode), else only counted.
    _episode: float | None = None
    _log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(log))
    _case: dict[str, str] = field(default_factory=lambda: {t.lower(): t for t in API_TOKENS})

    def known(self, *names: str) -> None:
        """Names used in subjects (stream, bucket, prefix, jobs, instance), as spelt."""
        for name in names:
            for token in name.split("."):
                if token:
                    self._case.setdefault(token.lower(), token)

    def spelt(self, subject: str) -> str:
        """`subject` (lower case, as nats-py reports it) with known tokens' case restored."""
        return ".".join(self._case.get(t, t) for t in subject.split("."))

    def report(self, text: str) -> bool:
        """Take an error's text; True when it was a permissions violation."""
        parsed = parse_violation(text)
        if parsed is None:
            return False
        op, subject = parsed
        subject = self.spelt(subject.lower())
        if OPTIONAL.match(subject):
            # Advisories only wake a check sooner (without them it polls); a stream
            # that may not be raised is used as it is (the stream guard says so).
            self._log.log(
                logging.INFO,
                f"optional:{subject}",
                "NATS refused %s %s: optional, the sidecar does without it",
                op,
                subject,
            )
            return True
        now = self.clock()
        self.last = Denial(op, subject, now)
        if len(self._subjects) >= MAX_SUBJECTS:
            self._subjects.clear()
        self._subjects[(op, subject.lower())] = now
        if self.metrics is not None:
            self.metrics.nats_permission_denied_total.labels(operation=op).inc()
        said, self._episode = self._episode, now
        if said is None or now - said >= HOLD:
            log.error(
                "NATS refused to let %s %s %s: a permissions violation; give the sidecar's "
                "user the permissions of deploy/nats/permissions.conf (said once; "
                "anarchon_nats_permission_denied_total counts every refusal)",
                self.user or "this user",
                op,
                subject,
            )
        return True

    def about(self, *names: str) -> Denial | None:
        """The latest refusal within HOLD seconds of a subject holding any of `names`
        (a bucket, a stream) as one of its tokens; None when there is none."""
        now = self.clock()
        wanted = {n.lower() for n in names}
        found: Denial | None = None
        for (op, subject), at in self._subjects.items():
            recent = now - at < HOLD and wanted & set(subject.split("."))
            if recent and (found is None or at > found.at):
                found = Denial(op, self.spelt(subject), at)
        return found

    def denied(self, subject: str, operation: str = "publish") -> bool:
        """Whether `subject` was refused within HOLD seconds."""
        at = self._subjects.get((operation, subject.lower()))
        return at is not None and self.clock() - at < HOLD

    def not_ready(self) -> str | None:
        """The reason for /readyz while violations are recent; None otherwise."""
        last = self.last
        if last is None or self.clock() - last.at >= HOLD:
            return None
        return (
            f"NATS permissions violation: {last.operation} to {last.subject!r} denied "
            f"(see deploy/nats/permissions.conf)"
        )
