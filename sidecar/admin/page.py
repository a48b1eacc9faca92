"""The fleet page as HTML: server-rendered, readable without JavaScript.

Pure functions from the objects of sidecar/admin/objects.py to strings. Every value
that comes from the config, the stream or the state bucket goes through
``e()`` (HTML escaping, quotes included): stream data is written by whoever
can publish, and is treated as hostile. No inline script or style (the
Content-Security-Policy forbids both): page.js and page.css come from
``/static/``. Times are ``<time datetime=UTC>`` elements; page.js rewrites
them into the viewer's local time with its zone's name and keeps the UTC
instant in the title. A job's own times (its next runs, its runs' scheduled
and start times) are in its schedule's timezone instead (``data-tz``), shown
so by the server too, zone name included, so they read as the schedule does.
Status marks carry a symbol and a word, never colour alone.
"""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

from sidecar.config.fields import UNSHOWN_RE
from sidecar.core.wire import FAILED, LOST, RUNNING, SKIPPED, SUCCEEDED

MARKS = {
    SUCCEEDED: ("✓", "ok"),
    FAILED: ("✗", "bad"),
    RUNNING: ("▶", "run"),
    SKIPPED: ("↷", "skip"),
    LOST: ("?", "bad"),
}
DASH = '<span class="none">&#8211;</span>'
ACTIVE = '<span class="tag ok">active</span>'
DIFFERS = '<span class="tag warn">⚠ differs</span>'


def e(value: object) -> str:
    """`value` as HTML text; a control, bidi or invisible character (a value written
    in the bucket by hand) shown escaped (``\\u202e``), never reordering the page."""
    text = "" if value is None else str(value)
    if UNSHOWN_RE.search(text):
        text = UNSHOWN_RE.sub(lambda m: repr(m.group())[1:-1], text)
    return escape(text, quote=True)


def when(text: object, tz: object = None) -> str:
    """A ``<time>`` for an RFC 3339 UTC instant; a dash for none. With `tz` (a job's
    IANA timezone), shown in that zone with its name, for page.js too (``data-tz``)."""
    if not text:
        return '<span class="none">&#8211;</span>'
    t = e(text)
    if not tz:
        return f'<time datetime="{t}" title="{t}">{t}</time>'
    try:
        at = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
        shown = e(at.astimezone(ZoneInfo(str(tz))).strftime("%Y-%m-%d %H:%M:%S %Z"))
    except (ValueError, KeyError):  # not a time or not a zone: as it is
        return f'<time datetime="{t}" title="{t}">{t}</time>'
    return f'<time datetime="{t}" data-tz="{e(tz)}" title="UTC {t}">{shown}</time>'


def mark(status: object, title: str = "") -> str:
    symbol, css = MARKS.get(str(status), ("·", "unk"))
    label = e(f"{status} {title}".strip())
    return (
        f'<span class="mark {css}" title="{label}" role="img" aria-label="{label}">{symbol}</span>'
    )


def ident(value: object) -> str:
    """A run id or fence: monospaced and copyable (page.js adds the button)."""
    if value is None or value == "":
        return '<span class="none">&#8211;</span>'
    return f'<code class="copy">{e(value)}</code>'


def seconds(value: object) -> str:
    if not isinstance(value, int | float):
        return "&#8211;"
    v = float(value)
    if v < 1:  # a run of 2 ms is 2 ms, not "0.0 s"
        return f"{round(v * 1000)} ms"
    if v < 60:
        return f"{v:.1f} s"
    if v < 3600:
        return f"{int(v // 60)} min {int(v % 60)} s"
    return f"{int(v // 3600)} h {int(v % 3600 // 60)} min"


def job_href(name: str) -> str:
    return "/jobs/" + quote(name, safe="")


