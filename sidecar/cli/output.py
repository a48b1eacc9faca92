"""What the command line shows: tables, JSON and messages.

Pure functions of what a command found, returning text; `sidecar/cli/main.py`
prints it. Anything read from the stream or the state bucket is hostile
(anyone who can publish there, or an app's error body, could otherwise move
the cursor or recolour the operator's terminal): it goes through
`printable` before it reaches a table.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from sidecar.config import params
from sidecar.config.alerting import describe_job, describe_notify
from sidecar.config.answer import describe_answer
from sidecar.config.fields import UNSHOWN_RE, format_duration, redact_url
from sidecar.config.load import Config, JobConfig
from sidecar.config.model import AnswerConfig
from sidecar.core.clock import parse_rfc3339, rfc3339
from sidecar.core.errors import ScheduleError
from sidecar.store.runs import History, Run
from sidecar.store.stream import Lowering, StreamState
from sidecar.when.describe import schedule_lines
from sidecar.when.slots import utc_text

if TYPE_CHECKING:
    from sidecar.ops.streamops import ManualRun

# Job names listed in full in an unknown-job error; more are counted.
MAX_LISTED = 20
# Subjects listed in full by `stream --lower`; more are counted.
MAX_SUBJECTS = 20

# ---------------------------------------------------------------------- text helpers


# C0 and C1 control characters.
def printable(text: str) -> str:
    """`text` with what would hide or reorder it on a terminal (controls, bidi
    overrides and isolates, invisible characters) shown escaped (``\\u202e``)."""
    return UNSHOWN_RE.sub(lambda m: repr(m.group())[1:-1], text)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell (control characters shown escaped)."""
    cells = [[printable(str(c)) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]


def local_time(text: str | None, tz: ZoneInfo) -> str:
    if not text:
        return "-"
    try:
        return datetime.fromtimestamp(parse_rfc3339(text), tz).strftime("%Y-%m-%d %H:%M:%S %Z")
    except (ValueError, OverflowError, OSError):  # not a time, or out of datetime's range
        return text


def when(epoch_ms: int, tz: Any) -> str:
    utc = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return f"{utc.astimezone(tz):%Y-%m-%d %H:%M:%S %Z}  ({utc:%Y-%m-%dT%H:%M:%SZ})"


def as_json(value: Any) -> str:
    return json.dumps(value)


# ---------------------------------------------------------------------- job names


def closest_name(name: str, known: Sequence[str]) -> str | None:
    """The known name `name` most likely misspells: same but for case, else the nearest."""
    for candidate in known:
        if candidate.casefold() == name.casefold():
            return candidate
    import difflib  # only for a name that is not known: not on the way to ready

    matches = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_job(name: str, known: Sequence[str], where: str) -> str:
    """``no job named 'x' in the config; did you mean 'y'? (jobs: ...)``."""
    closest = closest_name(name, known)
    hint = f"; did you mean {closest!r}?" if closest else ""
    listed = ", ".join(known[:MAX_LISTED]) or "none"
    if len(known) > MAX_LISTED:
        listed += f", and {len(known) - MAX_LISTED} more"
    return f"no job named {name!r} {where}{hint} (jobs: {listed})"


# ---------------------------------------------------------------------- messages


def no_stream(config: Config) -> str:
    return f"no stream {config.nats.stream} yet: `run` or `run-now` creates it"


def no_runs(job: str, config: Config) -> str:
    return f"no runs of {job} in stream {config.nats.stream}"


def history_notes(hist: History, job: str, config: Config) -> list[str]:
    """What reading the history skipped, and why."""
    notes = []
    if hist.future:
        window = format_duration(config.nats.duplicate_window)
        notes.append(
            f"({hist.future} claim(s) of {job} for a slot more than {window}"
            " (nats.duplicate_window) ahead skipped: forged, or from a clock far off)"
        )
    if hist.skipped > hist.future:
        notes.append(
            f"({hist.skipped - hist.future} malformed or foreign message(s) on {job}'s subjects"
            " skipped)"
        )
    return notes


# ---------------------------------------------------------------------- check


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


# ---------------------------------------------------------------------- history, last-run


def run_marks(r: Run) -> str:
    """What a run was besides a plain scheduled one: its trigger (manual, backfill,
    catchup, retry, rerun) and its attempt after the first; "" for a scheduled run."""
    kind = r.trigger or ("manual" if r.manual else "scheduled")
    marks = [kind] if kind != "scheduled" else []
    if r.attempt > 1:
        marks.append(f"attempt {r.attempt}")
    return f" ({', '.join(marks)})" if marks else ""


def runs_table(runs: list[Run], tz: ZoneInfo) -> list[str]:
    header = ("SCHEDULED", "INSTANCE", "STATUS", "HTTP", "DURATION", "ERROR")
    rows = [
        (
            local_time(r.scheduled_at, tz) + run_marks(r),
            r.instance,
            r.status,
            str(r.http_status) if r.http_status is not None else "-",
            f"{r.duration_ms} ms" if r.duration_ms is not None else "-",
            r.error or "",
        )
        for r in runs
    ]
    return table(header, rows)


# ---------------------------------------------------------------------- run-now

# How often run-now says it is still retrying an app that is not reachable.
PROGRESS_EVERY = 5.0


class RetryProgress:
    """run-now's lines while the app is not reachable: what, how long, how far."""

    def __init__(self, job: str, retry_for: float, say: Callable[[str], None]) -> None:
        self.job = job
        self.retry_for = retry_for
        self.say = say
        self.started = 0.0
        self.last = 0.0

    def __call__(self, attempts: int, why: Exception, remaining: float) -> None:
        now = time.monotonic()
        if attempts == 1:
            self.started = self.last = now
            self.say(
                f"{self.job}: app not reachable ({why}); retrying for up to "
                f"{format_duration(self.retry_for)} (--timeout to change)"
            )
        elif now - self.last >= PROGRESS_EVERY:
            self.last = now
            self.say(
                f"{self.job}: still not reachable after {now - self.started:.0f}s "
                f"({attempts} attempts); giving up in {remaining:.0f}s"
            )


def manual_run(job: str, done: ManualRun) -> str:
    r = done.result
    http = f"HTTP {r.http_status}" if r.http_status is not None else "no HTTP status"
    return printable(
        f"{job}: manual run {done.token} {'succeeded' if r.ok else 'failed'} "
        f"({http}, {round(r.duration * 1000)} ms)" + (f": {r.error}" if r.error else "")
    )


# ---------------------------------------------------------------------- stream


def stream_missing_json(config: Config, domain: str | None, cluster: str | None) -> str:
    """`stream --json` before the stream exists: who answered, and that it is missing."""
    return as_json(
        {
            "name": config.nats.stream,
            "exists": False,
            "domain": domain,
            "cluster": cluster,
            "jobs_not_held": {},
        }
    )


def stream_missing(config: Config, domain: str | None, cluster: str | None) -> str:
    return (
        f"{no_stream(config)} (JetStream domain {domain or '(none)'}, "
        f"cluster {cluster or '(none)'})"
    )


def stream_json(state: StreamState, weak: dict[str, str]) -> str:
    return as_json({**state.as_dict(), "exists": True, "jobs_not_held": weak})


def stream_lines(
    state: StreamState, placement: str | None, held: int, total: int, weak: dict[str, str]
) -> list[str]:
    rows = [
        ("stream", state.name),
        ("subjects", ", ".join(state.subjects)),
        ("messages", str(state.messages)),
        ("bytes", str(state.bytes)),
        ("history size (per subject)", str(state.history_size)),
        ("duplicate window", format_duration(state.duplicate_window)),
        ("replicas", str(state.replicas)),
        ("storage", state.storage),
        ("sequences", f"{state.first_seq}..{state.last_seq}"),
        ("JetStream domain", state.domain or "(none)"),
        ("cluster", state.cluster or "(none)"),
    ]
    if state.max_age:
        rows.append(("max age", format_duration(state.max_age)))
    if state.leader:
        rows.append(("leader", state.leader))
    if placement:
        rows.append(("placement", placement))
    rows.append(("jobs of this config held", f"{held} of {total}"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{key.ljust(width)}  {value}" for key, value in rows]
    return lines + [f"  {job}: not claimed while {why}" for job, why in sorted(weak.items())]


def lowering_lines(plan: Lowering) -> list[str]:
    st = plan.state
    if not plan.changes:
        return [f"stream {st.name} already has this config's window and history size"]
    lines = [
        f"stream {st.name}: duplicate window {format_duration(st.duplicate_window)} -> "
        f"{format_duration(plan.duplicate_window)}, history size {st.history_size} -> "
        f"{plan.history_size} per subject",
        f"this deletes {plan.deleted} message(s) on {len(plan.deletes)} subject(s)"
        + (":" if plan.deletes else ""),
    ]
    lines += [f"  {s}: {count}" for s, count in list(plan.deletes.items())[:MAX_SUBJECTS]]
    if len(plan.deletes) > MAX_SUBJECTS:
        lines.append(f"  ... and {len(plan.deletes) - MAX_SUBJECTS} more subject(s)")
    lines.append(
        "jobs of other instances whose jitter + max_late no longer fit the window stop being "
        "claimed; an instance whose config needs more raises the stream again within 10 s"
    )
    return lines


def lowered(state: StreamState) -> str:
    return (
        f"stream {state.name} lowered: duplicate window "
        f"{format_duration(state.duplicate_window)}, history size {state.history_size}"
    )


# ---------------------------------------------------------------------- pause, resume


def paused(job: str, value: dict[str, Any]) -> str:
    reason = value.get("reason")
    until = value.get("until")
    return printable(
        f"{job}: paused by {value.get('by', '?')} at {value.get('at', '?')}"
        + (f" until {until}" if until else "")
        + (f" ({reason})" if reason else "")
    )


PAUSE_UNTIL_EFFECT = (
    "every running sidecar stops claiming it within about a second; each slot kept from "
    "running is recorded skipped (reason paused). It resumes by itself at its end, on every "
    "sidecar, even if no command runs then."
)


PAUSE_EFFECT = (
    "every running sidecar stops claiming it within about a second, and sidecars started "
    "later stay paused; a slot whose claim was already published still runs. "
    "Missed slots are not run on resume (`{resume}`)."
)


def command_line(words: str, config_path: str | None) -> str:
    """A command to run next, as the user can paste it: with the ``-c FILE`` the
    command at hand was given (none when it read $ANARCHON_CONFIG, still set)."""
    given = f" -c {shlex.quote(config_path)}" if config_path else ""
    return f"anarchon-sidecar {words}{given}"


def resumed(job: str, was: dict[str, Any]) -> str:
    return printable(
        f"{job}: resumed (paused by {was.get('by', '?')} at {was.get('at', '?')}); "
        "its next slot runs, missed slots do not"
    )


def skipping(
    job: JobConfig, added: list[int], now_pending: int, config_path: str | None
) -> list[str]:
    unskip = command_line(f"unskip {job.name}", config_path)
    return [f"{job.name}: skipping {when(slot, job.timezone)}" for slot in added] + [
        f"{job.name}: {now_pending} slot(s) to skip in all; `{unskip}` cancels what is "
        "left (a slot less than half a second away is left to run)"
    ]


def backfill_lines(job: JobConfig, plan: Any, trigger: str, dry_run: bool) -> list[str]:
    lines = (
        [f"{job.name}: would run {when(slot, job.timezone)}" for slot in plan.slots]
        if (dry_run)
        else []
    )
    if plan.already:
        lines.append(
            f"{job.name}: {len(plan.already)} slot(s) a backfill ran before are left out "
            "(--again runs them anew)"
        )
    verb = "would queue" if dry_run else "queued"
    lines.append(
        f"{job.name}: {verb} {len(plan.slots)} slot(s) (trigger {trigger}); the fleet runs "
        "them one at a time: see `status` and `history`"
    )
    return lines


# ---------------------------------------------------------------------- at


def _local_ms(epoch_ms: int, tz: ZoneInfo) -> str:
    return f"{datetime.fromtimestamp(epoch_ms / 1000, tz):%Y-%m-%d %H:%M:%S %Z}"


def at_lines(job: JobConfig, runs: list[Any], what: str) -> list[str]:
    """``at --list`` / ``at --cancel``: one line per one-off run, in UTC and the job's zone."""
    if not runs:
        return [f"{job.name}: no one-off run {what}"]
    return [
        printable(
            f"{job.name}: {what} one-off run at {rfc3339(r.slot / 1000)} "
            f"({_local_ms(r.slot, job.timezone)}) by {r.by}" + (f": {r.reason}" if r.reason else "")
        )
        for r in runs
    ]


def at_queued(job: JobConfig, done: Any, config_path: str | None) -> list[str]:
    """``at JOB TIME``: what was queued, and what runs it."""
    run = done.run
    when = f"{rfc3339(run.slot / 1000)} ({_local_ms(run.slot, job.timezone)})"
    if not done.new:
        head = f"{job.name}: a one-off run at {when} was queued already by {run.by}; kept"
    else:
        head = f"{job.name}: one-off run queued at {when}"
    cancel = command_line(f"at {job.name} --cancel {rfc3339(run.slot / 1000)}", config_path)
    return [
        printable(head),
        f"  claim id {job.name}:{run.slot}:at, run by one sidecar of the fleet within "
        f"jitter {job.jitter:g}s (not later than max_late {job.max_late:g}s); "
        f"{len(done.pending)} pending; cancel: {printable(cancel)}",
    ]
