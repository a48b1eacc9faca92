"""The fleet's data for people: one builder behind ``status --json``, the API and the page.

``job_object`` and ``fleet_object`` build the objects both the CLI's
``status --json`` and ``/api/v1/...`` print, from the same inputs: the state
bucket's view, the stream's state and a ``Recent`` record of each job's
newest runs (sidecar/admin/recent.py: read from the stream by the CLI, kept
current by a running sidecar). Values that come from the stream or the bucket are
data anyone with publish rights could have written: they are returned as they
are and escaped where they are shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sidecar.admin.everyview import per_instance
from sidecar.admin.recent import Recent, consecutive_failures
from sidecar.admin.requestview import next_excluded, request_object, shown_path
from sidecar.config.addresses import redact_url
from sidecar.config.load import JobConfig
from sidecar.core.bounds import attempt_no, slot_ms
from sidecar.core.clock import parse_rfc3339, rfc3339
from sidecar.core.wire import EVERY, skip_key
from sidecar.fleet.orphans import run_by
from sidecar.run.backfill import backfill_key, done_of, running_of, slot_list
from sidecar.run.concurrency import conc_key
from sidecar.run.runcap import counted
from sidecar.store.digests import (
    BUCKET_MISMATCH,
    bucket_set,
    config_hash,
    mismatched_calendars,
    mismatched_jobs,
)
from sidecar.store.state import Entry, View, bucket_job_names
from sidecar.store.stream import StreamState
from sidecar.when.atkey import at_key, pending_of
from sidecar.when.attempts import lease_job
from sidecar.when.describe import describe, schedule_lines
from sidecar.when.pauses import pause_active, pending
from sidecar.when.slots import utc_text

NEXT_RUNS = 3
ACTIONS_KEPT = 50  # entries of ``actions.<job>`` (sidecar/admin/actions.py)


def leases_by_job(view: View) -> dict[str, dict[str, Entry]]:
    """The view's leases (``run.*``, ``lock.*``) by job: one walk of the bucket's keys
    for every job's ``running`` (one walk per job is N x N with N ``job.*`` keys)."""
    out: dict[str, dict[str, Entry]] = {}
    for key, entry in view.leases().items():
        job = lease_job(key)
        if job is not None:
            out.setdefault(job, {})[key] = entry
    return out


def running(
    view: View, job: str, now_ms: int, leases: dict[str, dict[str, Entry]] | None = None
) -> list[dict[str, Any]]:
    """The runs of `job` holding a lease now (``run.*`` and ``lock.*`` keys), oldest first.
    `leases`: ``leases_by_job(view)`` when the caller builds many jobs' objects."""
    mine = leases.get(job, {}) if leases is not None else leases_by_job(view).get(job, {})
    out = []
    for key, entry in mine.items():
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
                "token": v.get("token"),
                "fence": v.get("fence"),
            }
        )
    return sorted(out, key=lambda run: str(run["since"]))


def schedules_of(job: JobConfig) -> list[dict[str, str]]:
    """The job's schedule(s) with their words. Several schedules per job, when the
    config gives them (``job.schedules``), are listed each; today there is one."""
    if job.after is not None:  # no schedule: ``chain`` says what it follows
        return []
    tz = job.timezone.key
    return [{"cron": expr, "text": describe(expr, tz)} for expr in job.schedule.exprs]


def schedule_fields(job: JobConfig, view: View, now_ms: int, upcoming: list[int]) -> dict[str, Any]:
    """``skip``, backfill and schedule-in-words fields of a job (docs/SCHEDULES.md)."""
    skip = view.keys.get(skip_key(job.name))
    entry = view.keys.get(backfill_key(job.name))
    backfill = entry.value if entry is not None else None
    at = view.keys.get(at_key(job.name))
    return {
        "skip_pending": pending(skip.value if skip is not None else None, now_ms),
        "backfill_pending": len(slot_list(backfill)),
        "backfill_running": running_of(backfill),
        "backfill_done": done_of(backfill),
        # One-off runs queued by `at` (sidecar/when/atkey.py), soonest first.
        "at_pending": [r.as_dict() for r in pending_of(at.value if at else None, now_ms / 1000)],
        "schedule_lines": schedule_lines(job.schedule),
        "next_run_local": local_time(upcoming[0], job.timezone) if upcoming else None,
    }


