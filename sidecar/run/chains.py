"""Chains: a job with ``after: {job: A, on: ...}`` runs once after each run of A
that ended so (docs/CONFIG.md, docs/GUARANTEES.md).

Every sidecar that has such a job B follows A's results in the stream (an
ordered consumer on ``<prefix>A.results``), not only the sidecar that ran A:
the sidecar that recorded A's result may die the moment after, and the
others still see the result. Each of them claims B with the claim id
``B:after:A:<A's slot>`` (``core/wire.py`` ``after_msg_id``): the duplicate
window makes exactly one win, as for a slot. The id names A's slot, not its
attempt, so a retried or lost-then-rerun A fires B at most once.

Which endings fire B: ``success`` a succeeded result; ``failure`` a failed or
lost result that no attempt follows (retry.max used up, or on_lost: record
for a lost one); ``always`` either. A skipped result is no run and fires
nothing. B's run carries A's slot as its own, trigger ``after`` and A's run
id in ``X-Anarchon-After-Run``; it is not retried (as a one-off run).

A result is checked before anything acts on it (anyone who may publish to
the stream could write one, SECURITY.md): its subject is A's, its body a
result of A (status, slot, token, attempt in range), its server timestamp
within B's ``max_late``; anything else is counted as hostile input and
ignored. At start the consumer reads back B's ``max_late``: a result stored
while this sidecar was away is still followed, and a claim made that late is
still within the duplicate window (``check_windows``).

``anarchon_chain_links_total{job=B, outcome}`` counts each final run of A
once for the fleet: ``fired`` by the sidecar that won B's claim, ``not_fired``
(A ended otherwise than ``on`` asks) by the sidecar that ran A (docs/METRICS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from sidecar.core import failpoints
from sidecar.core.backoff import Backoff
from sidecar.core.bounds import attempt_no, slot_ms
from sidecar.core.clock import rfc3339
from sidecar.core.errors import ClaimDisconnected, ClaimError
from sidecar.core.natspy import restartable_from_time
from sidecar.core.wire import (
    AFTER,
    AT,
    FAILED,
    LOST,
    SUCCEEDED,
    after_msg_id,
    decode,
    results_subject,
)
from sidecar.when.pauses import PAUSED

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.claim import Claim
    from sidecar.run.context import Context
    from sidecar.run.skips import Unclaimed

log = logging.getLogger(__name__)

#: ``start(job, claim, start)``: run a won claim (sidecar/run/job_loop.py ``_start_run``).
Start = Callable[["JobConfig", "Claim", float], Any]
#: ``lost(job, claim)``: a claim lost here, whose winner is judged if it never
#: makes its lease (sidecar/run/claimwindow.py ``lost_claim``).
Lost = Callable[["JobConfig", "Claim"], None]

_TOKEN = re.compile(r"[0-9a-f]{32}")


def final(job: JobConfig, status: str, attempt: int, manual: bool, trigger: str | None) -> bool:
    """Whether a result of `job` with `status` is its run's last word: no attempt
    follows it (sidecar/run/retries.py makes the next one only while these allow)."""
    if status == SUCCEEDED:
        return True
    if manual or trigger == AT or attempt >= 1 + job.retry.max:
        return True
    if status == LOST:
        return job.on_lost != "rerun"
    return status != FAILED  # failed with an attempt left: a retry follows


def fires(on: str, status: str) -> bool:
    """Whether a final `status` of A fires a job ``after`` it ``on`` this."""
    if status == SUCCEEDED:
        return on in ("success", "always")
    return status in (FAILED, LOST) and on in ("failure", "always")


def result_of(data: bytes, job: str) -> dict[str, Any] | None:
    """A result record of `job` with the fields a chain reads checked; None when it
    is not one (hostile input, or a record of another shape)."""
    record = decode(data)
    if record.get("job") != job or record.get("status") not in (SUCCEEDED, FAILED, LOST):
        return None
    token = record.get("token")
    manual = record.get("manual", False)
    if (
        slot_ms(record.get("slot")) is None
        or not isinstance(token, str)
        or not _TOKEN.fullmatch(token)
        or attempt_no(record.get("attempt"), 1) is None
        or not isinstance(manual, bool)
    ):
        return None
    return record


class Chains:
    """The chained jobs this sidecar follows (module doc)."""

    def __init__(self, ctx: Context, unclaimed: Unclaimed, start: Start, lost: Lost) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.claimer = ctx.claimer
        self.guard = ctx.guard
        self.fleet = ctx.fleet
        self.unclaimed = unclaimed
        self.lost = lost
        self.start = start
        self.spawn = ctx.tasks.spawn
        by_name = {job.name: job for job in ctx.config.jobs}
        # A -> (A's config, the jobs after it)
        self.followed: dict[str, tuple[JobConfig, list[JobConfig]]] = {}
        for job in ctx.config.jobs:
            if job.after is not None and job.after.job in by_name:
                entry = self.followed.setdefault(job.after.job, (by_name[job.after.job], []))
                entry[1].append(job)
        self._subs: list[Any] = []

    def begin(self) -> None:
        """Follow the results of every job some job runs after, each in a task that
        subscribes (again after a failure) until the sidecar stops."""
        for name in self.followed:
            self.spawn(self._follow(name))

    async def _follow(self, name: str) -> None:
        backoff = Backoff(start=0.5, cap=10.0)
        afters = self.followed[name][1]
        back = max(job.max_late for job in afters)

        async def on_msg(msg: Msg) -> None:  # nats-py takes only a coroutine function
            # A consumer nats-py made again before it handed over a first message
            # starts at the stream's first: what is older than any follower's
            # max_late is passed over here, unread and uncounted.
            if self.clock.wall() - msg.metadata.timestamp.timestamp() <= back:
                self._on_msg(name, msg)

        while not self.ctx.stopping.is_set():
            since = datetime.fromtimestamp(self.clock.wall() - back, UTC)
            try:
                sub = await self.ctx.js.subscribe(
                    results_subject(self.ctx.spec.prefix, name),
                    stream=self.ctx.spec.name,
                    cb=on_msg,
                    ordered_consumer=True,
                    config=ConsumerConfig(
                        deliver_policy=DeliverPolicy.BY_START_TIME,
                        opt_start_time=since,
                    ),
                )
            except Exception as exc:  # NATS away: asked again
                log.warning("job %s: following its results failed (%r); trying again", name, exc)
                await backoff.sleep()
                continue
            if not restartable_from_time(sub):
                log.warning(
                    "job %s: this nats-py keeps its consumer request elsewhere: after a "
                    "nats-server restart its results may not be followed again",
                    name,
                )
            self._subs.append(sub)
            await self.ctx.stopping.wait()
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            return

    def _on_msg(self, name: str, msg: Msg) -> None:
        prior, afters = self.followed[name]
        subject = results_subject(self.ctx.spec.prefix, name)
        record = result_of(msg.data, name) if msg.subject == subject else None
        if record is None:
            self.metrics.hostile_input_total.labels(what="result").inc()
            log.warning("job %s: a message on its results is no result of it; ignored", name)
            return
        status = record["status"]
        attempt = attempt_no(record.get("attempt"), 1) or 1
        manual = bool(record.get("manual", False))
        if not final(prior, status, attempt, manual, record.get("trigger")):
            return
        stored = msg.metadata.timestamp.timestamp()
        # A link not fired is counted once for the fleet: by the sidecar that ran A.
        ran_here = record.get("instance") == self.config.instance_id
        for job in afters:
            assert job.after is not None
            if fires(job.after.on, status):
                self.spawn(self._claim(job, name, record, stored))
            elif ran_here:
                self.metrics.chain_links_total.labels(job=job.name, outcome="not_fired").inc()

    async def _may_run(self, job: JobConfig, name: str, slot: int, stored: float) -> bool:
        """Whether `job` may be claimed now: not paused; while what this sidecar knows
        does not say yet (the state bucket not read, the stream not fit), asked
        again until ``max_late`` after the run it follows was stored."""
        backoff = Backoff(start=0.05, cap=0.5)
        while True:
            why = self.guard.blocked(job, slot)
            blocked = ("stream", why) if why else self.fleet.blocked(job.name)
            if blocked is None:
                return True
            reason, text = blocked
            if reason == PAUSED or self.clock.wall() - stored > job.max_late:
                self.metrics.claims_skipped_total.labels(job=job.name, reason=reason).inc()
                log.warning("job %s: not run after a run of %s: %s", job.name, name, text)
                return False
            await backoff.sleep()

    async def _claim(
        self, job: JobConfig, name: str, record: dict[str, Any], stored: float
    ) -> None:
        slot, token = int(record["slot"]), str(record["token"])
        manual = bool(record.get("manual", False))
        try:
            await asyncio.sleep(random.uniform(0.0, min(job.jitter, 0.5)))
            now = self.clock.wall()
            if now - stored > job.max_late:
                log.info(
                    "job %s: the run of %s at %s ended more than max_late ago; not run",
                    job.name,
                    name,
                    rfc3339(slot / 1000),
                )
                return
            if not await self._may_run(job, name, slot, stored):
                return
            now = self.clock.wall()
            deadline = self.clock.monotonic() + (stored + job.max_late - now)
            msg_id = after_msg_id(job.name, name, slot, token, manual)
            extra = {"after_job": name, "after_run": token}
            try:
                claim = await self.claimer.claim(
                    job.name, slot, deadline, msg_id=msg_id, trigger=AFTER, extra=extra
                )
            except ClaimDisconnected as exc:
                self.unclaimed.disconnected(job, slot, exc)
                return
            except ClaimError as exc:  # no definite answer; another may have won
                self.unclaimed.failed(job, slot, exc)
                return
            if claim.won:
                log.info("job %s: won its run after %s (run %s)", job.name, name, token)
                self.metrics.chain_links_total.labels(job=job.name, outcome="fired").inc()
                if failpoints.ENABLED:
                    await failpoints.hit("claim.won")
                self.start(job, dataclasses.replace(claim, after_run=token), now)
            else:  # its winner may die before its lease: judged as a slot's
                self.lost(job, claim)
            self.unclaimed.count(claim)
        except Exception:  # a bug must not stop the others; said
            log.exception("job %s: the run after %s (run %s) failed", job.name, name, token)
