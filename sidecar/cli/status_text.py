"""The text of ``status``: the fleet view (sidecar/ops/fleetview.py) as lines for a terminal.

Every value in the view came from the state bucket or the stream, so it is
hostile: each line goes through ``printable`` (sidecar/cli/output.py).
"""

from __future__ import annotations

from typing import Any

from sidecar.cli.output import printable, table
from sidecar.core.clock import rfc3339
from sidecar.when.atkey import status_lines as at_status_lines


def status_lines(view: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    stream = view.get("stream")
    if stream:
        lines.append(
            f"stream {stream['name']}: JetStream domain {stream['domain'] or '(none)'}, "
            f"cluster {stream['cluster'] or '(none)'}, leader {stream['leader'] or '-'}, "
            f"replicas {stream['replicas']}"
        )
    instances = view["instances"]
    lines.append(f"instances: {len(instances)} live")
    odd = "<< other job settings" if len({i["config_hash"] for i in instances}) > 1 else ""
    rows: list[tuple[str, ...]] = [
        (
            str(i["id"]),
            f"v{i['version']}",
            f"since {i['started_at']}",
            f"config {i['config_hash']}",
            odd,
        )
        for i in instances
    ]
    if rows:
        lines += ["  " + line for line in table(("",) * 5, rows)[1:]]
    if view["config_mismatch"]:
        lines.append(
            "WARNING: live instances run these jobs with different settings: "
            + ", ".join(view["mismatched_jobs"])
        )
    if view.get("mismatched_calendars"):
        lines.append(
            printable(
                "WARNING: live instances hold these calendars with different contents: "
                + ", ".join(view["mismatched_calendars"])
            )
        )
    lines.append("")
    rows = []
    for job in view["jobs"]:
        last = job["last_run"] or {}
        state = "PAUSED" if job["paused"] else "active"
        if job.get("ended"):
            state = "ENDED"
        elif job.get("not_started") and not job["paused"]:
            state = "NOT STARTED"
        if job.get("stream_problem"):
            state = "NOT HELD" if not job["paused"] else "PAUSED, NOT HELD"
        if job["settings_differ"]:
            state += " (settings differ)"
        rows.append(
            tuple(
                str(cell)
                for cell in (
                    job["name"],
                    state,
                    last.get("scheduled_at") or "-",
                    last.get("status") or "-",
                    last.get("instance") or "-",
                    job["next_slot"] or job.get("chain") or "-",
                    job.get("source") or "file",
                )
            )
        )
    lines += table(("JOB", "STATE", "LAST RUN", "STATUS", "INSTANCE", "NEXT", "FROM"), rows)
    lines += every_lines(view["jobs"])
    for item in view.get("bucket_jobs") or []:
        if item.get("state") != "run":
            lines.append(
                printable(
                    f"{item['name']} (state bucket, id {item.get('id')}): not run: "
                    f"{item.get('problem')}"
                )
            )
    if problem := (view.get("state_bucket") or {}).get("problem"):
        lines.append(printable(f"WARNING: {problem}"))
    for job in view["jobs"]:
        if job.get("stream_problem"):
            lines.append(printable(f"{job['name']} not claimed: {job['stream_problem']}"))
        for run in job.get("running") or []:
            attempt = f" attempt {run['attempt']}" if run.get("attempt", 1) != 1 else ""
            lines.append(
                printable(
                    f"{job['name']} running: slot {run['slot']}{attempt} on {run['instance']} "
                    f"since {run['since']}"
                )
            )
        if job.get("overlap") not in (None, "allow"):
            kept = job.get("overlap_kept")
            more = f"; slot {kept} kept to run after the running one" if kept else ""
            lines.append(printable(f"{job['name']}: overlap {job['overlap']}{more}"))
        if job["paused"]:
            why = f": {job['paused_reason']}" if job["paused_reason"] else ""
            until = f" until {job['paused_until']}" if job.get("paused_until") else ""
            lines.append(
                printable(
                    f"{job['name']} paused by {job['paused_by']} at {job['paused_at']}{until}{why}"
                )
            )
        if job.get("ended"):
            lines.append(printable(f"{job['name']} runs no more: {job['ended']}"))
        else:
            if job.get("not_started"):
                lines.append(printable(f"{job['name']} not started: {job['not_started']}"))
            if job.get("max_runs") is not None:
                runs = job.get("runs_counted") or 0
                lines.append(printable(f"{job['name']}: {runs} of max_runs {job['max_runs']} runs"))
        last = job["last_run"] or {}
        if last.get("status") in ("failed", "lost") and last.get("error"):
            # Why, in the app's own words for a failed answer (``HTTP 500: ...``).
            lines.append(printable(f"{job['name']}: last run {last['status']}: {last['error']}"))
        lines += schedule_status_lines(job)
    for conc in view.get("concurrency") or []:
        by = ", ".join(f"{h['job']} on {h['instance']}" for h in conc["holders"])
        lines.append(
            printable(
                f"concurrency {conc['key']}: {conc['held']}/{conc['limit']} held"
                f"{': ' + by if by else ''} (jobs {', '.join(conc['jobs'])})"
            )
        )
    return lines + drift_lines(view)


def every_lines(jobs: list[dict[str, Any]]) -> list[str]:
    """``run_on: every`` jobs: each instance's last run and the slots it missed."""
    lines = []
    for job in jobs:
        if job.get("run_on") != "every":
            continue
        for instance, last in (job.get("instances") or {}).items():
            gaps = [m["slot"] for m in job.get("missed") or [] if m["instance"] == instance]
            said = f", missed {len(gaps)} (newest {gaps[0]})" if gaps else ""
            lines.append(
                printable(
                    f"{job['name']} on {instance}: last {last['slot']} {last['status']}{said}"
                )
            )
    return lines


def schedule_status_lines(job: dict[str, Any]) -> list[str]:
    """A job's schedules in words, next run in its timezone, skips and backfill (status)."""
    name = job["name"]
    lines = [printable(f"{name}: {line}") for line in job.get("schedule_lines") or []]
    if job.get("next_run_local"):
        lines.append(printable(f"{name}: next run {job['next_run_local']}"))
    if job.get("skip_pending"):
        lines.append(f"{name}: next {job['skip_pending']} slot(s) skipped (skip)")
    run = job.get("backfill_running") or {}
    if job.get("backfill_pending") or run:
        now = (
            f", slot {rfc3339(run['slot'] / 1000)} running on {run.get('instance')}" if run else ""
        )
        lines.append(
            printable(
                f"{name}: backfill {job.get('backfill_done', 0)} done, "
                f"{job.get('backfill_pending', 0)} pending{now}"
            )
        )
    lines += [printable(line) for line in at_status_lines(name, job.get("at_pending") or [])]
    return lines


def drift_lines(view: dict[str, Any]) -> list[str]:
    """Jobs run by only part of the fleet, or only by instances with another config."""
    live = {str(i["id"]) for i in view["instances"]}
    lines = []
    for job in view["jobs"]:
        missing = sorted(live - {str(i) for i in job.get("run_by", live)})
        if live and missing:
            lines.append(printable(f"DRIFT: {job['name']} is not run by {', '.join(missing)}"))
    for job in view.get("other_jobs") or []:
        run_by = ", ".join(str(i) for i in job["run_by"])
        lines.append(printable(f"DRIFT: {job['name']} is not in this config; run by {run_by}"))
    return lines
