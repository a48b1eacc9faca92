"""The fleet view behind ``status``: read from the state bucket and the stream.

No running sidecar's admin port is needed: live instances are the
``instance.<id>`` keys (each kept alive with a TTL), pauses the
``paused.<job>`` keys, and each job's last run is joined from its newest claim
and result (two direct reads a job, not its whole history).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError

from sidecar.bounds import attempt_no, slot_ms
from sidecar.bucketcheck import check_bucket
from sidecar.clock import parse_rfc3339, rfc3339
from sidecar.config import Config
from sidecar.due import lease_job
from sidecar.orphans import run_by
from sidecar.runs import join_runs, last_messages
from sidecar.state import View, mismatched_jobs, state_spec
from sidecar.stream import answering_domain, coverage, state_of, stream_spec

READ_TIMEOUT = 10.0


def config_hash(jobs: object) -> str:
    """A short hash of an instance's job settings (names and per-job hashes)."""
    text = json.dumps(jobs if isinstance(jobs, dict) else {}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


async def read_view(js: JetStreamContext, config: Config) -> View | None:
    """Every live key of the state bucket; None when the bucket does not exist yet."""
    try:
        kv = await js.key_value(state_spec(config).bucket)
    except (BucketNotFoundError, NotFoundError):
        return None
    view = View()
    watcher = await kv.watchall()
    try:
        while True:
            entry = await watcher.updates(timeout=READ_TIMEOUT)  # type: ignore[no-untyped-call]
            if entry is None:
                break
            view.apply_entry(entry)
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    view.synced = True
    return view


def running(view: View, job: str, now_ms: int) -> list[dict[str, Any]]:
    """The runs of `job` holding a lease now (``run.*`` and ``lock.*`` keys), oldest first."""
    out = []
    for key, entry in view.leases().items():
        if lease_job(key) != job:
            continue
        v = entry.value
        since = v.get("started_at")
        try:
            seconds = (
                max(0.0, now_ms / 1000 - parse_rfc3339(since)) if isinstance(since, str) else None
            )
        except (ValueError, OverflowError, OSError):  # hostile input: not shown
            seconds = None
        out.append(
            {
                "slot": rfc3339(slot / 1000) if (slot := slot_ms(v.get("slot"))) else None,
                "attempt": attempt_no(v.get("attempt"), 1),
                "instance": v.get("instance"),
                "since": since,
                "seconds": round(seconds, 1) if seconds is not None else None,
                "key": key,
            }
        )
    return sorted(out, key=lambda run: str(run["since"]))


async def fleet_status(js: JetStreamContext, config: Config, now_ms: int) -> dict[str, Any]:
    """The object of FLEET.md's ``status --json``."""
    view = await read_view(js, config) or View()
    instances = view.instances()
    mismatch = mismatched_jobs(instances)
    # Drift: which live instances run each job, and the jobs this config lacks.
    runners = run_by(instances)
    spec = stream_spec(config)
    stream: dict[str, Any] | None = None
    held: dict[str, str | None] = {}
    try:
        info = await js.stream_info(spec.name)
        state = state_of(info)
        held = coverage(state, spec, config.jobs)
        domain = await answering_domain(js)
        stream = {
            "name": state.name,
            "domain": domain,
            "cluster": state.cluster,
            "leader": state.leader,
            "replicas": state.replicas,
        }
    except Exception:  # no stream yet, or no answer: status still shows the rest
        stream = None
    jobs: list[dict[str, Any]] = []
    for job in config.jobs:
        paused = view.paused(job.name)
        pause = paused.value if paused is not None else {}
        try:
            messages = await last_messages(js, spec.name, spec.prefix, job.name)
        except Exception:  # no stream yet, or it does not answer: no last run shown
            messages = []
        runs = join_runs(job.name, messages, spec.prefix).runs
        jobs.append(
            {
                "name": job.name,
                "paused": paused is not None,
                "paused_by": pause.get("by"),
                "paused_at": pause.get("at"),
                "paused_reason": pause.get("reason"),
                "running": running(view, job.name, now_ms),
                "last_run": runs[0].as_dict() if runs else None,
                "next_slot": rfc3339(job.schedule.next_slot(now_ms) / 1000),
                "settings_differ": job.name in mismatch,
                "run_by": runners.get(job.name, []),
                # Why the stream cannot hold this job's claims (its slots are skipped).
                "stream_problem": held.get(job.name),
            }
        )
    bucket: dict[str, Any] = {"name": state_spec(config).bucket, "problem": None}
    try:
        check = await check_bucket(js, state_spec(config), config.nats.lease_ttl, fix=False)
        bucket["problem"] = check.problem
    except NotFoundError:
        bucket["problem"] = "the state bucket does not exist (a running sidecar creates it)"
    except Exception:  # no answer: the rest is still shown
        pass
    return {
        "stream": stream,
        "state_bucket": bucket,
        "instances": [
            {
                "id": instance,
                "version": value.get("version"),
                "started_at": value.get("started_at"),
                "config_hash": config_hash(value.get("jobs")),
                "metrics": value.get("metrics"),
            }
            for instance, value in sorted(instances.items())
        ],
        "config_mismatch": bool(mismatch),
        "mismatched_jobs": sorted(mismatch),
        "jobs": jobs,
        # Jobs live instances run that this config does not have (removed,
        # renamed or added on part of the fleet), with their leftover state.
        "other_jobs": [
            {
                "name": name,
                "run_by": runners.get(name, []),
                "paused": view.paused(name) is not None,
                "running": running(view, name, now_ms),
            }
            for name in sorted(set(runners) - {job.name for job in config.jobs})
        ],
    }
