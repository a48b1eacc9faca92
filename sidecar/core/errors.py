"""The sidecar's exceptions, one tree.

    SidecarError
     ├── ConfigError            a config key is wrong; exit 2, the message names the key
     ├── ConnectError           NATS could not be reached at start; exit 3
     ├── UnknownJob             a job name neither in the config nor in the stream; exit 2
     ├── ListenError            metrics.listen is valid but this host refuses it (busy); exit 4
     ├── StreamError            JetStream refused to create, update or read the stream
     │    ├── StreamNotFound    the stream does not exist (yet)
     │    ├── StreamConflict    another stream captures our subjects (final; exit 2)
     │    ├── StreamNotRaised   the stream could not be raised; it is used as it is
     │    └── KeptChanging      a command's compare-and-set lost every try; nothing changed
     ├── ClaimError             no definite claim answer before the slot's deadline
     │    ├── ClaimUnanswered   ... though it may have been stored: what to ask again, later
     │    ├── ClaimDisconnected NATS was disconnected for the whole time the claim could be made
     │    └── ClaimForeign      the ack names another stream or JetStream domain
     ├── PermissionDenied       the NATS server refused a subject to this user
     ├── PlaintextRefused       TLS asked for, the server spoke in clear (sidecar/core/natspy.py:
     │                          also a nats-py NatsError, raised inside its connect)
     ├── KeyHeld                a state bucket key is live: someone else holds it
     │    └── Untimed           ... by a value without a bounded TTL: not a sidecar's lock
     ├── CasConflict            a state bucket key moved past the expected revision
     ├── Hostile                a due key not backed by the job's config or the stream
     │    └── HostileBackfill   a backfill.<job> value the backfill command would not write
     ├── CountUnavailable       a job's max_runs count could not be read or written
     ├── BucketJobRefused       job add/update/remove could not be done as asked (exit 1)
     ├── ForgetRefused          forget: the job is still in use (run, leased, a bucket job; exit 1)
     ├── SendError              a ping, webhook or span send failed (``retry``: worth another)
     ├── ScheduleError          a cron expression is invalid (also a ValueError)
     ├── IcsError               a calendar file is not one the reader takes (also a ValueError)
     ├── FailpointError         ANARCHON_FAILPOINTS cannot be parsed (also a ValueError)
     └── TriggerError           the app was not triggered successfully
          ├── TriggerUndelivered  the request provably never reached the app (retryable)
          ├── TriggerLate         past the last instant it could go out: nothing sent
          ├── TriggerTimeout      the app did not answer within the timeout
          └── TriggerFailed       the app answered, but not with 2xx

Two private signals never leave their module and are not errors: ``Stopped``
(sidecar/cli/demo.py, Ctrl-C) and ``_Unusual`` (sidecar/config/yamlfile.py, "let
PyYAML read this one").

Third-party exceptions (nats-py, h11, OSError, yaml) are translated where they cross
into our code, with ``raise ... from exc``. Losing a claim is not an error.
"""

from __future__ import annotations

import errno
import os
from typing import Any


class SidecarError(Exception):
    """Base of every error the sidecar raises on purpose."""


