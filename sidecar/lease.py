"""Run leases on the state bucket (FLEET.md): held while a run runs, lost when they expire.

``async with Lease(...)``: the key (``run.<job>.<slot>[.<attempt>]``, or
``lock.<job>`` for ``overlap: skip``) is created before the trigger with a
TTL of ``nats.lease_ttl``, renewed every ``lease_ttl / 3`` by compare-and-set
with a fresh TTL, and deleted by its revision when the block ends (after the
result was published). A renewal that fails is logged and counted; it never
interrupts the trigger. A CAS conflict is not taken at its word: replicated
buckets answer 10164 as well as 10071, and spurious conflicts were reported
under load (nats-io/nats-server#7281), so the key is read again and the lease
is lost only when the owner or token stored there is not ours.

The writes are plain publishes on ``$KV.<bucket>.<key>`` with the headers
set here: nats-py's ``kv.update`` has no TTL, and its ``kv.create`` does not
see a server's ``MaxAge`` marker as a deleted key (it refuses to create over
an expired lease). A delete leaves a ``DEL`` marker that itself expires, so
the bucket does not keep one marker per run for ever.

``LostRuns``: every sidecar sees a lease expire (a ``MaxAge`` marker, not a
delete) and publishes a ``lost`` result for that run with ``Nats-Msg-Id:
<job>:<slot>:<attempt>:lost``; exactly one is stored and the sidecar whose
copy was stored counts it and, with ``on_lost: rerun``, makes the next
attempt due.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import APIError, NotFoundError

from sidecar import failpoints
from sidecar.bounds import attempt_no, epoch_s, seq_no, slot_ms
from sidecar.claim import MSG_ID, TRANSIENT, new_token, token_of
from sidecar.clock import Clock, parse_rfc3339, rfc3339
from sidecar.due import (
    LOST,
    due_key,
    due_key_ttl,
    is_lease_key,
    lease_job,
    may_follow,
    renew_every,
)
from sidecar.errors import PermissionDenied
from sidecar.runs import ResultRecord, result_subject
from sidecar.state import EXPIRED, REPLACED, Bucket, Removal, View
from sidecar.tasks import cancel_all

if TYPE_CHECKING:
    from sidecar.config import Config, JobConfig
    from sidecar.metrics import Metrics
    from sidecar.stream import StreamSpec

log = logging.getLogger(__name__)

EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
KV_OPERATION = "KV-Operation"
MARKER_REASON = "Nats-Marker-Reason"
# 10071 JSStreamWrongLastSequenceErrF, 10164 JSStreamWrongLastSequenceConstantErr.
CAS_CONFLICT = (10071, 10164)
# How long a write may wait for its ack.
WRITE_TIMEOUT = 2.0
# The longest a won run waits for its run lease before it triggers the app
# (``Lease.start``); the create goes on meanwhile. The state bucket's stream has
# a Raft leader of its own: when that leader is lost and the claims' is not, a
# new one takes the election timeout (4-9 s), and a run that waited for its
# lease until slot + max_late was never sent (found by the nemesis).
RUN_LEASE_WAIT = 1.0
# ... when the server refused its subject lately (a permissions violation).
DENIED_TIMEOUT = 0.5
# After a spurious CAS conflict, the renewal is asked again after this, doubled
# for each further one in a row (up to lease_ttl / 3).
SPURIOUS_WAIT = 0.02
# A lost record is checked against the results this often at most when results
# keep coming in between the check and the record.
RECHECKS = 5
# A lease that vanished with its bucket is judged this long after lease_ttl and
# a renewal have passed (a renewal's round trip and the watch's delivery).
REPLACED_GRACE = 2.0
# At most this many results of a job stored since a run's claim are read.
MAX_RESULTS_READ = 10_000


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _ttl(seconds: float) -> int:
    """Nats-TTL in whole seconds, at least 1 (nats-py sends int(msg_ttl))."""
    return max(1, math.ceil(seconds))


async def _last_msg(js: JetStreamContext, stream: str, subject: str) -> RawStreamMsg | None:
    """The last message of `subject`; None when it has none."""
    try:
        return await js.get_last_msg(stream, subject)
    except NotFoundError:
        return None
    except APIError as exc:
        if exc.err_code == 10037:  # no message on the subject
            return None
        raise


def _same_owner(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two lease values are of one holder: the same instance and token."""
    return a.get("instance") == b.get("instance") and a.get("token") == b.get("token")


