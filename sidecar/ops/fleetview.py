"""The fleet view behind ``status``: read from the state bucket and the stream.

No running sidecar's admin port is needed: live instances are the
``instance.<id>`` keys (each kept alive with a TTL), pauses the
``paused.<job>`` keys, and each job's last run is joined from its newest claim
and result; the objects are built by sidecar/admin/objects.py, as the fleet page's
API builds them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from sidecar.admin.everyview import of_runs
from sidecar.admin.jobcheck import listing, with_bucket_jobs, with_sources
from sidecar.admin.jobfilter import Selection, named, select
from sidecar.admin.objects import fleet_object, running, stream_object
from sidecar.admin.recent import Recent, read_recent
from sidecar.config.load import Config
from sidecar.core.wire import EVERY
from sidecar.store.bucketcheck import check_bucket
from sidecar.store.runs import read_history
from sidecar.store.state import View, read_view, state_spec
from sidecar.store.stream import answering_domain, state_of, stream_spec
from sidecar.store.streamfit import coverage

__all__ = ["fleet_status", "running"]


async def fleet_status(
    js: JetStreamContext, config: Config, now_ms: int, sel: Selection | None = None
) -> dict[str, Any]:
    """The object of ``status --json`` (docs/CLI.md): the jobs `sel` picks (every
    job when None), with ``selection`` saying how many matched and where to go on."""
    seen: dict[str, float] = {}
    view = await read_view(js, config, seen) or View()
    file_names = config.job_names
    bucket_jobs = listing(config, view)
    config = with_bucket_jobs(config, view)  # run beside the file's: shown as theirs
    spec = stream_spec(config)
    stream: dict[str, Any] | None = None
    held: dict[str, str | None] = {}
    try:
        info = await js.stream_info(spec.name)
        state = state_of(info)
        held = coverage(state, spec, config.jobs)
        domain = await answering_domain(js)
        stream = stream_object(state, domain)
    except Exception:  # no stream yet, or no answer: status still shows the rest
        stream = None
    recent = Recent(spec.prefix)
    if stream is not None:
        try:
            recent = await read_recent(js, spec.name, spec.prefix, len(config.jobs))
        except Exception:  # the stream does not answer: no runs shown
            recent = Recent(spec.prefix)
    bucket: dict[str, Any] = {
        "name": state_spec(config).bucket,
        "problem": None,
        "keys": len(view.keys),
    }
    try:
        check = await check_bucket(js, state_spec(config), config.nats.lease_ttl, fix=False)
        bucket["problem"] = check.problem
    except NotFoundError:
        bucket["problem"] = "the state bucket does not exist (a running sidecar creates it)"
    except Exception:  # no answer: the rest is still shown
        pass
    if sel is not None and sel.globs:  # only the named jobs' objects are built
        wanted = set(named(config.job_names, sel.globs))
        config = dataclasses.replace(config, jobs=tuple(j for j in config.jobs if j.name in wanted))
    out = fleet_object(config.jobs, view, recent, stream, held, now_ms, bucket, seen)
    if stream is not None:
        await _every_jobs(js, config, out, now_ms)
    if sel is not None:
        out["jobs"], out["selection"] = select(out["jobs"], sel, len(out["instances"]))
    return with_sources(out, file_names, bucket_jobs)


async def _every_jobs(
    js: JetStreamContext, config: Config, out: dict[str, Any], now_ms: int
) -> None:
    """``run_on: every`` jobs: ``instances`` and ``missed`` from the whole history, not
    only the recent runs the page keeps (sidecar/admin/everyview.py)."""
    spec = stream_spec(config)
    every = {job.name: job for job in config.jobs if job.run_on == EVERY}
    for entry in out.get("jobs", []):
        job = every.get(entry.get("name"))
        if job is None:
            continue
        try:
            hist = await read_history(js, spec.name, spec.prefix, job.name)
        except Exception:  # no answer: the recent runs' view stays
            continue
        entry.update(of_runs(hist.runs, now_ms, round(job.max_late * 1000)))
