"""The fleet page as HTML: server-rendered, readable without JavaScript.

Pure functions from the objects of sidecar/admin/objects.py to strings, built
of the bricks of sidecar/admin/markup.py (every value escaped by ``e()``,
times as ``<time>``, marks with a symbol and a word): the fleet's jobs, one
row each, its instances, the job keys of the state bucket that do not run.
One job's page: sidecar/admin/jobpage.py.
"""

from __future__ import annotations

from typing import Any

from sidecar.admin.markup import ACTIVE, DASH, DIFFERS, e, ident, job_href, mark, seconds, when


def source_tag(job: dict[str, Any]) -> str:
    """A ``bucket`` tag (and its external id) for a job added at run time; none for
    the config file's jobs, which are most."""
    if job.get("source") != "bucket":
        return ""
    ident = f' <small class="id">id {e(job["id"])}</small>' if job.get("id") else ""
    title = e(f"added at run time: state bucket key job.{job['name']}")
    return f'<br><span class="tag src" title="{title}">bucket</span>{ident}'


def source_line(job: dict[str, Any]) -> str:
    """Where a job comes from, for its own page."""
    if job.get("source") != "bucket":
        return '<p class="src">From the config file.</p>'
    ident = f", id <code>{e(job['id'])}</code>" if job.get("id") else ""
    return (
        '<p class="src">Added at run time: state bucket key '
        f"<code>job.{e(job['name'])}</code>{ident} (<code>job update</code>, "
        "<code>job remove</code>).</p>"
    )


def policy_lines(job: dict[str, Any], tz: object) -> str:
    """Under the schedule: end_at while ahead, overlap when not the default."""
    out = ""
    if job.get("end_at") and not job.get("ended"):
        out += f'<div class="words">until {when(job["end_at"], tz)} (end_at)</div>'
    if job.get("overlap") not in (None, "allow"):
        out += f'<div class="words">overlap: {e(job["overlap"])}</div>'
    if conc := job.get("concurrency"):
        held = f"; {e(conc['held'])} held now" if conc.get("held") is not None else ""
        out += (
            f'<div class="words">concurrency: {e(conc.get("key"))} '
            f"(at most {e(conc.get('limit'))} at once){held}</div>"
        )
    if cals := job.get("calendars"):  # exclude: [calendar:<name>] (docs/SCHEDULES.md)
        names = ", ".join(e(c.get("name")) for c in cals)
        out += f'<div class="words">calendars: {names}</div>'
    if gap := job.get("next_excluded"):
        out += (
            f'<div class="words">next slot {when(gap.get("slot"), tz)} excluded '
            f"({e(gap.get('by'))})</div>"
        )
    return out


def request_line(job: dict[str, Any]) -> str:
    """The job's request template (admin/requestview.py: no secrets), for its own page."""
    req = job.get("request")
    if not req:
        return ""
    parts = [f"<code>{e(req.get('method'))} {e(req.get('path'))}</code>"]
    if headers := req.get("headers"):
        listed = ", ".join(f"{e(k)}: {e(v)}" for k, v in headers.items())
        parts.append(f"headers {listed}")
    if body := req.get("body_params"):
        parts.append("body with " + ", ".join(e(f"{{{name}}}") for name in body))
    if used := req.get("params"):
        parts.append("run parameters " + ", ".join(e(f"{{{name}}}") for name in used))
    return f'<p class="src" id="job-request">Request: {"; ".join(parts)}</p>'


def at_lines(job: dict[str, Any], tz: object, shown: int = 3) -> list[str]:
    """Pending one-off runs (``at``), soonest first, for the next-runs cell."""
    pending = job.get("at_pending") or []
    lines = []
    for run in pending[:shown]:
        why = f": {run['reason']}" if run.get("reason") else ""
        title = e(f"one-off run (at) by {run.get('by')}{why}")
        lines.append(
            f'<span class="tag once" title="{title}">once</span> {when(run.get("at"), tz)}'
        )
    if len(pending) > shown:
        lines.append(f'<span class="none">+{len(pending) - shown} more one-off runs</span>')
    return lines