def layout(title: str, body: str, who: str | None, csrf: str | None, can_act: bool) -> str:
    if who:
        session = (
            f'<form method="post" action="/logout" class="inline">'
            f'<input type="hidden" name="csrf" value="{e(csrf)}">'
            f"signed in as <strong>{e(who)}</strong> "
            f'<button type="submit">sign out</button></form>'
        )
    elif can_act:
        session = (
            '<form method="post" action="/login" class="inline login">'
            f'<input type="hidden" name="csrf" value="{e(csrf)}">'
            '<label for="token">Token</label> '
            '<input id="token" name="token" type="password" autocomplete="off" required> '
            '<button type="submit">sign in</button></form>'
        )
    else:
        session = '<span class="note">read-only (no admin.token_file)</span>'
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="color-scheme" content="light dark">'
        f"<title>{e(title)}</title>"
        '<link rel="icon" href="/static/icon.svg" type="image/svg+xml">'
        '<link rel="stylesheet" href="/static/page.css">'
        '<script src="/static/page.js" defer></script></head><body>'
        '<a class="skip-link" href="#main">Skip to content</a>'
        '<header><nav><a href="/" class="brand">anarchon-sidecar</a> '
        '<span id="live" class="live" aria-live="polite">static</span></nav>'
        f'<div class="session">{session}</div></header>'
        f'<main id="main">{body}</main>'
        "<footer>A job's times are in its schedule's timezone, the others in yours; "
        "each names its zone, and hovering shows UTC. "
        '<a href="/api/v1/jobs">JSON API</a></footer></body></html>\n'
    )


# ---------------------------------------------------------------------- the fleet


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


# ---------------------------------------------------------------------- one job


def answer_block(run: dict[str, Any]) -> str:
    """The start of the app's answer its result kept (docs/TRIGGER.md), escaped: its
    content type and how much, then the text (base64 when binary); "" when none."""
    answer = run.get("answer")
    if not isinstance(answer, str):
        return ""
    ctype = run.get("answer_type")
    marks = [str(ctype) if ctype else "no content type"]
    if run.get("answer_base64") is True:
        marks.append("binary, base64")
    if run.get("answer_cut") is True:
        marks.append("cut")
    return (
        f'<details class="answer"><summary>answer ({e(", ".join(marks))})</summary>'
        # Line by line: a newline is the answer's own, any other control is escaped.
        f"<pre>{chr(10).join(e(line) for line in answer.split(chr(10)))}</pre></details>"
    )


def run_row(run: dict[str, Any], tz: object = None) -> str:
    trigger = "manual" if run.get("manual") else "schedule"
    error = run.get("error")
    detail = e(error) if error else ""
    detail += answer_block(run)
    late = run.get("late_ms")
    took = run.get("duration_ms")
    return (
        f"<tr><td>{mark(run.get('status'))} {e(run.get('status'))}</td><td>{trigger}</td>"
        f"<td class='num'>{e(run.get('attempt', 1))}</td><td>{e(run.get('instance'))}</td>"
        f"<td>{when(run.get('scheduled_at'), tz)}</td><td>{when(run.get('started_at'), tz)}</td>"
        f"<td class='num'>{seconds(late / 1000) if isinstance(late, int) else DASH}</td>"
        f"<td class='num'>{seconds(took / 1000) if isinstance(took, int) else DASH}</td>"
        f"<td class='num'>{e(run.get('http_status') or '') or DASH}</td>"
        f"<td class='err'>{detail or DASH}</td>"
        f"<td class='id'>{ident(run.get('token'))}</td>"
        f"<td class='id'>{ident(run.get('fence'))}</td></tr>"
    )


def action_forms(job: str, csrf: str, skip: bool) -> str:
    base = e(job_href(job))
    token = f'<input type="hidden" name="csrf" value="{e(csrf)}">'
    skip_form = (
        f'<form method="post" action="{base}/skip" class="skip">{token}'
        '<label for="count">Runs</label> <input id="count" name="count" type="number" min="1" '
        'max="1000" value="1" inputmode="numeric"> '
        '<button type="submit">Skip next runs everywhere</button></form>'
        if skip
        else ""
    )
    return (
        '<section aria-labelledby="act-h" class="actions"><h2 id="act-h">Act</h2>'
        f'<form method="post" action="{base}/run-now">{token}'
        '<button type="submit">Run now (from this sidecar)</button></form>'
        f'<form method="post" action="{base}/pause" class="pause">{token}'
        '<label for="reason">Reason</label> <input id="reason" name="reason" maxlength="200"> '
        '<label for="until">Until</label> <input id="until" name="until" maxlength="40" '
        'placeholder="30m, 2h or 2026-12-24T08:00:00Z"> '
        '<button type="submit">Pause everywhere</button></form>'
        f'<form method="post" action="{base}/resume">{token}'
        f'<button type="submit">Resume</button></form>{skip_form}</section>'
    )