class ConfigError(SidecarError):
    """A config value is invalid. ``key`` is its path, e.g. ``jobs[1].jitter``."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key
        self.message = message


class ConnectError(SidecarError):
    """NATS was unreachable when the command started."""


class UnknownJob(SidecarError):
    """A job name that is neither in the config nor in the stream (a typo, most likely)."""

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        super().__init__(f"no job named {name!r}")
        self.name = name
        self.known = known


class ListenError(SidecarError):
    """The admin port cannot be opened: in use by another process, or not allowed."""

    def __init__(self, host: str, port: int, exc: OSError) -> None:
        # asyncio words its own strerror ("error while attempting to bind on ..."): not ours.
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        why = why[:1].lower() + why[1:]
        if exc.errno == errno.EADDRINUSE:
            why += ": another process on this host listens there (a second sidecar with the same"
            why += " metrics.listen?)"
        elif exc.errno == errno.EACCES:
            why += ": ports below 1024 need root or CAP_NET_BIND_SERVICE"
        elif exc.errno == errno.EADDRNOTAVAIL:
            why += ": no interface of this host has that address"
        super().__init__(f"cannot listen on {host}:{port} (metrics.listen): {why}")
        self.port = port


class StreamError(SidecarError):
    """JetStream refused an operation on the stream."""


class StreamNotFound(StreamError):
    """The configured stream does not exist."""


class PermissionDenied(SidecarError):
    """The NATS server reported a permissions violation for ``subject``."""

    def __init__(self, operation: str, subject: str) -> None:
        super().__init__(f"NATS permissions violation: {operation} to {subject!r} denied")
        self.operation = operation
        self.subject = subject


class ClaimError(SidecarError):
    """The claim got no definite answer before its deadline."""


class ClaimUnanswered(ClaimError):
    """No definite answer before the deadline, while NATS was connected: the claim
    may have been stored all the same (a publish whose answer came too late), and
    nobody would run it. It carries what the claim was, so that the slot's fate
    can be asked for again, under the same id and token (sidecar/run/unanswered.py)."""

    def __init__(
        self,
        message: str,
        *,
        job: str,
        slot: int,
        msg_id: str,
        token: str,
        attempt: int,
        trigger: str,
        extra: dict[str, str] | None,
        deadline: float,
    ) -> None:
        super().__init__(message)
        self.deadline = deadline  # the claim's, on the clock's monotonic scale
        self.job = job
        self.slot = slot
        self.msg_id = msg_id
        self.token = token
        self.attempt = attempt
        self.trigger = trigger
        self.extra = extra


class TriggerError(SidecarError):
    """The trigger request did not succeed."""

    def __init__(
        self,
        message: str,
        http_status: int | None = None,
        answer: bytes = b"",
        content_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.answer = answer  # the start of the app's answer, when there was one
        self.content_type = content_type  # its Content-Type, when it had one


class TriggerUndelivered(TriggerError):
    """The request never reached the app (connection refused, socket missing)."""


class TriggerLate(TriggerError):
    """The last instant the request could go out had passed: nothing was sent."""


class TriggerTimeout(TriggerError):
    """The app did not answer in time; the request may have reached it."""


class TriggerFailed(TriggerError):
    """The app answered with a status other than 2xx."""


class StreamConflict(StreamError):
    """Another stream captures some of our subjects: final until someone changes one of them."""

    def __init__(self, message: str, others: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.others = others or {}


class StreamNotRaised(StreamError):
    """Raising the stream failed (no permission, no answer); ``state`` is the stream as it is."""

    def __init__(self, message: str, state: object) -> None:
        super().__init__(message)
        self.state = state


class ClaimDisconnected(ClaimError):
    """NATS was disconnected for the whole time the claim could be made."""


class ClaimForeign(ClaimError):
    """The ack names another stream or JetStream domain than the fleet's."""


class KeyHeld(SidecarError):
    """The key exists and is live: someone else holds it."""

    def __init__(self, key: str, value: dict[str, Any]) -> None:
        super().__init__(key)
        self.value = value


class Untimed(KeyHeld):
    """A lock held by a value written without a bounded TTL (no ``Nats-TTL``, ``never``,
    or longer than any lease): never a sidecar's, which always writes one; hostile."""

    def __init__(self, key: str, value: dict[str, Any], revision: int, ttl: str | None) -> None:
        super().__init__(key, value)
        self.revision = revision
        self.ttl = ttl  # the Nats-TTL header as found (None: none)


class CasConflict(SidecarError):
    """The key's last revision was not the expected one."""


class KeptChanging(StreamError):
    """A command's compare-and-set of a key lost to another writer every time it tried:
    nothing was changed (exit 1, one line; docs/CLI.md)."""

    def __init__(self, key: str, tries: int) -> None:
        super().__init__(
            f"{key} kept changing: another writer changed it between our read and our "
            f"write {tries} times in a row; nothing was changed, try again"
        )
        self.key = key


class Hostile(SidecarError):
    """The due key is not backed by the job's config or by the stream."""


class HostileBackfill(Hostile):
    """A ``backfill.<job>`` value is not one the backfill command (or a sidecar)
    writes; says why."""


class CountUnavailable(SidecarError):
    """A job's ``max_runs`` count could not be read or written: the slot must not run."""


class BucketJobRefused(SidecarError):
    """`job add/update/remove` could not be done as asked (exit 1); `missing`: there is
    no such job in the bucket (the API's 404, else 409)."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


class ForgetRefused(SidecarError):
    """`forget JOB` refused: a live instance runs the job, a run of it holds a lease,
    or it is a job of the state bucket (exit 1; sidecar/ops/forget.py)."""


class SendError(SidecarError):
    """A send failed; `retry` says whether asking again could help. Never names the URL."""

    def __init__(self, message: str, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


class ScheduleError(SidecarError, ValueError):
    """The cron expression is invalid; the message says which part and why."""


class IcsError(SidecarError, ValueError):
    """A calendar file is not a calendar the reader takes (sidecar/when/ics.py);
    ``line`` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


class FailpointError(SidecarError, ValueError):
    """ANARCHON_FAILPOINTS cannot be parsed."""
