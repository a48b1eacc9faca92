"""The command line of SPEC.md. It parses arguments, sets up logging and runs.

Exit codes: 0 done, 1 a failed run or nothing found, 2 a config error (one
line naming the key, no traceback), 3 NATS unreachable.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import click

from sidecar import __version__
from sidecar.clock import Clock
from sidecar.config import Config, load_config, load_secrets
from sidecar.durations import format_duration
from sidecar.errors import ConfigError, ConnectError, SidecarError, StreamError

T = TypeVar("T")

EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3

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
        where = req.unix_socket or req.base_url
        click.echo("")
        click.echo(f"{job.name}: {job.schedule.expr!r} in {job.timezone.key}")
        click.echo(
            f"  {req.method} {where}{req.path}  timeout {format_duration(req.timeout)}, "
            f"jitter {format_duration(job.jitter)}, max_late {format_duration(job.max_late)}"
        )
        for slot in job.schedule.slots(now, 3):
            click.echo(f"  next: {_when(slot, job.timezone)}")


if __name__ == "__main__":  # pragma: no cover
    main()
