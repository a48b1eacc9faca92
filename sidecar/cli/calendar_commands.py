"""The commands that change when a job runs: pause, resume, skip, unskip, backfill, at.

Each parses its options (instants typed as RFC 3339 or a duration, checked
here: exit 2 naming the option), calls one function of sidecar/ops/ (or the
act it shares with the fleet page in sidecar/admin/) and prints what
sidecar/cli/calendar_text.py says. Imported, as sidecar/cli/commands.py is, by the
first of them the command line asks for (sidecar/cli/main.py ``LATER``).
"""

from __future__ import annotations

import time

import click

from sidecar.cli import calendar_text, output
from sidecar.cli.shared import (
    EXIT_FAILED,
    EXIT_USAGE,
    Loaded,
    Whole,
    any_job,
    call,
    config_option,
    fail,
    fleet_once,
    job_argument,
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
from sidecar.core.errors import ConfigError, StreamNotFound
from sidecar.when.atkey import instant_problem, on_schedule
from sidecar.when.pauses import MAX_SKIP


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
        say(f"{calendar_text.paused(job, done.value)}: kept (--force replaces it)")
        note(f"{job} was already paused; nothing changed")
        return
    if done.replaced is not None:
        was = calendar_text.paused(job, done.replaced)
        note(was.replace(": paused", ": replaced the pause", 1))
    effect = calendar_text.PAUSE_UNTIL_EFFECT if until is not None else calendar_text.PAUSE_EFFECT
    resume = calendar_text.command_line(f"resume {job}", config_path)
    say([calendar_text.paused(job, done.value), effect.format(resume=resume)])


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
    say(calendar_text.resumed(job, was) + (" (--catchup runs them)" if not catchup else ""))
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
    say(calendar_text.skipping(spec, added, left, config_path))


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
    say(calendar_text.backfill_lines(job, plan, trigger, dry_run))


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
            else calendar_text.at_lines(spec, runs, "pending"))  # fmt: skip
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
            say(calendar_text.at_lines(spec, gone, "cancelled"))
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
        say(calendar_text.at_queued(spec, done, config_path))


def _at_slot(option: str, text: str, now: float) -> int:
    """TIME of `at`: RFC 3339 or a duration from now, as epoch ms; else exit 2."""
    from sidecar.config.instants import instant_of

    try:
        return round(instant_of(text, now) * 1000)
    except ValueError as exc:
        fail(EXIT_USAGE, f"{option}: {exc}")
