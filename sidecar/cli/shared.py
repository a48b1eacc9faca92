"""What every command of `sidecar/cli/main.py` shares: one way to load, fail and exit.

Each command loads its config and secrets with `load`, runs its one function
with `call` (which turns the sidecar's errors into exit codes) and checks job
names with `any_job`, so the same mistake gets the same answer in every
command. Data (tables, JSON) goes to stdout; notes that there is nothing to
show, warnings and errors go to stderr. The exit codes (docs/CLI.md):

    0    done (an empty history or a stream not created yet is an answer)
    1    the run failed, or what was asked for is not there (last-run: no
         run; resume: not paused; stream --lower: not confirmed); JetStream
         refused or did not answer
    2    usage or config error: an option, the config, a secret file, an
         unknown job (with the closest name), another stream in the way
    3    NATS unreachable
    4    the config is valid but this host refuses metrics.listen (in use)
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar
from zoneinfo import ZoneInfo

import click

from sidecar.admin.tokens import TokenFile
from sidecar.config.fields import MAX_REASON, parse_duration, shown_text, whole
from sidecar.config.load import JOB_NAME, Config, JobConfig, Secrets, load_config, load_secrets
from sidecar.core.errors import (
    ConfigError,
    ConnectError,
    ListenError,
    SidecarError,
    StreamConflict,
    StreamNotFound,
    UnknownJob,
)

T = TypeVar("T")

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_BUSY = 4
EXIT_INTERRUPTED = 130


def say(lines: str | list[str]) -> None:
    for line in [lines] if isinstance(lines, str) else lines:
        click.echo(line)


def note(text: str) -> None:
    """A line for the person, not for a script: stderr."""
    click.echo(text, err=True)


def fail(code: int, message: str) -> NoReturn:
    """Say what failed on stderr and exit `code`; under --json also the error object."""
    click.echo(f"anarchon-sidecar: {message}", err=True)
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.params.get("as_json"):
        say(json_error(code, message))
    sys.exit(code)


def json_error(code: int, message: str) -> str:
    """What --json prints on stdout when the command fails: one line, one object,
    ``{"error": "<the message of stderr>", "exit": <the exit code>}`` (docs/CLI.md)."""
    return json.dumps({"error": message, "exit": code})


class Commands(click.Group):
    """The command group; a usage error of a command given --json (an unknown
    option, a bad value) also prints the JSON error object on stdout.

    `later`: commands by name as (module, attribute), imported when first asked
    for or listed: `run` leaves the other commands' code unloaded. A name that
    is no command gets the closest one."""

    def __init__(
        self, *args: Any, later: dict[str, tuple[str, str]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.later = dict(later or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.later})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = self.later.pop(cmd_name, None)
        if where is not None and cmd_name not in self.commands:
            module, name = where
            command = getattr(importlib.import_module(module), name)
            assert isinstance(command, click.Command)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """click's, plus the closest command name when none is called so (as a
        mistyped job name gets the closest job)."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            name = args[0] if args else ""
            if name and not name.startswith("-") and self.get_command(ctx, name) is None:
                import difflib  # a mistake's path only: `run` never loads it

                close = difflib.get_close_matches(name, self.list_commands(ctx), n=1)
                if close:
                    guess = f"{exc.message} Did you mean {close[0]!r}?"
                    raise click.UsageError(guess, ctx) from None
            raise

    def invoke(self, ctx: click.Context) -> Any:
        given = [*ctx.args]  # the command's own arguments: invoke empties ctx.args
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            if "--json" in given:
                say(json_error(exc.exit_code, exc.format_message()))
            raise


