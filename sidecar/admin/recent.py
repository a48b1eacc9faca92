"""Each job's newest runs, as ``status`` and the page show them: ``Recent``.

``Recent`` keeps, per job, the newest claim and the newest result as stored
(the last run is their join, as ``status`` always did) and a strip of the last
``STRIP`` runs as small tuples, so that 1,000 jobs cost well under a MiB. The
CLI fills one with ``read_recent`` (two bounded passes over the stream); a
running sidecar keeps one up to date from one ordered consumer
(sidecar/admin/live.py). The objects built from it: sidecar/admin/objects.py.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from sidecar.core.bounds import slot_ms
from sidecar.core.clock import rfc3339
from sidecar.core.natspy import delivered_nothing
from sidecar.core.wire import EVERY, FAILED, LOST, RUN_ON_FIELD, RUNNING, SKIPPED
from sidecar.store.runs import attempt_of, join_runs

STRIP = 20  # runs in a job's strip of status marks
# The newest messages read to fill the strips: about two per run and job, bounded.
TAIL_PER_JOB = 2 * STRIP + 4
TAIL_MAX = 50_000
READ_TIMEOUT = 10.0


@dataclass
class JobRecent:
    """One job's newest claim and result (raw) and its last runs' marks."""

    claim: tuple[int, bytes] | None = None
    result: tuple[int, bytes] | None = None
    # token -> [slot, seq, status, attempt, manual, instance, every (run_on: every)]
    marks: dict[str, list[Any]] = field(default_factory=dict)


class Recent:
    """Per job: what ``status`` and the page show of its runs, fed message by message."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.jobs: dict[str, JobRecent] = {}
        self.last_seq = 0

    def job_of(self, subject: str) -> tuple[str, str] | None:
        """(job, "claims"|"results") of a stream subject under the prefix, else None."""
        if not subject.startswith(self.prefix):
            return None
        job, _, kind = subject[len(self.prefix) :].rpartition(".")
        if not job or "." in job or kind not in ("claims", "results"):
            return None
        return job, kind

    def add(self, seq: int, subject: str, data: bytes) -> str | None:
        """Take one stored message; the job it concerns, None when it is none of ours."""
        self.last_seq = max(self.last_seq, seq)
        found = self.job_of(subject)
        if found is None:
            return None
        name, kind = found
        rec = self.jobs.setdefault(name, JobRecent())
        try:
            body = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        if not isinstance(body, dict) or body.get("job") != name:
            return None
        token = body.get("token")
        if not isinstance(token, str):
            return None
        if kind == "claims":
            slot = slot_ms(body.get("slot"))
            if slot is None:  # not a slot any schedule can name: hostile, skipped
                return None
            if rec.claim is None or seq >= rec.claim[0]:
                rec.claim = (seq, data)
            if token not in rec.marks:
                rec.marks[token] = [
                    slot,
                    seq,
                    RUNNING,
                    attempt_of(body),
                    body.get("manual") is True,
                    instance if isinstance(instance := body.get("instance"), str) else None,
                    body.get(RUN_ON_FIELD) == EVERY,
                ]
                if len(rec.marks) > STRIP:  # the oldest goes (reads may come out of order)
                    oldest = min(rec.marks.items(), key=lambda item: (item[1][0], item[1][1]))
                    del rec.marks[oldest[0]]
        else:
            mark = rec.marks.get(token)
            status = body.get("status")
            # A real result wins over ``lost`` (its runner came back), as in history.
            late_lost = status == LOST and mark is not None and mark[2] not in (RUNNING, LOST)
            if (rec.result is None or seq >= rec.result[0]) and not late_lost:
                rec.result = (seq, data)
            if (
                mark is not None
                and isinstance(status, str)
                and not (status == LOST and mark[2] != RUNNING)
            ):
                mark[2] = status
        return name

    def last_run(self, job: str) -> dict[str, Any] | None:
        rec = self.jobs.get(job)
        if rec is None:
            return None
        messages = [
            (seq, f"{self.prefix}{job}.{kind}", data)
            for kind, got in (("claims", rec.claim), ("results", rec.result))
            if got is not None
            for seq, data in [got]
        ]
        runs = join_runs(job, messages, self.prefix).runs
        return runs[0].as_dict() if runs else None

    def strip(self, job: str) -> list[dict[str, Any]]:
        """The last runs, newest first: slot, status, token, attempt, manual, fence."""
        rec = self.jobs.get(job)
        if rec is None:
            return []
        marks = sorted(rec.marks.items(), key=lambda item: (item[1][0], item[1][1]), reverse=True)
        return [
            {
                "slot": rfc3339(m[0] / 1000),
                "status": m[2],
                "token": token,
                "attempt": m[3],
                "manual": m[4],
                "fence": m[1],
                "instance": m[5],
            }
            for token, m in marks
        ]

    def every_marks(self, job: str) -> list[tuple[int, str, str]]:
        """(slot, instance, status) of the job's per-instance runs in the strip."""
        rec = self.jobs.get(job)
        if rec is None:
            return []
        return [(m[0], m[5], m[2]) for m in rec.marks.values() if m[6] and m[5] is not None]


def consecutive_failures(strip: list[dict[str, Any]]) -> int:
    """Finished runs that failed (or were lost) in a row, newest first: as the fleet's
    ``health.<job>`` counts them (sidecar/after/health.py), only a success ends the
    row; a slot still running or skipped (nothing sent) neither ends nor adds."""
    count = 0
    for run in strip:
        if run["status"] in (RUNNING, SKIPPED):
            continue
        if run["status"] not in (FAILED, LOST):
            break
        count += 1
    return count


async def read_recent(js: JetStreamContext, stream: str, prefix: str, jobs: int) -> Recent:
    """A Recent filled from the stream: the newest message of every subject, then a tail."""
    recent = Recent(prefix)
    info = await js.stream_info(stream)
    last, first = int(info.state.last_seq), int(info.state.first_seq)
    if not info.state.messages:
        return recent
    await read_pass(
        js, stream, prefix, recent, ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
    )
    start = max(first, last - min(TAIL_MAX, TAIL_PER_JOB * max(1, jobs)) + 1)
    await read_pass(
        js,
        stream,
        prefix,
        recent,
        ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start),
    )
    return recent


async def read_pass(
    js: JetStreamContext, stream: str, prefix: str, recent: Recent, config: ConsumerConfig
) -> None:
    done = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Msg) -> None:
        meta = msg.metadata
        recent.add(meta.sequence.stream, msg.subject, msg.data)
        if meta.num_pending == 0 and not done.done():
            done.set_result(None)

    sub = await js.subscribe(
        f"{prefix}>", stream=stream, cb=on_msg, ordered_consumer=True, config=config
    )
    try:
        if await delivered_nothing(sub) and not done.done():
            done.set_result(None)
        await asyncio.wait_for(done, READ_TIMEOUT)
    except TimeoutError:
        pass  # what was read in that time is shown; the rest is missing, not wrong
    finally:
        await sub.unsubscribe()