def at_section(job: str, pending: list[dict[str, Any]], csrf: str | None) -> str:
    """One-off runs (``at``): those pending, each with a cancel button, and a form to
    queue one, when signed in (`csrf`); the list alone otherwise."""
    base = e(job_href(job))
    token = f'<input type="hidden" name="csrf" value="{e(csrf)}">' if csrf else ""
    rows = "".join(
        f"<tr><td>{when(run.get('at'))}</td><td>{e(run.get('by'))}</td>"
        f"<td>{e(run.get('reason'))}</td><td>"
        + (
            f'<form method="post" action="{base}/cancel-at">{token}'
            f'<input type="hidden" name="time" value="{e(run.get("slot"))}">'
            '<button type="submit">Cancel</button></form>'
            if csrf
            else ""
        )
        + "</td></tr>"
        for run in pending
    )
    table = (
        '<div class="scroll"><table><thead><tr><th scope="col">At</th><th scope="col">By</th>'
        f'<th scope="col">Reason</th><th scope="col"></th></tr></thead><tbody>{rows}'
        "</tbody></table></div>"
        if rows
        else "<p>None pending.</p>"
    )
    form = (
        f'<form method="post" action="{base}/at" class="at">{token}'
        '<label for="at-time">At</label> <input id="at-time" name="time" maxlength="40" '
        'required placeholder="30m, 2h or 2026-12-24T08:00:00Z"> '
        '<label for="at-reason">Reason</label> <input id="at-reason" name="reason" '
        'maxlength="200"> <button type="submit">Run once then, by the fleet</button></form>'
        if csrf
        else ""
    )
    return (
        '<section aria-labelledby="at-h" class="at"><h2 id="at-h">One-off runs</h2>'
        f"{table}{form}</section>"
    )


def job_page(
    job: dict[str, Any],
    runs: list[dict[str, Any]],
    next_before: int | None,
    actions: list[dict[str, Any]],
    forms: str,
    limit: int,
) -> str:
    name = str(job["name"])
    head = jobs_table([job_row(job)], 1, '<h2 id="jobs-h" class="vh">Now</h2>')
    tz = job.get("timezone")
    none = "<tr><td colspan='12'>No runs recorded.</td></tr>"
    rows = "".join(run_row(r, tz) for r in runs) or none
    more = (
        f'<p><a href="{e(job_href(name))}?before={next_before}&amp;limit={limit}" rel="next">'
        "Older runs →</a></p>"
        if next_before
        else ""
    )
    acts = "".join(
        f"<tr><td>{when(a.get('at'))}</td><td>{e(a.get('action'))}</td><td>{e(a.get('by'))}</td>"
        f"<td>{e(a.get('from'))}</td><td>{e(a.get('instance'))}</td><td>{e(a.get('detail'))}</td></tr>"
        for a in actions
    )
    return (
        f'<h1 id="job-title" data-job="{e(name)}">{e(name)} <small>{e(job.get("target"))}</small>'
        f"</h1>{source_line(job)}{request_line(job)}{head}{forms}"
        '<section aria-labelledby="runs-h"><h2 id="runs-h">Runs</h2><div class="scroll">'
        '<table class="runs"><thead><tr><th scope="col">Status</th><th scope="col">Trigger</th>'
        '<th scope="col">Attempt</th><th scope="col">Instance</th><th scope="col">Scheduled</th>'
        '<th scope="col">Started</th><th scope="col">Late</th><th scope="col">Duration</th>'
        '<th scope="col">HTTP</th><th scope="col">Error</th><th scope="col">Run id</th>'
        f'<th scope="col">Fence</th></tr></thead><tbody id="runs-body">{rows}</tbody></table>'
        f"</div>{more}</section>"
        '<section aria-labelledby="acts-h"><h2 id="acts-h">Actions on this job</h2>'
        '<div class="scroll"><table><thead><tr><th scope="col">When</th>'
        '<th scope="col">What</th><th scope="col">By</th><th scope="col">From</th>'
        '<th scope="col">Served by</th><th scope="col">Detail</th></tr></thead>'
        f'<tbody id="acts-body">{acts or "<tr><td colspan=6>None recorded.</td></tr>"}'
        "</tbody></table></div></section>"
    )


def message(title: str, text: str) -> str:
    return f"<h1>{e(title)}</h1><p>{e(text)}</p><p><a href='/'>Back to the fleet</a></p>"
