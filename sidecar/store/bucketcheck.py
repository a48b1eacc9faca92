"""The state bucket checked like the stream: the settings leases need, fixed where safe.

Leases (docs/GUARANTEES.md) need a bucket that keeps one message per key (history 1),
accepts per-message TTLs (``allow_msg_ttl``) and leaves a ``MaxAge`` marker
when a key expires (``subject_delete_marker_ttl``, the marker TTL), and whose
markers stay at least ``lease_ttl`` (or a minute), so that a watch that re-reads the bucket
after a short outage can still tell an expired lease from a released one.

What goes wrong otherwise, as tried on nats-server 2.15.1: with history > 1
the server raises every message TTL to the marker TTL (a 3 s lease lived
120 s: lost runs recorded two minutes late, ``overlap: skip`` skipping for a
dead instance); without a marker TTL an expired lease leaves no trace, so no
run is recorded lost and ``overlap: skip`` cannot work. History is set back
to 1 in place (a limit change, safe); the TTL settings are not edited in
place (adding a marker TTL to an existing bucket once stopped keys expiring,
nats-io/nats-server#6920): the check then names what is missing and the
sidecar stops taking leases for the jobs that need them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nats.js import JetStreamContext
from nats.js.api import StreamInfo

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig

from sidecar.config.job_entry import LOCKED
from sidecar.core.wire import kv_stream

log = logging.getLogger(__name__)

# A marker TTL this long is enough whatever lease_ttl is (the sidecar creates the
# bucket with max(60 s, duplicate_window)); a shorter one must outlive a lease.
MARKER_TTL_ENOUGH = 60.0


@dataclass(frozen=True)
class StateSpec:
    """The state bucket as the config asks for it (sidecar/store/state.py makes it)."""

    bucket: str
    replicas: int
    marker_ttl: float  # seconds a MaxAge marker stays

    @property
    def stream(self) -> str:
        return kv_stream(self.bucket)


@dataclass(frozen=True)
class BucketFacts:
    """What of the bucket's stream matters to leases."""

    created: float | None
    history: int
    msg_ttl: bool
    marker_ttl: float | None  # seconds; None: no markers


def facts_of(info: StreamInfo) -> BucketFacts:
    c = info.config
    marker = getattr(c, "subject_delete_marker_ttl", None)
    return BucketFacts(
        created=info.created.timestamp() if info.created else None,
        history=int(c.max_msgs_per_subject or 0),
        msg_ttl=bool(getattr(c, "allow_msg_ttl", False)),
        marker_ttl=float(marker) if marker else None,
    )


def needs_leases(job: JobConfig) -> bool:
    """Whether a job cannot run as configured without working leases (max_runs: without
    the state bucket's compare-and-set, which the same check vouches for)."""
    return (
        job.overlap in LOCKED
        or job.on_lost == "rerun"
        or job.retry.max >= 1
        or getattr(job, "max_runs", None) is not None
        or getattr(job, "concurrency", None) is not None
    )


def lacks(facts: BucketFacts, lease_ttl: float) -> list[str]:
    """What the bucket lacks for leases that cannot be fixed in place (empty: nothing)."""
    out = []
    if not facts.msg_ttl:
        out.append("per-message TTLs are off (allow_msg_ttl)")
    if facts.marker_ttl is None:
        out.append(
            "it has no marker TTL (subject_delete_marker_ttl / limit_marker_ttl): an expired "
            "lease leaves no trace, so no run is recorded lost"
        )
    elif facts.marker_ttl < min(lease_ttl, MARKER_TTL_ENOUGH):
        out.append(
            f"its marker TTL ({facts.marker_ttl:g}s) is shorter than lease_ttl "
            f"({lease_ttl:g}s): a re-read after a short outage cannot tell an expired "
            "lease from a released one"
        )
    return out


def history_problem(facts: BucketFacts) -> str | None:
    if facts.history == 1:
        return None
    return (
        f"its history is {facts.history if facts.history > 0 else 'unlimited'}, not 1: the "
        f"server raises every lease's TTL to the marker TTL "
        f"({facts.marker_ttl or 0:g}s), so dead runners hold leases that long"
    )


@dataclass
class BucketCheck:
    facts: BucketFacts
    problem: str | None
    fixed: list[str] = field(default_factory=list)


def describe(bucket: str, what: list[str]) -> str:
    return (
        f"state bucket {bucket} cannot hold leases: "
        + "; ".join(what)
        + ". Jobs that need leases (overlap: skip, retry, on_lost: rerun) are not claimed "
        f"until it is fixed: delete it while no sidecar runs (nats kv del {bucket}) and the "
        "sidecars create it with the right settings"
    )


async def check_bucket(
    js: JetStreamContext, spec: StateSpec, lease_ttl: float, fix: bool
) -> BucketCheck:
    """Read the bucket's settings; with `fix`, set its history back to 1.

    NotFoundError (nats-py's, for the stream) when the bucket does not exist.
    """
    info = await js.stream_info(spec.stream)
    facts = facts_of(info)
    fixed: list[str] = []
    if fix and facts.history != 1:
        before = facts.history
        try:
            config = info.config
            config.max_msgs_per_subject = 1
            info = await js.update_stream(config)
            facts = facts_of(info)
            fixed.append(f"history {before} -> 1")
        except Exception as exc:  # no permission, an old server: said as a problem
            log.warning("state bucket %s: setting its history to 1 failed: %r", spec.bucket, exc)
    what = lacks(facts, lease_ttl)
    if (hist := history_problem(facts)) is not None:
        what.insert(0, hist)
    return BucketCheck(facts, describe(spec.bucket, what) if what else None, fixed)