class ShortOptions(click.Command):
    """A command whose ``-c F`` does not load difflib (``run``: paid for the daemon's life).

    click tries every option word as a long option first; when none matches it
    builds a NoSuchOption holding the closest long names (difflib, 0.2 MiB of
    RSS once imported) and then, for a single-dash word, drops that error and
    matches the short option. Here a single-dash word that is no long option
    fails that first try without the guess; a mistyped ``--option`` still gets
    click's "Did you mean". A click without these parser internals parses as it
    always did.
    """

    def make_parser(self, ctx: click.Context) -> Any:
        parser = super().make_parser(ctx)
        match_long = getattr(parser, "_match_long_opt", None)
        long_opts = getattr(parser, "_long_opt", None)
        if not callable(match_long) or not isinstance(long_opts, dict):
            return parser

        def match(opt: str, explicit_value: str | None, state: Any) -> None:
            if opt not in long_opts and not opt.startswith("--"):
                raise click.NoSuchOption(opt, ctx=ctx)  # the short option is tried next
            match_long(opt, explicit_value, state)

        setattr(parser, "_match_long_opt", match)  # noqa: B010 (an instance attribute)
        return parser


def config_error(exc: ConfigError) -> str:
    """``config error: <key>: <what>``; an error of the file as a whole (key
    ``config``: no file, bad YAML) without the key, its message names the file."""
    return f"config error: {exc.message if exc.key == 'config' else exc}"


@dataclass(frozen=True)
class Loaded:
    config: Config
    secrets: Secrets


def load(path: str | None, secrets: bool = True, every_file: bool = False) -> Loaded:
    """The config (and its secret files) or exit 2 naming the key.

    `every_file`: also every other file `run` reads at start (``admin.token_file``),
    so that `check` refuses what `run` refuses; the one-shot commands leave it
    alone (an operator may not be allowed to read it, and they do not need it).
    """
    try:
        config = load_config(path, os.environ)
        if not (secrets or every_file):
            return Loaded(config, Secrets())
        read = load_secrets(config, os.environ)
        if every_file and config.admin.page:
            TokenFile(config.admin.token_file).load()
        return Loaded(config, read)
    except ConfigError as exc:
        fail(EXIT_USAGE, config_error(exc))


# The event loop: asyncio's own unless ANARCHON_EVENT_LOOP=uvloop and the
# optional extra is installed (pip install 'anarchon-sidecar[uvloop]').
EVENT_LOOP_ENV = "ANARCHON_EVENT_LOOP"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop ANARCHON_EVENT_LOOP asks for; None: asyncio's default. Exits 2 on a bad one."""
    name = os.environ.get(EVENT_LOOP_ENV, "").strip().lower()
    if name in ("", "asyncio"):
        return None
    if name != "uvloop":
        fail(EXIT_USAGE, f"{EVENT_LOOP_ENV}={name!r}: use asyncio or uvloop")
    try:
        import uvloop  # only when asked for: the default install never has it
    except ImportError:
        fail(
            EXIT_USAGE,
            f"{EVENT_LOOP_ENV}=uvloop but uvloop is not installed: "
            "pip install 'anarchon-sidecar[uvloop]'",
        )
    new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return new_loop


