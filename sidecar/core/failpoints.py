"""Failpoints: named points where a test stops or bends the process on purpose.

As etcd's gofail and TiKV's fail-rs do, a test arms a point through the
environment, and the sidecar then does something at exactly that point of a
run, the worst moment a fault could land::

    ANARCHON_FAILPOINTS="claim.won=sigstop;claim.before_retry=1*suspend(300)"

Each entry is ``name=[count*]action``; ``count`` limits how many times it
fires (unlimited without it). Actions:

=============== ==============================================================
``sigstop``     the process stops itself (SIGSTOP): frozen like a GC pause or a
                frozen container, until the test sends SIGCONT
``sleep(S)``    waits S seconds (the rest of the process keeps running)
``suspend(S)``  a simulated suspend of S seconds: the wall clock and the
                clock that counts suspended time jump S seconds ahead, the
                plain monotonic clock does not (what a suspended machine sees
                on waking, without suspending the machine)
``ackloss``     raises nats-py's TimeoutError, as if the answer was lost (the
                point comes after the request was sent)
``timeout(S)``  waits S seconds, then raises nats-py's TimeoutError: a request
                nobody answers within its timeout (a stream without a leader)
``off``         nothing
=============== ==============================================================

Points (``POINTS``):

- ``cas.before_write``: a command (``skip``, ``unskip``, ``backfill``, ``at``,
  ``job add/update``) read a key of the state bucket and is about to
  compare-and-set it.
- ``at.marked``: a one-off run was marked ``claiming`` in its key (a cancel
  is too late from here), before it is claimed.
- ``at.due``: a one-off run's time came (sidecar/run/atruns.py), before it is
  read again and claimed.
- ``claim.won``: a claim was won, before its run starts (lease, trigger): a
  slot's, a retry's, an ``at`` run's, an ``after`` run's or a backfill's;
  not a ``run_on: every`` claim's (no lease, no claim-to-lease window).
- ``claim.after_publish``: a claim's publish was answered, before the
  answer is read.
- ``claim.before_retry``: a claim had no definite answer and will be asked
  again.
- ``lease.create``: a run lease (or lock) is about to be created in the state
  bucket (``ackloss``: as if its stream had no leader to answer).
- ``trigger.before_send``: the connection to the app is open, the request
  not yet written.
- ``stream.check``: the stream check is about to ask JetStream for the stream
  (each look: ``1*sleep(S)`` makes the first one, at start, S seconds late).
- ``watch.read``: the state bucket is about to be read whole (at start, and
  each re-read), before its watch follows it.
- ``record.published``: the result of a run whose request went out was
  stored in the stream, before the aftermath (pings, notifications) and before
  its lease is released.

Inert in production: without the variable ``ENABLED`` is False, and every
point is ``if failpoints.ENABLED: ...``, a module attribute read and a
branch that is never taken, the closest Python has to gofail's code that is
compiled away. A set variable is parsed once at import; a malformed one stops
the process at start with the entry named (it is set only by tests).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
from dataclasses import dataclass

from nats.errors import TimeoutError as NatsTimeoutError

from sidecar.core import clock
from sidecar.core.errors import FailpointError

log = logging.getLogger(__name__)

ENV = "ANARCHON_FAILPOINTS"
POINTS = frozenset(
    {
        "claim.won",
        "claim.after_publish",
        "at.due",
        "cas.before_write",
        "at.marked",
        "claim.before_retry",
        "lease.create",
        "trigger.before_send",
        "record.published",
        "stream.check",
        "watch.read",
    }
)
_ENTRY = re.compile(
    r"^(?P<name>[a-z._]+)=(?:(?P<count>\d+)\*)?"
    r"(?P<action>sigstop|ackloss|off|(?:sleep|suspend|timeout)\((?P<seconds>\d+(?:\.\d+)?)\))$"
)


@dataclass
class Failpoint:
    action: str
    seconds: float = 0.0
    left: int | None = None  # None: every time


def parse(text: str) -> dict[str, Failpoint]:
    """The armed points of an ANARCHON_FAILPOINTS value."""
    points: dict[str, Failpoint] = {}
    for entry in filter(None, (part.strip() for part in text.split(";"))):
        match = _ENTRY.match(entry)
        if match is None:
            raise FailpointError(f"{ENV}: cannot parse {entry!r}")
        name = match["name"]
        if name not in POINTS:
            raise FailpointError(f"{ENV}: no failpoint {name!r} (known: {sorted(POINTS)})")
        action = match["action"].split("(")[0]
        count = int(match["count"]) if match["count"] else None
        points[name] = Failpoint(action, float(match["seconds"] or 0), count)
    return points


try:
    ARMED: dict[str, Failpoint] = parse(os.environ.get(ENV, ""))
except FailpointError as exc:  # only tests set it: stop at once, saying which entry
    sys.stderr.write(f"error: {exc}\n")
    raise SystemExit(2) from None
ENABLED = bool(ARMED)
if ENABLED:
    log.warning("failpoints armed (%s); this process is under test", ", ".join(sorted(ARMED)))


def _take(name: str) -> Failpoint | None:
    point = ARMED.get(name)
    if point is None or point.action == "off" or point.left == 0:
        return None
    if point.left is not None:
        point.left -= 1
    log.warning("failpoint %s: %s", name, point.action)
    return point


async def hit(name: str) -> None:
    """Do what `name` is armed to do, if anything."""
    point = _take(name)
    if point is None:
        return
    if point.action == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif point.action == "sleep":
        await asyncio.sleep(point.seconds)
    elif point.action == "suspend":
        clock.simulate_suspend(point.seconds)
    elif point.action == "ackloss":
        raise NatsTimeoutError
    elif point.action == "timeout":
        await asyncio.sleep(point.seconds)
        raise NatsTimeoutError
