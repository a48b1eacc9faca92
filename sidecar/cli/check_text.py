"""What `check` says of a config: each job's schedule, request, policies and next
slots, and what `run` would do to the stream.

Pure functions of the loaded config (and the stream's state), returning text;
`sidecar/cli/commands.py` prints it. The shared bricks (`when`, ...) are
`sidecar/cli/output.py`'s.
"""

from __future__ import annotations

import contextlib

from sidecar.cli.output import when
from sidecar.config import params
from sidecar.config.addresses import redact_url
from sidecar.config.alerting import describe_job, describe_notify
from sidecar.config.answer import describe_answer
from sidecar.config.fields import format_duration
from sidecar.config.load import Config, JobConfig
from sidecar.config.model import AnswerConfig
from sidecar.core.clock import rfc3339
from sidecar.core.errors import ScheduleError
from sidecar.store.stream import StreamState
from sidecar.when.describe import schedule_lines
from sidecar.when.slots import utc_text


def _overlap_words(job: JobConfig) -> str:
    """What ``check`` says of a job's overlap policy."""
    if job.overlap == "replace":
        c = job.cancel
        return (
            f"a new slot stops the running run ({c.method} {c.path or job.request.path}, "
            f"X-Anarchon-Cancel; grace {format_duration(c.grace)}), then runs"
        )
    if job.overlap == "buffer_one":
        return "one slot that falls during a run is kept and runs right after it"
    return "a slot that falls during a run is skipped"


# The run id in check's example of a rendered request (a real one is 32 hex digits).
EXAMPLE_RUN_ID = "5d8a0ddd930d5616b1e006bafbf38ed3"


def _rendered_line(job: JobConfig, instance: str, now_ms: int) -> str:
    """The job's path with its run parameters rendered for its next slot (an example
    run id). Only the path: a header or the body may hold a credential."""
    slot = next(iter(job.schedule.runs(now_ms, 1)), now_ms)
    run = params.values(
        job.name, slot, EXAMPLE_RUN_ID, 1, "scheduled", instance, rfc3339(slot / 1000)
    )
    rendered = params.render_request(job.request, run)
    parts = [
        name
        for name, on in (
            ("headers", dict(rendered.headers) != dict(job.request.headers)),
            ("body", rendered.body != job.request.body),
        )
        if on
    ]
    also = f" (and its {' and '.join(parts)})" if parts else ""
    return f"  run parameters{also}, e.g. for the next slot: {rendered.method} {rendered.path}"


def check_lines(config: Config, now_ms: int) -> list[str]:
    n = config.nats
    replicas = n.replicas if n.replicas is not None else "unchanged (1 when created)"
    lines = [
        f"config OK: instance {config.instance_id}, {len(config.jobs)} job(s), "
        f"stream {n.stream} (prefix {n.prefix}) on {', '.join(map(redact_url, n.servers))}",
        f"history size {config.effective_history_size}, "
        f"duplicate window {format_duration(n.duplicate_window)}, replicas {replicas}",
        *describe_notify(config.notify, config.tracing),
        *(
            f"calendar {name}: {cal.source}, {len(cal.entries)} entries, content hash {cal.digest}"
            for name, cal in config.calendars.items()
        ),
    ]
    for job in config.jobs:
        req = job.request
        where = f"unix:{req.unix_socket} " if req.unix_socket else redact_url(req.base_url)
        if job.after is not None:  # no schedule: each run follows one of another job
            head = [f"{job.name}: {job.after.words()} (trigger after, once per run of it)"]
        else:
            head = [
                f"{job.name}: {job.schedule.expr!r} in {job.timezone.key}",
                *(f"  {line}" for line in schedule_lines(job.schedule)),
            ]
        lines += [
            "",
            *head,
            f"  {req.method} {where}{req.path}  timeout {format_duration(req.timeout)}, "
            f"jitter {format_duration(job.jitter)}, max_late {format_duration(job.max_late)}",
        ]
        if req.params and job.after is None:
            lines.append(_rendered_line(job, config.instance_id, now_ms))
        if told := describe_job(job.ping, job.pause_after, job.expect):
            lines.append(told)
        if job.max_runs is not None:
            lines.append(f"  max_runs {job.max_runs}: counted fleet-wide in count.{job.name}")
        if job.overlap != "allow":
            lines.append(f"  overlap {job.overlap}: {_overlap_words(job)}")
        if (conc := job.concurrency) is not None:
            sharing = [
                j.name for j in config.jobs if j.concurrency and j.concurrency.key == conc.key
            ]
            full = "skipped" if job.overlap == "skip" else "waits up to max_late, then skipped"
            lines.append(
                f"  concurrency {conc.key}: at most {conc.limit} run(s) at once of "
                f"{', '.join(sharing)} (fleet-wide); when all are held, a slot {full}"
            )
        if job.run_on == "every":
            lines.append(
                "  run_on every: each slot runs once on every live instance, on its own app "
                f"(claim id {job.name}:<slot>:every:<instance>)"
            )
        if job.answer != AnswerConfig():  # the default is docs/TRIGGER.md's, said there
            lines.append(f"  {describe_answer(job.answer)}")
        # The next runs: spread moved, exclusions, start_at and end_at applied.
        if job.after is not None:
            continue
        runs = _next_runs(job, now_ms, 3)
        lines += [f"  next: {when(slot, job.timezone)}" for slot in runs]
        if job.schedule.end_ms is not None and not runs:
            lines.append(f"  runs no more: end_at {utc_text(job.schedule.end_ms or 0)} passed")
    return lines


def _next_runs(job: JobConfig, now_ms: int, count: int) -> list[int]:
    """Up to `count` next runs: fewer near the last instant the sidecar names."""
    found: list[int] = []
    with contextlib.suppress(ScheduleError):  # no slot before the year 10000
        while len(found) < count and (slot := job.schedule.next_run(now_ms)) is not None:
            found.append(slot)
            now_ms = slot
    return found


def stream_check_lines(name: str, before: StreamState | None, after: StreamState | None) -> str:
    if before is None or after is None:
        return f"stream {name}: missing; `run` creates it"
    if after == before:
        return f"stream {name}: holds what this config needs"
    return (
        f"stream {name}: `run` raises it: duplicate window "
        f"{format_duration(before.duplicate_window)} -> "
        f"{format_duration(after.duplicate_window)}, history size {before.history_size} -> "
        f"{after.history_size}, replicas {before.replicas} -> {after.replicas}"
    )