def local_time(epoch_ms: int, tz: ZoneInfo) -> str:
    """``2026-12-24 09:00:00 CET``: a slot as the job's timezone reads it."""
    return f"{datetime.fromtimestamp(epoch_ms / 1000, tz):%Y-%m-%d %H:%M:%S %Z}"


def job_object(
    job: JobConfig,
    view: View,
    recent: Recent,
    now_ms: int,
    mismatch: set[str],
    held: dict[str, str | None],
    upcoming: list[int] | None = None,
    runners: dict[str, list[str]] | None = None,
    leases: dict[str, dict[str, Entry]] | None = None,
) -> dict[str, Any]:
    """One entry of ``jobs``, alike in ``status --json`` and ``/api/v1/jobs``.

    `upcoming`: the job's next ``NEXT_RUNS`` slots after `now_ms` when the
    caller has them (computing them is most of the cost of a job's object);
    `leases`: ``leases_by_job(view)``, when it builds more than one.
    """
    if upcoming is None:
        upcoming = job.schedule.runs(now_ms, NEXT_RUNS)  # exclusions applied
    over = no_more_runs(job, view, now_ms)
    if over is not None:
        upcoming = []
    pause = active_pause(view, job.name, now_ms)
    active = bool(pause)
    strip = recent.strip(job.name)
    req = job.request
    return {
        "name": job.name,
        "paused": active,
        "paused_by": pause.get("by"),
        "paused_at": pause.get("at"),
        "paused_reason": pause.get("reason"),
        # A pause with an end (``pause --until``): it ends by itself then.
        "paused_until": pause.get("until"),
        **schedule_fields(job, view, now_ms, upcoming),
        **({"schedule_lines": [job.after.words()]} if job.after is not None else {}),
        "running": running(view, job.name, now_ms, leases),
        "last_run": recent.last_run(job.name),
        "next_slot": rfc3339(upcoming[0] / 1000) if upcoming else None,
        "next_slots": [rfc3339(s / 1000) for s in upcoming],
        "schedules": schedules_of(job),
        # exclude: [calendar:<name>] (docs/SCHEDULES.md): each with its content hash.
        "calendars": [{"name": s.name, "digest": s.digest} for s in job.schedule.shared],
        "timezone": job.timezone.key,
        "recent": strip,
        "run_on": job.run_on,
        **(
            per_instance(recent.every_marks(job.name), now_ms, round(job.max_late * 1000))
            if job.run_on == EVERY
            else {}
        ),
        "consecutive_failures": consecutive_failures(strip),
        # The path's query values redacted unless only placeholders (a token in the query).
        "target": f"{req.method} {redact_url(req.url)}{shown_path(req.path)}",
        "settings_differ": job.name in mismatch,
        # Why the stream cannot hold this job's claims (its slots are skipped).
        "stream_problem": held.get(job.name),
        # Which live instances run the job (drift: not every one, or only others).
        "run_by": (runners or {}).get(job.name, []),
        # start_at, end_at, max_runs (docs/SCHEDULES.md): why the job runs no more.
        "ended": over,
        # Why the job claims nothing yet (start_at ahead); None once it may run.
        "not_started": not_started(job, now_ms),
        "start_at": _utc(job.schedule.start_ms),
        "end_at": _utc(job.schedule.end_ms),
        "max_runs": job.max_runs,
        # overlap (docs/CONFIG.md); buffer_one: the slot kept to run after the running one.
        "overlap": job.overlap,
        "overlap_kept": _kept(view, job.name),
        "runs_counted": counted(view, job.name) if job.max_runs is not None else None,
        "concurrency": conc_of(job, view),
        # The request's template and run parameters, never a secret (requestview.py).
        "request": request_object(job),
        # The next slot, when an exclusion (a calendar:<name> one too) keeps it from running.
        "next_excluded": next_excluded(job, now_ms),
        # answer.bytes (docs/TRIGGER.md): how much of the app's answer a result keeps.
        "answer_bytes": job.answer.size,
        # after (docs/CONFIG.md): the job it runs after and on which endings; the words
        # status and the page show ("after a on success"); None: a scheduled job.
        "after": ({"job": job.after.job, "on": job.after.on} if job.after is not None else None),
        "chain": job.after.words() if job.after is not None else None,
    }


