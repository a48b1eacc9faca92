"""`anarchon-sidecar forget JOB`: the keys of a job retired from the whole fleet, removed.

The fleet never removes them on its own (docs/GUARANTEES.md); what is
removed and what is refused is sidecar/ops/forget.py's.
"""

from __future__ import annotations

import click

from sidecar.cli.output import printable
from sidecar.cli.shared import (
    EXIT_FAILED,
    EXIT_USAGE,
    call,
    config_option,
    fail,
    job_argument,
    load,
    note,
    say,
)
from sidecar.config.keys import JOB_NAME
from sidecar.core.errors import StreamNotFound


@click.command()
@job_argument
@config_option
def forget(job: str, config_path: str | None) -> None:
    """Remove every key of JOB, a job no sidecar runs any more, from the state bucket:
    its pause, max_runs count, skips, one-off runs, backfill, catch-up bound, kept
    slot, due attempts, health and recorded acts. Exit 1 when a live instance runs
    JOB, a run of it holds a lease, or nothing was there."""
    from sidecar.ops.forget import forget as forget_keys

    if not JOB_NAME.fullmatch(job):
        fail(EXIT_USAGE, f"bad job name {printable(repr(job))}: letters, digits, _ and - only")
    ld = load(config_path)
    if job in ld.config.job_names:
        fail(
            EXIT_USAGE,
            f"{job} is a job of the config file: the sidecars of this config run it; "
            "remove it from every config first",
        )
    try:
        done = call(forget_keys(ld.config, ld.secrets, job))
    except StreamNotFound as exc:
        fail(EXIT_FAILED, str(exc))
    for key in done.kept:
        note(f"{key}: written again meanwhile: kept (run forget again to remove it)")
    if not done.removed:
        fail(EXIT_FAILED, f"{job}: no key of this job in the state bucket")
    say(f"{job}: forgotten: removed {', '.join(done.removed)}")
    if done.kept:
        raise SystemExit(EXIT_FAILED)