def job_row(job: dict[str, Any]) -> str:
    name = str(job["name"])
    tz = job.get("timezone")
    scheds = "".join(
        f'<div><code>{e(s["cron"])}</code><br><span class="words">{e(s["text"])}</span></div>'
        for s in job.get("schedules") or []
    )
    if job.get("chain"):  # a job run after another's runs (docs/CONFIG.md, after)
        scheds += f'<div><span class="words">{e(job["chain"])}</span></div>'
    scheds += policy_lines(job, tz)
    state = []
    if job.get("paused"):
        why = f": {e(job.get('paused_reason'))}" if job.get("paused_reason") else ""
        until = f", until {when(job['paused_until'])}" if job.get("paused_until") else ""
        state.append(
            f'<span class="tag paused">paused</span> by {e(job.get("paused_by"))}{why}{until}'
        )
    if job.get("ended"):
        state.append(f'<span class="tag warn">ended</span> runs no more: {e(job["ended"])}')
    elif job.get("not_started"):
        start = when(job.get("start_at"), tz) if job.get("start_at") else e(job["not_started"])
        state.append(f'<span class="tag wait">not started</span> no slot before {start} (start_at)')
    elif job.get("max_runs") is not None:
        state.append(f"{e(job.get('runs_counted') or 0)} of max_runs {e(job['max_runs'])} runs")
    if job.get("skip_pending"):
        state.append(
            f'<span class="tag skip">skip</span> next {e(job["skip_pending"])} run(s) skipped'
        )
    if job.get("stream_problem"):
        state.append(f'<span class="tag bad">not held</span> {e(job["stream_problem"])}')
    if job.get("settings_differ"):
        state.append('<span class="tag warn">settings differ</span>')
    for run in job.get("running") or []:
        attempt = f", attempt {e(run.get('attempt'))}" if run.get("attempt", 1) != 1 else ""
        state.append(
            f'<span class="tag run">▶ running</span> on {e(run.get("instance"))} for '
            f"{seconds(run.get('seconds'))}{attempt}"
        )
    if job.get("overlap_kept"):
        state.append(
            f'<span class="tag run">kept</span> slot {when(job["overlap_kept"], tz)} runs '
            "after the running one (buffer_one)"
        )
    if job.get("run_on") == "every":  # each instance's last run, and what it missed
        state.append('<span class="tag run">every instance</span> runs each slot')
        gaps = job.get("missed") or []
        for instance, last_of in (job.get("instances") or {}).items():
            own = [g["slot"] for g in gaps if g.get("instance") == instance]
            missed = f', <span class="tag bad">missed {len(own)}</span>' if own else ""
            state.append(
                f"{e(instance)}: {mark(last_of.get('status'))} "
                f"{when(last_of.get('slot'), tz)}{missed}"
            )
    strip = "".join(
        mark(
            r["status"],
            f"{r['slot']}{' manual' if r.get('manual') else ''}"
            + (f" on {r['instance']}" if r.get("instance") else ""),
        )
        for r in reversed(job.get("recent") or [])
    )
    fails = job.get("consecutive_failures") or 0
    nexts = "<br>".join([when(s, tz) for s in job.get("next_slots") or []] + at_lines(job, tz))
    last = job.get("last_run") or {}
    last_text = f"{mark(last['status'])} {when(last.get('scheduled_at'), tz)}" if last else DASH
    return (
        f'<tr id="job-{e(name)}" data-job="{e(name)}">'
        f'<th scope="row"><a href="{e(job_href(name))}">{e(name)}</a>{source_tag(job)}</th>'
        f"<td>{scheds}</td>"
        f"<td>{' <br>'.join(state) or ACTIVE}</td>"
        f'<td class="strip" data-label="last runs">{strip or "&#8211;"}</td>'
        f'<td class="num{" bad" if fails else ""}" data-label="consecutive failures">{fails}</td>'
        f'<td data-label="last run">{last_text}</td>'
        f'<td data-label="next runs">{nexts}</td></tr>'
    )


# Above the jobs while this sidecar is not connected to NATS.
UNREACHABLE = (
    '<p class="warn" role="alert">⚠ NATS is unreachable: this sidecar is not connected '
    "(nats.servers). What the page shows is what it last knew; it runs no slot and "
    "takes no action until it is connected again.</p>"
)


def jobs_table(rows: list[str], count: int, heading: str = "") -> str:
    heading = heading or f'<h1 id="jobs-h">Jobs <small>({count})</small></h1>'
    return (
        f'<section aria-labelledby="jobs-h">{heading}'
        '<div class="scroll"><table class="jobs"><caption class="vh">Every job of this '
        "sidecar's config</caption><thead><tr>"
        '<th scope="col">Job</th><th scope="col">Schedule</th><th scope="col">State</th>'
        '<th scope="col">Last runs (oldest → newest)</th>'
        '<th scope="col" title="consecutive failures">Fails</th>'
        '<th scope="col">Last run</th><th scope="col">Next runs</th></tr></thead>'
        f'<tbody id="jobs-body">{"".join(rows)}</tbody></table></div></section>'
    )


