"""The command line of docs/CLI.md: each command parses, calls one function, prints.

What is shown lives in `sidecar/cli/output.py` (and `check_text.py`,
`calendar_text.py`), what is done in `sidecar/ops/streamops.py` (one-shot
commands) and `sidecar/cli/daemon.py` (`run`); loading, failing and the exit
codes every command shares in `sidecar/cli/shared.py`. The group and `run`
are here, every other command in `sidecar/cli/commands.py` (or
`sidecar/cli/calendar_commands.py`, `job_commands.py`, `forget_command.py`),
imported by the first of them asked for (``LATER``): `run` leaves their code
unloaded. A new command goes into the module of its kind, gets its line in
``LATER``, and takes
``job_argument``/``config_option``, then ``ld = load(config_path)`` (or
``ld, spec = any_job(load(config_path), job)`` when it names a job), ``result =
call(streamops.something(ld.config, ld.secrets, ...))`` and
``say(output.something(result))``.
"""

from __future__ import annotations

import os
import sys

import click

from sidecar import __version__
from sidecar.cli.shared import (
    Commands,
    ShortOptions,
    call,
    config_option,
    load,
)
from sidecar.core.clock import Clock
from sidecar.obs.logs import setup_logging

# The other commands, by name: (module, attribute), imported when asked for or
# listed (Commands.get_command), so that `run` does not load them.
LATER = {
    "check": ("sidecar.cli.commands", "check"),
    "history": ("sidecar.cli.commands", "history"),
    "last-run": ("sidecar.cli.commands", "last_run"),
    "run-now": ("sidecar.cli.commands", "run_now"),
    "stream": ("sidecar.cli.commands", "stream"),
    "pause": ("sidecar.cli.calendar_commands", "pause"),
    "resume": ("sidecar.cli.calendar_commands", "resume"),
    "skip": ("sidecar.cli.calendar_commands", "skip"),
    "unskip": ("sidecar.cli.calendar_commands", "unskip"),
    "backfill": ("sidecar.cli.calendar_commands", "backfill"),
    "at": ("sidecar.cli.calendar_commands", "at_command"),
    "status": ("sidecar.cli.commands", "status"),
    "forget": ("sidecar.cli.forget_command", "forget"),
    "demo": ("sidecar.cli.commands", "demo"),
    "job": ("sidecar.cli.job_commands", "job_group"),
}


@click.group(cls=Commands, later=LATER, context_settings={"help_option_names": ["-h", "--help"]})
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
    """Run each scheduled job exactly once across app replicas, claimed in NATS JetStream.

    Exit codes, the same for every command: 0 done; 1 a failed run or nothing
    found; 2 a usage or config error or an unknown job; 3 NATS unreachable;
    4 metrics.listen in use; 130 interrupted.
    """
    setup_logging(log_level, log_format)


@main.command(cls=ShortOptions)
@config_option
def run(config_path: str | None) -> None:
    """Run the daemon: claim each slot, trigger the app when won, record the result."""
    from sidecar.cli.daemon import collector_off, start

    with collector_off():
        ld = load(config_path, every_file=True)
        offset = float(os.environ.get("ANARCHON_CLOCK_OFFSET", "0") or 0)
        code = call(start(ld.config, ld.secrets, Clock(offset)))
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