def problem_part(
    job: JobConfig,
    view: View,
    recent: Recent,
    now_ms: int,
    mismatch: set[str],
    held: dict[str, str | None],
    runners: dict[str, list[str]],
) -> dict[str, Any]:
    """The fields of ``job_object`` that ``problems`` (sidecar/admin/jobfilter.py)
    reads, with the same values, without the next slots that make up most of an
    object's cost: "problems only" among 100,000 jobs looks at each this way."""
    pause = active_pause(view, job.name, now_ms)
    if job.name in recent.jobs:
        strip = recent.strip(job.name)
        fails = consecutive_failures(strip)
        last = recent.last_run(job.name) if not fails else None  # read only without fails
    else:  # no run seen: the common case with many jobs, and free
        fails, last = 0, None
    part: dict[str, Any] = {
        "paused": bool(pause),
        "consecutive_failures": fails,
        "last_run": last,
        "settings_differ": job.name in mismatch,
        "stream_problem": held.get(job.name),
        "run_by": runners.get(job.name, []),
        "ended": no_more_runs(job, view, now_ms),
        "not_started": not_started(job, now_ms),
    }
    if job.run_on == EVERY:
        marks = recent.every_marks(job.name)
        part["missed"] = per_instance(marks, now_ms, round(job.max_late * 1000))["missed"]
    return part


def active_pause(view: View, name: str, now_ms: int) -> dict[str, Any]:
    """The value of `name`'s pause while it holds; {} when not paused. A timed pause
    whose end has passed is over (sidecar/run/skips.py)."""
    paused = view.paused(name)
    return paused.value if paused is not None and pause_active(paused.value, now_ms) else {}


def no_more_runs(job: JobConfig, view: View, now_ms: int) -> str | None:
    """Why the job claims no more slots (end_at passed, max_runs reached); None if it does."""
    if job.after is not None:  # no slots of its own, and none missed
        return None
    if job.schedule.ended(now_ms):
        return f"end_at {utc_text(job.schedule.end_ms or 0)} passed"
    if job.max_runs is not None and (runs := counted(view, job.name)) >= job.max_runs:
        return f"max_runs {job.max_runs} reached ({runs} runs counted in count.{job.name})"
    return None


def not_started(job: JobConfig, now_ms: int) -> str | None:
    """``no slot before start_at …`` while `now_ms` is before the job's start_at."""
    start = job.schedule.start_ms
    if start is None or now_ms >= start:
        return None
    return f"no slot before start_at {utc_text(start)}"


def _utc(epoch_ms: int | None) -> str | None:
    return rfc3339(epoch_ms / 1000) if epoch_ms is not None else None


def stream_object(state: StreamState, domain: str | None) -> dict[str, Any]:
    return {
        "name": state.name,
        "domain": domain,
        "cluster": state.cluster,
        "leader": state.leader,
        "replicas": state.replicas,
        "duplicate_window_seconds": state.duplicate_window,
        "history_size": state.history_size,
        "messages": state.messages,
        "last_seq": state.last_seq,
    }


def runners_of(jobs: Sequence[JobConfig], view: View) -> dict[str, list[str]]:
    """For each job a live instance runs, which instances (``run_by``): the jobs of
    the state bucket among `jobs` are run by every instance running a set of them."""
    bucket = bucket_job_names(view)
    return run_by(view.instances(), bucket & {job.name for job in jobs} if bucket else ())


