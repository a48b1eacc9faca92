"""``buffer.<job>`` and ``stop.<job>`` are acted on only when the stream backs them.

Anyone allowed to write the state bucket can write these keys (SECURITY.md).
Trusted as they were written, a forged ``buffer.<job>`` made every sidecar
trigger a slot off the schedule of a paused job whose ``max_runs`` was spent,
with a run id, fence and attempt of the forger's choosing (the fence then made
an app that keeps the highest one refuse every real run), and a forged
``stop.<job>`` cancelled a live run "for slot 1970-01-01". So a sidecar
believes them only as far as the stream does:

- a **kept slot** (``buffer.<job>``, overlap: buffer_one) names the claim of
  the slot by its sequence (``fence``). The message stored there must be a
  claim of this job, of that slot and run id, not a skip record nor a manual
  run (neither is ever kept), on the job's schedule (a one-off run, trigger
  ``at``, excepted: its instant is its own), with no result stored since (it
  neither ran nor was recorded), and not the claim of a run this sidecar saw
  holding ``lock.<job>`` (a kept slot is one that lost to a held lock). The
  run id, fence, attempt and trigger of the kept run are the stored claim's,
  never the key's. A real claim kept longer than ``kept_window`` (the whole
  fleet was away) is recorded ``skipped`` (late), not run.
- a **stop request** (``stop.<job>``, overlap: replace) names the asking
  claim by its sequence. It must be stored after the running run's claim,
  be a claim of this job of the slot the key names (not a skip record nor a
  manual run), and have no result yet: a newer slot that is still waiting for
  the lock, which is the only writer of the key.

The checks of a value and of a stored claim are pure; ``stored_claim`` and
``has_result`` read the stream. A key that fails is hostile input: the caller
counts it (``what="buffer_key"`` / ``"stop_key"``), logs it once, deletes it
and acts on nothing of it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from sidecar.core.backoff import Backoff
from sidecar.core.bounds import attempt_no, epoch_s, seq_no, slot_ms
from sidecar.core.errors import Hostile
from sidecar.core.wire import (
    AT,
    MANUAL,
    RETRY,
    SCHEDULED,
    TRIGGERS,
    claims_subject,
    results_subject,
)
from sidecar.run.claim import token_of
from sidecar.run.lostruns import scan_results
from sidecar.store.kv import last_msg

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.context import Context
    from sidecar.store.stream import StreamSpec

log = logging.getLogger(__name__)

# A run id is 128 random bits in hex (sidecar/core/wire.py new_token); other
# implementations may write longer ones, never longer than this.
MAX_TOKEN = 128
# A kept slot is taken this long after the claim at most, beyond the run it waited
# for: that run's request timeout and a dead runner's lock expiry, twice (it may
# be kept again behind one more run), plus the job's max_late.
KEPT_RUNS = 2
# A key is checked against the stream this many times (this far apart) before it
# is left as it is for now (the stream did not answer: nothing judged).
CHECK_TRIES, CHECK_RETRY = 3, 0.5
# Hostile keys said already, by (key, revision): at most this many remembered.
REFUSED_KEPT = 1000


@dataclass(frozen=True)
class KeyClaim:
    """What a ``buffer.<job>`` or ``stop.<job>`` value says: a slot, a run id, a sequence."""

    slot: int
    token: str
    fence: int


@dataclass(frozen=True)
class StoredClaim:
    """A claim as the stream holds it: everything a kept run is made of."""

    seq: int
    slot: int
    token: str
    attempt: int
    trigger: str
    stored_at: float  # the server's time of the claim (epoch s)


def _token(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TOKEN or not value.isascii():
        raise Hostile(f"{what} is not a run id")
    return value


def parse_key(value: Any) -> KeyClaim:
    """The slot, run id and sequence a ``buffer.*`` / ``stop.*`` value names; Hostile when
    one is missing or out of range (nothing of the value is formatted before)."""
    if not isinstance(value, dict):
        raise Hostile("not a JSON object")
    slot = slot_ms(value.get("slot"))
    if slot is None:
        raise Hostile("slot is not a time in range (1970 to 9999)")
    fence = seq_no(value.get("fence"))
    if fence is None:
        raise Hostile("fence is not a stream sequence")
    return KeyClaim(slot, _token(value.get("token"), "token"), fence)


def judge_claim(job: JobConfig, seq: int, data: bytes, at: Any) -> StoredClaim:
    """The message stored at `seq` on the job's claims subject as a claim of `job`
    (`at`: its stored time); Hostile when it is not one."""
    try:
        value: Any = json.loads(data or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        value = None
    if not isinstance(value, dict) or value.get("job") != job.name:
        raise Hostile("the message it names is not a claim of the job")
    slot = slot_ms(value.get("slot"))
    token = value.get("token")
    if slot is None or not isinstance(token, str):
        raise Hostile("the message it names is not a claim of the job")
    if "skipped" in value:
        raise Hostile("the claim it names is a skipped slot's record")
    if value.get("manual") is not False:
        raise Hostile("the claim it names is a manual run's (never kept, never waiting)")
    attempt = attempt_no(value.get("attempt"), 1)
    if attempt is None:
        raise Hostile("the claim it names has no usable attempt")
    trigger = value.get("trigger", RETRY if attempt > 1 else SCHEDULED)
    if trigger not in TRIGGERS or trigger == MANUAL:
        raise Hostile("the claim it names has no usable trigger")
    stored_at = epoch_s(at)
    if stored_at is None:
        raise Hostile("the claim it names has no usable time")
    return StoredClaim(seq, slot, token, attempt, trigger, stored_at)


def kept_problem(job: JobConfig, key: KeyClaim, claim: StoredClaim) -> str | None:
    """Why a ``buffer.<job>`` value is not a slot this job's fleet kept (None: it is)."""
    if claim.slot != key.slot:
        return "the claim it names is of another slot"
    if claim.token != key.token:
        return "the claim it names has another run id"
    if claim.trigger != AT and job.schedule.next_slot(claim.slot - 1) != claim.slot:
        return "its slot is not an instant of the job's schedule"
    return None


