"""One job's page as HTML: its settings, its runs, the acts on it, its trail.

Pure, as sidecar/admin/page.py: built of the bricks of sidecar/admin/markup.py
and of the fleet's row of the job (``job_row``), from the objects of
sidecar/admin/objects.py; every value from the stream or the bucket escaped.
"""

from __future__ import annotations

from typing import Any

from sidecar.admin.markup import DASH, e, ident, job_href, mark, seconds, when
from sidecar.admin.page import (
    job_row,
    jobs_table,
    request_line,
    source_line,
)


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
