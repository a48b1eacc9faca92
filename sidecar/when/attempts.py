"""Pure arithmetic of attempts and leases (docs/GUARANTEES.md): ids, keys, due times, windows.

Nothing here talks to NATS or reads a clock. Attempt 1 of a slot is the
reference's claim (``Nats-Msg-Id: <job>:<slot>``); attempt N > 1 has its own
id, ``<job>:<slot>:a<N>``, so that a retry is never a duplicate of the slot's
claim and is decided inside its own window: its due time + ``max_late``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.wire import LOST, RETRY

# The wire's ids and keys (sidecar/core/wire.py), named here too for the users of
# the attempt arithmetic.
from sidecar.core.wire import claim_msg_id as claim_msg_id
from sidecar.core.wire import due_key as due_key
from sidecar.core.wire import lock_key as lock_key
from sidecar.core.wire import lost_msg_id as lost_msg_id
from sidecar.core.wire import run_key as run_key

# The replica whose app failed an attempt competes for the next one this much
# later at least (docs/CONFIG.md, `retry`: max(jitter, 500ms)), so a healthy one usually wins.
FAILED_REPLICA_WAIT = 0.5
# A due key outlives the end of its attempt's window by this much.
DUE_KEY_SLACK = 5.0

# Why a due key exists: a retry of a failed attempt, or a rerun of a lost one.
DUE_REASONS = (RETRY, LOST)


def is_lease_key(key: str) -> bool:
    return key.startswith(("run.", "lock."))


@dataclass(frozen=True)
class DueKey:
    job: str
    slot: int
    attempt: int


def parse_due_key(key: str) -> DueKey | None:
    """The parts of ``due.<job>.<slot>.<attempt>``; None for anything else."""
    parts = key.split(".")
    if len(parts) != 4 or parts[0] != "due" or not parts[1]:
        return None
    if not (parts[2].isdigit() and parts[3].isdigit()):
        return None
    attempt = int(parts[3])
    if attempt < 2:
        return None
    return DueKey(parts[1], int(parts[2]), attempt)


def lease_job(key: str) -> str | None:
    """The job of a ``run.*`` or ``lock.*`` key."""
    parts = key.split(".")
    if parts[0] in ("run", "lock") and len(parts) >= 2 and parts[1]:
        return parts[1]
    return None


# ---------------------------------------------------------------------- times


def retry_due_at(finished_at: float, backoff: float, attempt: int) -> float:
    """When attempt N+1 is due after attempt N failed at `finished_at`."""
    return finished_at + backoff * float(2 ** (max(1, attempt) - 1))


def may_follow(attempt: int, retry_max: int) -> bool:
    """Whether a failed or lost attempt N may be followed by attempt N+1."""
    return attempt <= retry_max


def failed_replica_wait(jitter: float) -> float:
    """The extra wait of the replica whose app failed the previous attempt."""
    return max(jitter, FAILED_REPLICA_WAIT)


def due_key_ttl(due_at: float, now: float, jitter: float, max_late: float) -> float:
    """How long a due key must live: past every replica's last chance to claim it."""
    return max(1.0, due_at - now + max_late + failed_replica_wait(jitter) + DUE_KEY_SLACK)


def renew_every(lease_ttl: float) -> float:
    """A lease is renewed three times per TTL."""
    return lease_ttl / 3
