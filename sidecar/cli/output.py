"""What the command line shows: tables, JSON and messages.

Pure functions of what a command found, returning text; the command prints it.
Here: the bricks every command's text is built of (`printable`, `table`, `when`,
`as_json`), an unknown job's message, and what history, last-run, run-now and
stream say; what `check` says is `check_text.py`'s, what the commands that
change when a job runs say `calendar_text.py`'s. Anything read from the
stream or the state bucket is hostile (anyone who can publish there, or an
app's error body, could otherwise move the cursor or recolour the operator's
terminal): it goes through `printable` before it reaches a table.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from sidecar.config.fields import UNSHOWN_RE, format_duration
from sidecar.config.load import Config
from sidecar.core.clock import parse_rfc3339
from sidecar.store.runs import History, Run
from sidecar.store.stream import Lowering, StreamState

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