class KeyHeld(Exception):
    """The key exists and is live: someone else holds it."""

    def __init__(self, key: str, value: dict[str, Any]) -> None:
        super().__init__(key)
        self.value = value


class CasConflict(Exception):
    """The key's last revision was not the expected one."""


class Keys:
    """Writes and reads of single keys of the state bucket, markers understood."""

    def __init__(self, bucket: Bucket, denied: Callable[[str], bool] | None = None) -> None:
        self.bucket = bucket
        # Whether NATS refused a subject to this user lately (sidecar/permissions.py):
        # a write it refuses gets no answer, only an error on the connection.
        self.denied = denied
        self.js: JetStreamContext = bucket.kv._js
        self.stream = bucket.spec.stream
        # A delete marker lives as long as the server's own expiry markers.
        self.marker_ttl = bucket.spec.marker_ttl

    def subject(self, key: str) -> str:
        return f"$KV.{self.bucket.spec.bucket}.{key}"

    async def _publish(
        self, key: str, data: bytes, headers: dict[str, str], ttl: float | None
    ) -> int:
        subject = self.subject(key)
        refused = self.denied is not None and self.denied(subject)
        try:
            ack = await self.js.publish(
                subject,
                data,
                # Refused lately: the answer (if the permissions were fixed) is quick.
                timeout=DENIED_TIMEOUT if refused else WRITE_TIMEOUT,
                stream=self.stream,
                headers=headers,
                msg_ttl=_ttl(ttl) if ttl is not None else None,
            )
        except APIError as exc:
            if exc.err_code in CAS_CONFLICT:
                raise CasConflict(key) from exc
            raise
        except TRANSIENT as exc:
            if self.denied is not None and self.denied(subject):
                # Not a slow server: asking again until the deadline changes nothing.
                raise PermissionDenied("publish", subject) from exc
            raise
        return int(ack.seq)

    async def last(self, key: str) -> tuple[int, dict[str, Any] | None] | None:
        """(revision, value) of the key's last message; value None for a marker.

        None when the subject has no message at all.
        """
        msg = await _last_msg(self.js, self.stream, self.subject(key))
        if msg is None:
            return None
        headers = msg.headers or {}
        if headers.get(KV_OPERATION) or headers.get(MARKER_REASON):
            return int(msg.seq or 0), None
        try:
            value = json.loads(msg.data or b"{}")
        except (ValueError, UnicodeDecodeError, RecursionError):
            value = {}
        return int(msg.seq or 0), value if isinstance(value, dict) else {}

    async def create(
        self, key: str, value: dict[str, Any], ttl: float | None, expected: int = 0
    ) -> int:
        """Create the key; KeyHeld when it is live. A marker (deleted, expired) is no owner.

        `expected`: the revision of the key's last marker when known (else 0).
        """
        data = _json(value)
        for _ in range(3):
            try:
                return await self._publish(key, data, {EXPECTED_LAST: str(expected)}, ttl)
            except CasConflict:
                last = await self.last(key)
                if last is not None and last[1] is not None:
                    if _same_owner(last[1], value):
                        return last[0]  # our own create, answered late: asked again
                    raise KeyHeld(key, last[1]) from None
                expected = last[0] if last is not None else 0
        raise KeyHeld(key, {})

    async def renew(self, key: str, value: dict[str, Any], revision: int, ttl: float) -> int:
        """Compare-and-set with a fresh TTL; CasConflict when the key moved on."""
        return await self._publish(key, _json(value), {EXPECTED_LAST: str(revision)}, ttl)

    async def delete(self, key: str, revision: int | None) -> int:
        """Delete (by revision when given); the marker's revision. It expires after the
        markers' TTL."""
        headers = {KV_OPERATION: "DEL"}
        if revision:
            headers[EXPECTED_LAST] = str(revision)
        return await self._publish(key, b"", headers, self.marker_ttl)


async def _until_answered(
    what: str, call: Callable[[], Awaitable[int]], clock: Clock, deadline: float
) -> int:
    """Ask again while NATS gives no definite answer, until `deadline` (monotonic)."""
    backoff = 0.05
    while True:
        try:
            return await call()
        except (*TRANSIENT, NoRespondersError) as exc:
            if clock.monotonic() + backoff > deadline:
                raise
            log.debug("%s: %r; asking again", what, exc)
        except APIError as exc:
            if exc.err_code in CAS_CONFLICT or clock.monotonic() + backoff > deadline:
                raise
            log.debug("%s: %r; asking again", what, exc)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 1.0)