def kept_window(job: JobConfig, lease_ttl: float) -> float:
    """How long after its claim a kept slot may still run (seconds)."""
    return KEPT_RUNS * (job.request.timeout + lease_ttl) + job.max_late


def stop_problem(key: KeyClaim, asker: StoredClaim, running_seq: int) -> str | None:
    """Why a ``stop.<job>`` value is not the request of a newer slot of this job (None:
    it is). `asker`: the claim stored at the key's fence; `running_seq`: the fence of
    the run it asks to stop (the key's token names that run, not the asker)."""
    if key.fence <= running_seq:
        return "the claim it names is not newer than the running run's"
    if asker.slot != key.slot:
        return "the claim it names is of another slot"
    return None


async def stored_claim(
    js: JetStreamContext, spec: StreamSpec, job: JobConfig, seq: int
) -> StoredClaim:
    """The claim stored at `seq`; Hostile when there is none of this job. Other NATS
    errors propagate: nothing was judged."""
    try:
        msg = await js.get_msg(spec.name, seq)
    except NotFoundError:
        raise Hostile(f"no message is stored at sequence {seq}") from None
    if msg.subject != claims_subject(spec.prefix, job.name):
        raise Hostile("the message it names is not a claim of the job")
    at = msg.time.timestamp() if msg.time is not None else None
    return judge_claim(job, int(msg.seq or seq), msg.data or b"", at)


async def has_result(
    js: JetStreamContext, spec: StreamSpec, job: JobConfig, token: str, after: int
) -> bool:
    """Whether a result of the run `token` (claimed at `after`) is stored."""
    subject = results_subject(spec.prefix, job.name)
    newest = await last_msg(js, spec.name, subject)
    if newest is None or int(newest.seq or 0) <= after:
        return False
    if token_of(newest.data or b"") == token:
        return True
    found = await scan_results(js, spec.name, subject, token, after, int(newest.seq or 0))
    return found is not False  # None: more results than that since: not waiting any more


