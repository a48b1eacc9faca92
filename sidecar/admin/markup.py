"""The fleet page's HTML bricks: escaping, times, status marks, links, the layout.

Every value that comes from the config, the stream or the state bucket goes
through ``e()`` (HTML escaping, quotes included): stream data is written by
whoever can publish, and is treated as hostile. No inline script or style
(the Content-Security-Policy forbids both): page.js and page.css come from
``/static/``. Times are ``<time datetime=UTC>`` elements; page.js rewrites
them into the viewer's local time with its zone's name and keeps the UTC
instant in the title. A job's own times (its next runs, its runs' scheduled
and start times) are in its schedule's timezone instead (``data-tz``), shown
so by the server too, zone name included, so they read as the schedule does.
Status marks carry a symbol and a word, never colour alone. The pages built
of them: sidecar/admin/page.py (the fleet), sidecar/admin/jobpage.py (one job).
"""

from __future__ import annotations

from datetime import datetime
from html import escape
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


def message(title: str, text: str) -> str:
    return f"<h1>{e(title)}</h1><p>{e(text)}</p><p><a href='/'>Back to the fleet</a></p>"
