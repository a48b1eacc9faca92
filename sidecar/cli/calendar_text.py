"""What the commands that change when a job runs say: pause, resume, skip,
backfill, at (sidecar/cli/calendar_commands.py).

Pure functions of what a command did, returning text. What a pause or a one-off
run carries was written by whoever may write the state bucket: it goes through
`printable` (sidecar/cli/output.py) before it is shown.
"""

from __future__ import annotations

import shlex
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sidecar.cli.output import printable, when
from sidecar.config.load import JobConfig
from sidecar.core.clock import rfc3339


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