class KeyChecks:
    """One sidecar's checks of ``buffer.*`` and ``stop.*`` against the stream, and what
    it does with a hostile one: counted, logged once, deleted by its revision."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._refused: set[tuple[str, int]] = set()

    def refused(self, key: str, revision: int) -> bool:
        """Whether this revision of `key` was found hostile here already."""
        return (key, revision) in self._refused

    async def kept(
        self, job: JobConfig, key: str, revision: int, value: Any, holders: set[str]
    ) -> StoredClaim | None:
        """The stored claim of the kept slot `value`; None when the stream does not back
        it (hostile: counted, logged once, deleted) or did not answer."""

        async def check() -> StoredClaim:
            kept = parse_key(value)
            claim = await stored_claim(self.ctx.js, self.ctx.spec, job, kept.fence)
            if why := kept_problem(job, kept, claim):
                raise Hostile(why)
            if await has_result(self.ctx.js, self.ctx.spec, job, claim.token, claim.seq):
                raise Hostile("the claim it names has a result: it ran, or was recorded, already")
            if claim.token in holders:  # a live run's claim, or a dead runner's not yet lost
                raise Hostile(f"the claim it names is of a run that held lock.{job.name}")
            return claim

        return await self._checked("buffer_key", key, revision, check)

    async def stop(
        self, job: JobConfig, key: str, revision: int, value: Any, running_fence: int
    ) -> StoredClaim | None:
        """The asking claim of the stop request `value` for the run claimed at
        `running_fence`; None when the stream does not back it (hostile) or did not answer."""

        async def check() -> StoredClaim:
            asked = parse_key(value)
            if asked.fence <= running_fence:  # said before the stream is read
                raise Hostile("the claim it names is not newer than the running run's")
            asking = await stored_claim(self.ctx.js, self.ctx.spec, job, asked.fence)
            if why := stop_problem(asked, asking, running_fence):
                raise Hostile(why)
            if await has_result(self.ctx.js, self.ctx.spec, job, asking.token, asking.seq):
                raise Hostile("the claim it names has a result: it is not waiting")
            return asking

        return await self._checked("stop_key", key, revision, check)

    async def _checked(
        self, what: str, key: str, revision: int, check: Callable[[], Awaitable[StoredClaim]]
    ) -> StoredClaim | None:
        """`check()`, asked again while the stream does not answer; a Hostile verdict is
        counted, logged once and its key deleted (None)."""
        retry = Backoff(start=CHECK_RETRY, cap=CHECK_RETRY)
        for tries in range(CHECK_TRIES):
            try:
                return await check()
            except Hostile as exc:
                if await self._moved_on(key, revision):
                    return None  # taken or refused by another sidecar while this one read
                await self._hostile(what, key, revision, str(exc))
                return None
            except Exception as exc:  # no answer: nothing judged, the key is left
                if tries == CHECK_TRIES - 1:
                    log.warning("%s not checked (the stream did not answer): %r", key, exc)
                    return None
                await retry.sleep()
        return None

    async def _moved_on(self, key: str, revision: int) -> bool:
        """Whether `key` no longer holds `revision`. A kept slot taken by another sidecar
        (deleted, then run or recorded) has a result by the time this one looks at the
        stream: it is no forgery, and its delete is always stored before that result."""
        keys = self.ctx.keys()
        if keys is None:
            return False
        with contextlib.suppress(Exception):  # not known: judged as it was read
            last = await keys.last(key)
            return last is None or last[0] != revision
        return False

    async def _hostile(self, what: str, key: str, revision: int, why: str) -> None:
        if (key, revision) in self._refused:
            return
        if len(self._refused) >= REFUSED_KEPT:
            self._refused.clear()
        self._refused.add((key, revision))
        self.ctx.metrics.hostile_input_total.labels(what=what).inc()
        log.error(
            "state bucket: %s refused: %s; it is hostile input (whoever may write the state "
            "bucket wrote it) and is deleted, nothing is done of it",
            key[:200],
            why,
        )
        keys = self.ctx.keys()
        if keys is not None:
            with contextlib.suppress(Exception):  # another sidecar deleted it first
                await keys.delete(key, revision)


__all__ = [
    "KeyChecks",
    "KeyClaim",
    "StoredClaim",
    "has_result",
    "judge_claim",
    "kept_problem",
    "kept_window",
    "parse_key",
    "stop_problem",
    "stored_claim",
]