def call(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro`; the sidecar's errors become exit codes (StreamNotFound and
    UnknownJob pass through: only the command knows what they mean to it)."""
    try:
        factory = loop_factory()
    except SystemExit:
        coro.close()
        raise
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)
    except (StreamNotFound, UnknownJob):
        raise
    except ConfigError as exc:
        fail(EXIT_USAGE, config_error(exc))
    except StreamConflict as exc:  # final until someone changes a stream: like a config error
        fail(EXIT_USAGE, str(exc))
    except ConnectError as exc:
        fail(EXIT_UNREACHABLE, str(exc))
    except ListenError as exc:
        fail(EXIT_BUSY, str(exc))
    except SidecarError as exc:
        fail(EXIT_FAILED, str(exc))
    except KeyboardInterrupt:
        fail(EXIT_INTERRUPTED, "interrupted")


def unknown_job(name: str, known: tuple[str, ...], where: str) -> NoReturn:
    from sidecar.cli.output import unknown_job  # a mistake's path: not loaded by `run`

    fail(EXIT_USAGE, unknown_job(name, known, where))


def any_job(ld: Loaded, name: str) -> tuple[Loaded, JobConfig]:
    """The job named `name`: the config file's, else the one added with `job add`
    (``job.<name>`` of the state bucket, checked as every sidecar checks it), with
    a `Loaded` whose config holds it; exit 2 with the closest name when neither
    has it (docs/CONFIG.md: a bucket job is paused, skipped and backfilled alike)."""
    if name in ld.config.job_names:
        return ld, ld.config.job(name)
    where = "in the config or in the state bucket"
    if not JOB_NAME.fullmatch(name):  # no key can have that name: nothing to ask NATS
        unknown_job(name, ld.config.job_names, where)
    from sidecar.ops import jobops  # a job of the file needs none of it

    async def lookup() -> tuple[JobConfig | None, tuple[str, ...] | None]:
        try:
            return await jobops.read_job(ld.config, ld.secrets, name)
        except ConnectError:  # a typo is still a usage error (exit 2), said as such
            return None, None

    job, names = call(lookup())
    if names is None:
        where = "in the config (NATS is unreachable: the state bucket's jobs were not read)"
    if job is None:
        unknown_job(name, (*ld.config.job_names, *(names or ())), where)
    config = dataclasses.replace(ld.config, jobs=(*ld.config.jobs, job))
    return Loaded(config, ld.secrets), job


def fleet_once(job: JobConfig, command: str) -> None:
    """`command` (run-now, backfill, at) runs a slot once for the fleet: exit 2 for a
    ``run_on: every`` job, whose runs are each instance's own (docs/CONFIG.md)."""
    if job.run_on == "every":
        fail(
            EXIT_USAGE,
            f"{command} runs a slot of {job.name} once for the fleet, but {job.name} has "
            "run_on: every (each instance runs each slot itself): not supported",
        )


def job_timezone(config: Config, name: str) -> ZoneInfo:
    """The job's timezone; UTC for a job of another scheduler sharing the stream."""
    if not JOB_NAME.fullmatch(name):
        fail(EXIT_USAGE, f"bad job name {name!r}: letters, digits, _ and - only")
    for job in config.jobs:
        if job.name == name:
            return job.timezone
    return ZoneInfo("UTC")


config_option = click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file (YAML). Default: $ANARCHON_CONFIG.",
)


def _job_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A job's name as the config allows it: ASCII letters, digits, _ and - (a token of
    the NATS subjects); anything else exits 2 before it is used or shown."""
    if not JOB_NAME.fullmatch(value):
        raise click.BadParameter(
            f"{shown(value)} is not a job name: letters, digits, _ and - only", ctx, param
        )
    return value


def shown(value: str) -> str:
    """`value` quoted, cut and escaped for an error message."""
    from sidecar.cli.output import printable  # a mistake's path: not loaded by `run`

    return printable(repr(value if len(value) <= 60 else value[:57] + "..."))


job_argument = click.argument("job", callback=_job_name)
name_argument = click.argument("name", callback=_job_name)


def _reason(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return shown_text(value, "", MAX_REASON)
    except ConfigError as exc:
        raise click.BadParameter(exc.message, ctx, param) from None


def reason_option(shown_by: str) -> Callable[[FC], FC]:
    """``--reason``: at most MAX_REASON characters, none hidden or reordering."""
    return click.option(
        "--reason",
        default="",
        callback=_reason,
        help=f"Why ({MAX_REASON} characters at most): shown {shown_by}.",
    )


FC = TypeVar("FC", bound=Callable[..., Any])


def json_option(what: str) -> Callable[[FC], FC]:
    return click.option("--json", "as_json", is_flag=True, help=f"{what}, on stdout.")


class Whole(click.IntRange):
    """click's IntRange in ASCII digits only: int() also reads other scripts' (``٣``)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            try:
                value = whole(value)
            except ValueError:
                self.fail(f"{value!r} is not a whole number in ASCII digits", param, ctx)
        return super().convert(value, param, ctx)


def duration_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A duration with a unit, as in the config (``30s``, ``2m``, ``1m30s``)."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():  # int() also reads other scripts' digits
        if int(text) == 0:
            return 0.0
        raise click.BadParameter(f"{text!r} has no unit: write e.g. {text}s", ctx, param)
    try:
        return parse_duration(text, "")
    except ConfigError:
        raise click.BadParameter(
            f"not a duration: {text!r} (e.g. 500ms, 30s, 2m, 1m30s)", ctx, param
        ) from None


def who() -> str:
    """Who pauses: user@host, as an operator would want to read it at 3 a.m."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no user name in a container: the uid says enough
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"