class Lease:
    """``async with Lease(...)``: hold `key` while the block runs (see the module doc)."""

    def __init__(
        self,
        keys: Keys,
        key: str,
        value: dict[str, Any],
        ttl: float,
        metrics: Metrics,
        clock: Clock,
        deadline: float,
        marker: int = 0,
    ) -> None:
        self.keys = keys
        self.marker = marker  # the revision of the key's last marker, when known
        self.released = 0  # the revision of the delete marker that released it
        self.key = key
        self.value = value
        self.ttl = ttl
        self.metrics = metrics
        self.clock = clock
        self.deadline = deadline  # monotonic: how long the create may be retried
        self.job = str(value.get("job", ""))
        self.revision = 0
        self.lost = False
        self.renewals = 0
        self.renewed_at = 0.0  # monotonic time of the last write that set the TTL
        self.created = False
        self._created = asyncio.Event()
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Lease:
        """Create the key; KeyHeld when it is live, NATS errors when no answer came."""
        self.revision = await _until_answered(
            f"lease {self.key}", self._create, self.clock, self.deadline
        )
        self.renewed_at = self.clock.monotonic()
        self.created = True
        self._renewer = asyncio.create_task(self._renew())
        return self

    async def start(self, wait: float) -> bool:
        """Create the key without holding the run up: True when it was created
        within `wait` seconds.

        For a run lease (not a lock): the create is asked again in the background
        while the run goes on, until it is created (then renewed as usual) or the
        block ends (``__aexit__``). A run started without its lease is not seen
        lost if its runner dies before the create gets through; a run held back
        until slot + max_late is never sent at all.
        """
        self._renewer = asyncio.create_task(self._create_then_renew())
        done = asyncio.ensure_future(self._created.wait())
        try:
            await asyncio.wait(
                {self._renewer, done}, timeout=wait, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            done.cancel()
        return self.created

    async def _create(self) -> int:
        if failpoints.ENABLED:
            await failpoints.hit("lease.create")
        return await self.keys.create(self.key, self.value, self.ttl, self.marker)

    async def _create_then_renew(self) -> None:
        began = self.clock.monotonic()
        try:
            self.revision = await _until_answered(
                f"lease {self.key}", self._create, self.clock, math.inf
            )
        except KeyHeld:
            log.warning("lease %s exists already; running without it", self.key)
            return
        except Exception as exc:  # a definite refusal: the run goes on without it
            log.warning("lease %s not created (%r); running without it", self.key, exc)
            return
        self.renewed_at = self.clock.monotonic()
        self.created = True
        self._created.set()
        took = self.renewed_at - began
        if took > RUN_LEASE_WAIT:
            log.info("lease %s created after %.1fs, while its run went on", self.key, took)
        await self._renew()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._renewer is not None:
            # Not a single cancel: on Python 3.11 one that lands as a renewal's
            # answer arrives is lost (see sidecar/tasks.py); the renewer then
            # renewed for ever, the run never ended, and once a renewal failed
            # the lease expired into a lost record for a run that had succeeded.
            await cancel_all([self._renewer])
        if self.lost:
            return  # not ours any more: leave whatever is there
        if not self.created:
            # Never created (``start``): nothing to release. A create still in
            # flight may land and expire; its run's result is stored by then.
            return
        silent = self.clock.monotonic() - self.renewed_at
        if silent > self.ttl:
            # The process was stopped or its loop stalled: the key expired
            # meanwhile and may be someone else's now.
            self._failed(f"not renewed for {silent:.1f}s, longer than lease_ttl: it expired")
            self.lost = True
            return
        try:
            deadline = self.clock.monotonic() + max(self.ttl, 5.0)
            for _ in range(3):
                try:
                    await _until_answered(
                        f"lease {self.key} delete",
                        functools.partial(self._delete, self.revision),
                        self.clock,
                        deadline,
                    )
                    return
                except CasConflict:
                    if await self._still_ours() is False:
                        self._failed("it changed before it was released")
                        return
        except Exception as exc:  # it expires on its own: lost runs check the result first
            log.warning("lease %s not released: %r; it expires in %gs", self.key, exc, self.ttl)

    async def _delete(self, revision: int) -> int:
        self.released = await self.keys.delete(self.key, revision)
        return self.released

    async def _renew(self) -> None:
        every = renew_every(self.ttl)
        wait = every
        spurious = 0  # spurious conflicts in a row
        while True:
            await asyncio.sleep(wait)
            wait = every
            try:
                sent = self.clock.monotonic()
                self.revision = await self.keys.renew(self.key, self.value, self.revision, self.ttl)
                self.renewed_at = sent
                self.renewals += 1
                spurious = 0
            except CasConflict:
                ours = await self._still_ours()
                if ours is None:
                    wait = min(every, 1.0)
                elif ours:
                    # A spurious conflict: renew soon with the revision read. Right
                    # after a leader change that read can be stale and conflict
                    # again: back off while they repeat (it spun at 1,000 a second).
                    wait = min(every, SPURIOUS_WAIT * 2**spurious)
                    spurious += 1
                else:
                    self._failed("the key was taken over or expired")
                    self.lost = True
                    return
            except Exception as exc:  # NATS away: try again sooner, the TTL still runs
                self._failed(repr(exc))
                wait = min(every, 1.0)

    async def _still_ours(self) -> bool | None:
        """After a CAS conflict: is the stored value still our owner and token?

        None when the key could not be read (not known lost: asked again soon).
        """
        try:
            last = await self.keys.last(self.key)
        except Exception as exc:
            self._failed(f"conflict, then the key could not be read: {exc!r}")
            return None
        if last is None:
            # No message at all, not even a marker: the bucket was deleted (and made
            # again) or purged under us. The run is alive: take the lease again, so
            # that the others, who judge such leases after lease_ttl, see it is.
            try:
                self.revision = await self.keys.create(self.key, self.value, self.ttl)
            except Exception as exc:
                self._failed(f"the key vanished with its bucket and was not taken again: {exc!r}")
                return None if not isinstance(exc, KeyHeld) else False
            log.warning(
                "lease %s vanished without a trace (bucket replaced?); taken again", self.key
            )
            return True
        revision, value = last
        if value is None:
            return False
        mine = _same_owner(value, self.value)
        if mine:
            log.info("lease %s: a spurious CAS conflict; still ours at %d", self.key, revision)
            self.revision = revision
        return mine

    def _failed(self, why: str) -> None:
        self.metrics.lease_renewal_failures_total.labels(job=self.job).inc()
        log.warning(
            "lease %s: renewal failed (%s); the run goes on, it may be recorded lost",
            self.key,
            why,
        )


# ---------------------------------------------------------------------- lost runs


class LostRuns:
    """Records a ``lost`` result for every lease that expired (see the module doc)."""

    def __init__(
        self,
        config: Config,
        metrics: Metrics,
        clock: Clock,
        js: JetStreamContext,
        spec: StreamSpec,
        keys: Callable[[], Keys | None],
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.js = js
        self.spec = spec
        self.keys = keys
        self.jobs = {job.name: job for job in config.jobs}
        self.tasks: set[asyncio.Task[None]] = set()
        # Whether an expired lease of a job not in this config is judged here
        # (sidecar/orphans.py: when no other live instance runs that job).
        self.judges_foreign: Callable[[Removal], bool] = lambda removal: False
        self.view: View | None = None  # the live view: leases of a replaced bucket
        # Told of each lost record this sidecar stored (pings, notifications).
        self.after: Callable[[JobConfig, ResultRecord], None] | None = None

    def removed(self, removal: Removal) -> None:
        """The view lost `removal.key`; an expired lease of one of our jobs was lost."""
        if not is_lease_key(removal.key):
            return
        name = lease_job(removal.key) or ""
        job = self.jobs.get(name)
        if job is None:
            # A job not in this config: only its expiry is judged, and only when
            # no other live instance runs it (sidecar/orphans.py).
            if removal.how != EXPIRED or not self.judges_foreign(removal):
                return
            coro = self.record(name, removal)
        elif removal.how == REPLACED:
            coro = self.replaced(job, removal)
        elif removal.how != EXPIRED:
            if removal.how is None:
                log.debug("lease %s vanished between two reads; not judged", removal.key)
            return
        else:
            coro = self.record(job, removal)
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        """A recorder that ended with an exception is said (never "never retrieved")."""
        self.tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("recording a lost run failed", exc_info=exc)

    async def replaced(self, job: JobConfig, removal: Removal) -> None:
        """A lease that vanished with its bucket (deleted, made again): a live runner
        takes it again at its next renewal (Lease), a dead one cannot. Judged once
        lease_ttl and a renewal have passed: still gone, it is recorded lost, like an
        expired one (the result is looked for first), never left ``running``."""
        ttl = self.config.nats.lease_ttl
        await asyncio.sleep(ttl + renew_every(ttl) + REPLACED_GRACE)
        view = self.view
        if view is not None:
            back = view.keys.get(removal.key)
            if back is not None and back.value.get("token") == removal.entry.value.get("token"):
                return  # its runner took it again: alive
        log.warning(
            "lease %s vanished with the state bucket and was not taken again within "
            "lease_ttl: its runner is gone",
            removal.key[:200],
        )
        await self.record(job, Removal(removal.key, removal.entry, EXPIRED, self.clock.wall()))

    async def record(self, job: JobConfig | str, removal: Removal) -> None:
        """Record the run of an expired lease lost; `job` is a name for a job not
        in this config (recorded, never rerun)."""
        name = job if isinstance(job, str) else job.name
        value = removal.entry.value
        # Read from NATS: every number is range-checked before it is used.
        slot, attempt = slot_ms(value.get("slot")), attempt_no(value.get("attempt"), 1)
        token = value.get("token")
        if slot is None or attempt is None or not isinstance(token, str):
            self.metrics.hostile_input_total.labels(what="value").inc()
            log.warning(
                "lease %s expired with a value that is not a lease (or out of range): ignored",
                removal.key[:200],
            )
            return
        at = epoch_s(removal.at) or self.clock.wall()
        after = seq_no(value.get("fence"))
        try:
            for _ in range(RECHECKS):
                recorded, last = await self._recorded(name, token, after)
                if recorded:
                    log.info("lease %s expired after its run was recorded", removal.key)
                    return
                stored = await self._publish(
                    name, removal.key, value, slot, attempt, token, at, last
                )
                if stored is not None:
                    break
                # A result came in between the check and the lost record: look again.
            else:
                log.warning("lease %s expired; results kept coming in, not recorded", removal.key)
                return
        except Exception as exc:  # another sidecar records it; say so here
            log.warning("lease %s expired; recording the run lost failed: %r", removal.key, exc)
            return
        if not stored:
            return
        m = self.metrics
        m.runs_lost_total.labels(job=name).inc()
        m.runs_total.labels(job=name, status=LOST).inc()
        log.error(
            "run job=%s slot=%s attempt=%d status=lost instance=%s: its lease %s expired "
            "(no renewal for lease_ttl %gs): the runner died, hung or lost NATS",
            name,
            rfc3339(slot / 1000),
            attempt,
            value.get("instance"),
            removal.key,
            self.config.nats.lease_ttl,
        )
        if isinstance(job, str):
            return  # a job this config does not have: nothing to rerun it with
        if job.on_lost == "rerun":
            if may_follow(attempt, job.retry.max):
                await make_due(
                    self.keys(),
                    self.metrics,
                    self.clock,
                    job,
                    slot,
                    attempt + 1,
                    at,
                    LOST,
                    "",
                    stored,
                )
            else:
                self.metrics.retries_exhausted_total.labels(job=job.name).inc()

    async def _recorded(self, job: str, token: str, after: int | None) -> tuple[bool, int]:
        """Whether this run has a result (its own, or a lost record), and the sequence
        of the job's last result (0: none), which the lost record then expects.

        The newest result alone is not enough: runs of a job overlap, and a later
        slot's result hides this run's. With the run's claim sequence (`after`,
        the lease's ``fence``) every result stored since is read; without it
        (a lease written by another implementation) only the newest.
        """
        subject = result_subject(self.spec.prefix, job)
        newest = await _last_msg(self.js, self.spec.name, subject)
        if newest is None:
            return False, 0
        last = int(newest.seq or 0)
        if token_of(newest.data or b"") == token:
            return True, last
        seq = (after or last) + 1
        for _ in range(MAX_RESULTS_READ):
            if seq >= last:
                break
            try:
                msg = await self.js.get_msg(self.spec.name, seq, subject=subject, next=True)
            except NotFoundError:
                break
            if int(msg.seq or 0) >= last:
                break
            if token_of(msg.data or b"") == token:
                return True, last
            seq = int(msg.seq or 0) + 1
        return False, last

    async def _publish(
        self,
        job: JobConfig | str,
        key: str,
        value: dict[str, Any],
        slot: int,
        attempt: int,
        token: str,
        at: float,
        last: int,
    ) -> int | None:
        """Publish the lost result, expecting `last` as the job's last result.

        Its sequence when this copy was the one stored, 0 when another
        sidecar's was; None when a result was stored since `last` was read
        (perhaps this run's own): it is looked at again.
        """
        name = job if isinstance(job, str) else job.name
        started = value.get("started_at")
        started_at = started[:40] if isinstance(started, str) else rfc3339(at)
        try:
            duration_ms = max(0, round((at - parse_rfc3339(started_at)) * 1000))
        except (ValueError, OverflowError, OSError):
            started_at, duration_ms = rfc3339(at), 0
        record = ResultRecord(
            job=name,
            slot=slot,
            token=token,
            instance=str(value.get("instance", "")),
            status=LOST,
            started_at=started_at,
            finished_at=rfc3339(at),
            duration_ms=duration_ms,
            http_status=None,
            error=f"lease {key} expired: instance {value.get('instance')} stopped renewing it "
            f"(lease_ttl {self.config.nats.lease_ttl:g}s); recorded by {self.config.instance_id}",
            attempt=attempt,
        )
        deadline = self.clock.monotonic() + 10.0
        backoff = 0.1
        while True:
            try:
                ack = await self.js.publish(
                    result_subject(self.spec.prefix, name),
                    record.to_json(),
                    timeout=WRITE_TIMEOUT,
                    stream=self.spec.name,
                    headers={MSG_ID: record.msg_id, EXPECTED_LAST: str(last)},
                )
                # A job of this config (record passes its name): its pings, notifications.
                ours = self.jobs.get(name) if isinstance(job, str) else job
                if not ack.duplicate and self.after is not None and ours is not None:
                    self.after(ours, record)
                return 0 if ack.duplicate else int(ack.seq)
            except APIError as exc:
                if exc.err_code in CAS_CONFLICT:
                    return None
                if not isinstance(exc, TRANSIENT) or self.clock.monotonic() > deadline:
                    raise
            except TRANSIENT:
                if self.clock.monotonic() > deadline:
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)


async def make_due(
    keys: Keys | None,
    metrics: Metrics,
    clock: Clock,
    job: JobConfig,
    slot: int,
    attempt: int,
    due_at: float,
    reason: str,
    failed_on: str,
    result_seq: int = 0,
) -> bool:
    """Store ``due.<job>.<slot>.<attempt>``; True when this call made it due.

    `result_seq`: the sequence of the stored result of the attempt before; the
    other sidecars read it there before they act on the key (sidecar/duecheck.py).
    """
    if keys is None:
        log.warning(
            "job %s: attempt %d of slot %d not made due: no bucket", job.name, attempt, slot
        )
        return False
    key = due_key(job.name, slot, attempt)
    value = {
        "due_at": due_at,
        "reason": reason,
        "instance": failed_on,
        "token": new_token(),
        "result": result_seq,
    }
    ttl = due_key_ttl(due_at, clock.wall(), job.jitter, job.max_late)
    try:
        await _until_answered(
            f"due key {key}",
            lambda: keys.create(key, value, ttl),
            clock,
            clock.monotonic() + 10.0,
        )
    except KeyHeld:
        return False
    except Exception as exc:
        log.error("job %s: attempt %d of slot %d not made due: %r", job.name, attempt, slot, exc)
        return False
    metrics.attempts_due_total.labels(job=job.name, reason=reason).inc()
    log.info(
        "job %s slot %s: attempt %d due at %s (%s)",
        job.name,
        rfc3339(slot / 1000),
        attempt,
        rfc3339(due_at),
        reason,
    )
    return True


def parse_due(entry_value: dict[str, Any]) -> tuple[float, str, str] | None:
    """(due_at, reason, failed_on) of a due key's value; None when malformed."""
    due_at = entry_value.get("due_at")
    if not isinstance(due_at, int | float) or isinstance(due_at, bool):
        return None
    reason = entry_value.get("reason")
    failed_on = entry_value.get("instance")
    return (
        float(due_at),
        reason if isinstance(reason, str) else "",
        failed_on if isinstance(failed_on, str) else "",
    )
