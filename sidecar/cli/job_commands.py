"""`anarchon-sidecar job add/update/remove/list`: jobs added at run time.

They live in the state bucket (``job.<name>``, sidecar/ops/jobops.py) and
every running sidecar takes them up within about a second. A job is checked
here exactly as the daemon will check it: a bad one exits 2 naming the key.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import click

from sidecar.admin.jobcheck import BucketJob, external_id
from sidecar.admin.jobwrite import Written, prepare
from sidecar.cli import output
from sidecar.cli.output import printable, table
from sidecar.cli.shared import (
    EXIT_FAILED,
    EXIT_USAGE,
    Loaded,
    call,
    config_error,
    config_option,
    fail,
    json_option,
    load,
    name_argument,
    say,
    who,
)
from sidecar.core.errors import ConfigError
from sidecar.ops import jobops


@click.group("job")
def job_group() -> None:
    """Jobs added at run time: kept in the state bucket, run by every sidecar beside
    the config file's (a job of the file wins over one of the same name)."""


@dataclass(frozen=True)
class _Prepared:
    loaded: Loaded
    spec: BucketJob
    value: dict[str, Any]
    id_given: bool  # by --id or in FILE


def _prepared(config_path: str | None, file: str, ident: str | None) -> _Prepared:
    """FILE's job checked as a sidecar checks it (exit 2 naming the key)."""
    ld = load(config_path)
    try:
        data = jobops.read_job_file(file)
        spec, value = prepare(ld.config, data, ident, who())
    except ConfigError as exc:
        fail(EXIT_USAGE, config_error(exc))
    given = ident is not None or (isinstance(data, dict) and data.get("id") is not None)
    return _Prepared(ld, spec, value, given)


_ID_HELP = (
    "The job's external id (default: the id in FILE, else the job's name): adding the "
    "same job with the same id again changes nothing."
)


@job_group.command("add")
@click.argument("file")
@config_option
@click.option("--id", "ident", default=None, help=_ID_HELP)
def add(file: str, config_path: str | None, ident: str | None) -> None:
    """Add the job in FILE (YAML or JSON, one entry of jobs:; - reads standard input).

    Exit 0 when added or already there with the same id and settings; 1 when
    the bucket has the job with another id or other settings (`job update`).
    """
    p = _prepared(config_path, file, ident)
    ld = p.loaded
    done = call(jobops.add(ld.config, ld.secrets, p.spec, p.value))
    say(_done_line(done, p.spec))


@job_group.command("update")
@click.argument("file")
@config_option
@click.option("--id", "ident", default=None, help="Update only if the job has this id.")
def update(file: str, config_path: str | None, ident: str | None) -> None:
    """Replace the job of the state bucket named in FILE; exit 1 when there is none."""
    p = _prepared(config_path, file, ident)
    ld = p.loaded
    done = call(jobops.update(ld.config, ld.secrets, p.spec, p.value, p.id_given))
    say(_done_line(done, p.spec))


@job_group.command("import")
@click.argument("file")
@config_option
@json_option("One JSON object per job, per line: name, id, result, why")
def import_jobs(file: str, config_path: str | None, as_json: bool) -> None:
    """Add or update every job in FILE (a list of jobs as `job add` takes them, YAML or
    JSON; - reads standard input), idempotent by id: one answer per job.

    Every job is checked first: one bad job exits 2 naming it and nothing is
    written. Exit 0 when every job is there as FILE says; 1 when one was refused
    (held by another id, or bucket_jobs.max_jobs reached).
    """
    from sidecar.ops import jobimport

    ld = load(config_path)
    try:
        items = jobimport.read_import_file(file)
    except ConfigError as exc:
        fail(EXIT_USAGE, config_error(exc))
    prepared, problems = jobimport.prepare_all(ld.config, items, who())
    if problems:
        fail(EXIT_USAGE, "\n".join(["nothing imported:", *(printable(p) for p in problems)]))
    done = call(jobimport.import_jobs(ld.config, ld.secrets, prepared))
    if as_json:
        say([output.as_json(o.as_dict()) for o in done])
    else:
        for o in done:
            why = f": {o.why}" if o.why else ""
            say(printable(f"{o.name} (id {o.id}): {o.what}{why}"))
        counts = {w: sum(o.what == w for o in done) for w in ("created", "updated", "unchanged")}
        refused = sum(o.what == jobimport.REFUSED for o in done)
        say(
            f"{len(done)} jobs: {counts['created']} created, {counts['updated']} updated, "
            f"{counts['unchanged']} unchanged, {refused} refused"
        )
    sys.exit(EXIT_FAILED if any(o.what == jobimport.REFUSED for o in done) else 0)


@job_group.command("remove")
@name_argument
@config_option
@click.option("--id", "ident", default=None, help="Remove only if the job has this id.")
def remove(name: str, config_path: str | None, ident: str | None) -> None:
    """Remove job NAME from the state bucket: every sidecar stops claiming it (a run in
    flight finishes); exit 1 when there is none."""
    ld = load(config_path)
    if name in ld.config.job_names:
        fail(EXIT_USAGE, f"{name} is a job of the config file: remove it there")
    if ident is not None:
        try:
            external_id(ident, "--id")
        except ConfigError as exc:
            fail(EXIT_USAGE, str(exc))
    done = call(jobops.remove(ld.config, ld.secrets, name, ident))
    say(f"{done.name}: removed from the state bucket (id {printable(done.id)})")


@job_group.command("list")
@config_option
@json_option("One JSON object per job of the state bucket, per line")
def list_jobs(config_path: str | None, as_json: bool) -> None:
    """The jobs of the state bucket: id, who wrote them, and whether they run."""
    ld = load(config_path)
    items = call(jobops.read_listing(ld.config, ld.secrets))
    if as_json:
        say([output.as_json(item) for item in items])
        return
    if not items:
        say("no jobs in the state bucket")
        return
    rows = [
        tuple(str(item[k] or "-") for k in ("name", "id", "state", "by", "at")) for item in items
    ]
    say(table(("JOB", "ID", "STATE", "BY", "AT"), rows))
    for item in items:
        if item["problem"]:
            say(printable(f"{item['name']}: {item['problem']}"))
    sys.exit(0 if all(i["state"] == "run" for i in items) else EXIT_FAILED)


def _done_line(done: Written, spec: BucketJob) -> str:
    what = {
        "created": "added to the state bucket: every sidecar runs it within about a second",
        "updated": "updated in the state bucket: every sidecar takes it up within about a second",
        "unchanged": "already in the state bucket with this id and these settings: unchanged",
    }[done.what]
    if done.what != "unchanged":
        what += f"; schedule {spec.job.schedule.identity}"
    return printable(f"{done.name} (id {done.id}): {what}")