def instances_of(view: View, seen: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The live instances; `seen`: when each one's presence was last written (epoch s)."""
    seen = seen or {}
    instances = view.instances()
    mismatch = mismatched_jobs(instances)
    out = []
    for instance, value in sorted(instances.items()):
        jobs = value.get("jobs")
        bucket = bucket_set(value)
        differ = (isinstance(jobs, dict) and any(name in mismatch for name in jobs)) or (
            bucket is not None and BUCKET_MISMATCH in mismatch
        )
        out.append(
            {
                "id": instance,
                "version": value.get("version"),
                "started_at": value.get("started_at"),
                "config_hash": config_hash(jobs, bucket),
                "metrics": value.get("metrics"),
                "settings_differ": differ,
                "last_seen": rfc3339(seen[instance]) if instance in seen else None,
            }
        )
    return out


def fleet_part(
    jobs: Sequence[JobConfig],
    view: View,
    stream: dict[str, Any] | None,
    bucket: dict[str, Any] | None,
    now_ms: int,
    seen: dict[str, float] | None = None,
) -> dict[str, Any]:
    """``status --json`` without its ``jobs``: ``/api/v1/fleet``."""
    instances = view.instances()
    mismatch = mismatched_jobs(instances)
    runners = runners_of(jobs, view)
    mine = {job.name for job in jobs}
    return {
        "stream": stream,
        "state_bucket": bucket,
        "instances": instances_of(view, seen),
        "config_mismatch": bool(mismatch),
        "mismatched_jobs": sorted(mismatch),
        # Shared calendars whose contents differ between live instances.
        "mismatched_calendars": sorted(mismatched_calendars(instances)),
        # Jobs live instances run that this config does not have (removed,
        # renamed or added on part of the fleet), with their leftover state.
        "other_jobs": [
            {
                "name": name,
                "run_by": runners.get(name, []),
                "paused": view.paused(name) is not None,
                "running": running(view, name, now_ms),
            }
            for name in sorted(set(runners) - mine)
        ],
        # Shared concurrency limits (jobs[].concurrency): slots held now, fleet-wide.
        "concurrency": concurrency_of(jobs, view),
    }


def conc_of(job: JobConfig, view: View) -> dict[str, Any] | None:
    """A job's concurrency key and limit, the key's slots held now fleet-wide
    (``held``) and how many of them runs of this job hold (``held_by_job``)."""
    if job.concurrency is None:
        return None
    key, limit = job.concurrency.key, job.concurrency.limit
    entries = [view.keys.get(conc_key(key, n)) for n in range(limit)]
    held = [e for e in entries if e is not None]
    mine = sum(1 for e in held if e.value.get("job") == job.name)
    return {"key": key, "limit": limit, "held": len(held), "held_by_job": mine}


def concurrency_of(jobs: Sequence[JobConfig], view: View) -> list[dict[str, Any]]:
    """Each concurrency key of the config: its limit, its jobs, the runs holding its
    slots (``conc.<key>.<n>``) as the view shows them."""
    limits: dict[str, tuple[int, list[str]]] = {}
    for job in jobs:
        if job.concurrency is not None:
            limits.setdefault(job.concurrency.key, (job.concurrency.limit, []))[1].append(job.name)
    out = []
    for key, (limit, names) in sorted(limits.items()):
        holders = []
        for n in range(limit):
            entry = view.keys.get(conc_key(key, n))
            if entry is not None:
                slot = slot_ms(entry.value.get("slot"))
                holders.append(
                    {
                        "job": str(entry.value.get("job", "?"))[:100],
                        "slot": rfc3339(slot / 1000) if slot is not None else None,
                        "instance": str(entry.value.get("instance", "?"))[:100],
                    }
                )
        out.append(
            {"key": key, "limit": limit, "held": len(holders), "jobs": names, "holders": holders}
        )
    return out


def _kept(view: View, job: str) -> str | None:
    """The slot ``overlap: buffer_one`` keeps in ``buffer.<job>`` (RFC 3339), if any."""
    entry = view.keys.get(f"buffer.{job}")
    slot = slot_ms(entry.value.get("slot")) if entry is not None else None
    return rfc3339(slot / 1000) if slot is not None else None


def fleet_object(
    jobs: Sequence[JobConfig],
    view: View,
    recent: Recent,
    stream: dict[str, Any] | None,
    held: dict[str, str | None],
    now_ms: int,
    bucket: dict[str, Any] | None = None,
    seen: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The object of ``status --json``: stream, instances, mismatches and every job."""
    mismatch = mismatched_jobs(view.instances())
    runners = runners_of(jobs, view)
    leases = leases_by_job(view)
    objects = [
        job_object(job, view, recent, now_ms, mismatch, held, runners=runners, leases=leases)
        for job in jobs
    ]
    return {**fleet_part(jobs, view, stream, bucket, now_ms, seen), "jobs": objects}