def fleet_section(fleet: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><th scope='row'>{e(i['id'])}</th><td>{e(i.get('version'))}</td>"
        f"<td>{ident(i.get('config_hash'))}</td>"
        f"<td>{DIFFERS if i.get('settings_differ') else '&#8211;'}</td>"
        f"<td>{when(i.get('started_at'))}</td><td>{when(i.get('last_seen'))}</td>"
        f"<td>{e(i.get('metrics'))}</td></tr>"
        for i in fleet.get("instances") or []
    )
    stream = fleet.get("stream") or {}
    bucket = fleet.get("state_bucket") or {}
    warn = ""
    others = fleet.get("other_jobs") or []
    if others:
        listed = ", ".join(
            f"{o.get('name')} (run by {', '.join(map(str, o.get('run_by') or []))})" for o in others
        )
        warn += (
            '<p class="warn" role="alert">⚠ Live instances run jobs this sidecar\'s config '
            f"does not have: {e(listed)}</p>"
        )
    if fleet.get("config_mismatch"):
        warn += (
            '<p class="warn" role="alert">⚠ Live instances run these jobs with different '
            f"settings: {e(', '.join(fleet.get('mismatched_jobs') or []))}</p>"
        )
    if fleet.get("mismatched_calendars"):
        warn += (
            '<p class="warn" role="alert">⚠ Live instances hold these calendars with '
            f"different contents: {e(', '.join(fleet['mismatched_calendars']))}</p>"
        )

    def dl(pairs: list[tuple[str, object]]) -> str:
        return "<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in pairs) + "</dl>"

    stream_dl = (
        dl(
            [
                ("name", stream.get("name")),
                ("JetStream domain", stream.get("domain") or "(none)"),
                ("cluster", stream.get("cluster") or "(none)"),
                ("leader", stream.get("leader") or "-"),
                ("replicas", stream.get("replicas")),
                ("duplicate window", f"{stream.get('duplicate_window_seconds')} s"),
                ("history size", stream.get("history_size")),
                ("messages", stream.get("messages")),
            ]
        )
        if stream
        else "<p>No stream yet, or it does not answer.</p>"
    )
    job_keys = fleet.get("bucket_jobs") or []
    ran = sum(1 for item in job_keys if item.get("state") == "run")
    bucket_dl = dl(
        [
            ("name", bucket.get("name")),
            ("live keys", bucket.get("keys")),
            ("problem", bucket.get("problem") or "none"),
            *(
                [("jobs added at run time", f"{ran} run, {len(job_keys) - ran} not run")]
                if job_keys
                else []
            ),
            # Shared concurrency limits (jobs[].concurrency): slots held now.
            *(
                (f"concurrency {c.get('key')}", f"{c.get('held')}/{c.get('limit')} held")
                for c in fleet.get("concurrency") or []
            ),
        ]
    )
    warn += not_run(job_keys)
    return (
        '<section id="fleet" aria-labelledby="fleet-h"><h2 id="fleet-h">Fleet</h2>'
        f"{warn}<h3>Live instances ({len(fleet.get('instances') or [])})</h3>"
        '<div class="scroll"><table><thead><tr><th scope="col">Instance</th>'
        '<th scope="col">Version</th><th scope="col">Config digest</th>'
        '<th scope="col">Drift</th><th scope="col">Up since</th><th scope="col">Last seen</th>'
        f'<th scope="col">Metrics</th></tr></thead><tbody>{rows}</tbody></table></div>'
        f'<div class="cols"><div><h3>Stream</h3>{stream_dl}</div>'
        f"<div><h3>State bucket</h3>{bucket_dl}</div></div></section>"
    )


NOT_RUN_SHOWN = 20


def not_run(listed: list[dict[str, Any]]) -> str:
    """The state bucket's job keys that do not run (invalid, or shadowed by the file), why."""
    bad = [item for item in listed if item.get("state") != "run"]
    lines = "".join(
        f"<li><strong>{e(item.get('name'))}</strong>"
        + (f" (id {e(item['id'])})" if item.get("id") else "")
        + f": {e(item.get('state'))}: {e(item.get('problem'))}</li>"
        for item in bad[:NOT_RUN_SHOWN]
    )
    if len(bad) > NOT_RUN_SHOWN:
        lines += f"<li>and {len(bad) - NOT_RUN_SHOWN} more (<code>job list</code>)</li>"
    if not bad:
        return ""
    return (
        '<div class="warn" role="alert"><p class="warn">⚠ Jobs in the state bucket that '
        f"do not run:</p><ul>{lines}</ul></div>"
    )
