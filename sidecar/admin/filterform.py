"""The fleet page's job filter: a glob, problems only, and the next page of jobs.

With 100,000 jobs the page shows one page of them (sidecar/admin/jobfilter.py);
this is the form above the table, its query read back (``selection_of``) and
the link below it (docs/ADMIN.md).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from sidecar.admin.jobfilter import DEFAULT_LIMIT, MAX_LIMIT, Selection, check_glob
from sidecar.admin.markup import e
from sidecar.config.fields import whole


def job_filter(sel: Selection, picked: dict[str, Any], total: int) -> str:
    """The filter form (a GET: the filtered page has its own address)."""
    checked = " checked" if sel.problems else ""
    if sel.narrowed or picked["next_after"] or sel.after:
        shown = f"{picked['shown']} of {picked['matched']} matching, {total} jobs in all"
        if sel.problems:
            shown += "; only jobs with a problem"
        said = f'<p class="picked" id="picked">{e(shown)}</p>'
    else:
        said = ""
    return (
        '<form method="get" action="/" class="filter" role="search">'
        '<label for="job-glob">Jobs named</label> '
        f'<input id="job-glob" name="job" maxlength="200" placeholder="tenant-4*" '
        f'value="{e(",".join(sel.globs))}"> '
        f'<label><input type="checkbox" name="problems" value="1"{checked}> problems only</label> '
        '<button type="submit">Show</button></form>'
        f"{said}"
    )


def next_jobs(sel: Selection, picked: dict[str, Any]) -> str:
    """The link to the jobs after this page, keeping the filter; "" on the last page."""
    after = picked.get("next_after")
    if not after:
        return ""
    query: list[tuple[str, str]] = [("job", g) for g in sel.globs]
    if sel.problems:
        query.append(("problems", "1"))
    if sel.limit not in (None, DEFAULT_LIMIT):
        query.append(("limit", str(sel.limit)))
    query.append(("after", after))
    return f'<p><a href="/?{e(urlencode(query))}" rel="next" id="next-jobs">Next jobs →</a></p>'


def selection_of(q: dict[str, list[str]]) -> Selection:
    """``?job=GLOB&job=...&problems=1&limit=N&after=NAME`` (docs/ADMIN.md); ValueError
    naming the parameter when one is not what it may be."""
    globs = tuple(g for v in q.get("job", []) for g in v.split(",") if g)
    for glob in globs:
        try:
            check_glob(glob)
        except ValueError as exc:
            raise ValueError(f"job: {exc}") from None
    try:
        limit = whole(q["limit"][0]) if "limit" in q else DEFAULT_LIMIT
    except ValueError:
        raise ValueError("limit: a whole number") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit: from 1 to {MAX_LIMIT}")
    after = q["after"][0] if q.get("after") else None
    problems = q.get("problems", [""])[0] not in ("", "0", "false")
    return Selection(globs, problems, limit, after)
