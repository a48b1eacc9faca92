"""The fleet page's routes: HTML pages, ``/api/v1/...`` JSON, events, and actions.

Read (GET, anyone who reaches the admin port):
  ``/``, ``/jobs/<job>[?before=&limit=]``: the pages (sidecar/admin/page.py,
  sidecar/admin/jobpage.py);
  ``/api/v1/jobs``, ``/api/v1/jobs/<job>``, ``/api/v1/jobs/<job>/runs?limit=&before=``,
  ``/api/v1/fleet``: JSON built by sidecar/admin/objects.py, as ``status --json``;
  ``/api/v1/events``: server-sent events (sidecar/admin/live.py);
  ``/fragment/...``: pieces of the pages that page.js swaps in on an event.
Act (POST, only with ``admin.token_file``; without it every POST is 403):
  ``/api/v1/bucket-jobs/<job>/{add,update,remove}`` (jobs added at run time,
  sidecar/admin/bucket_jobs.py), with the bearer token only;
  ``/api/v1/jobs/<job>/{run-now,pause,resume,skip,at,cancel-at}`` with
  ``Authorization: Bearer <token>``; the same from the page's forms at
  ``/jobs/<job>/<action>`` with the session cookie that ``/login`` gives for a
  token, and the form's CSRF token. Sessions are signed with a key made at
  start (a restart signs everyone out) and name the token, never hold it.

What is shown is built and kept current by sidecar/admin/pagecache.py, who is
signed in is sidecar/admin/sessions.py's business, what a job is asked to do
sidecar/admin/jobacts.py's; this module routes and answers. Big answers are
compressed in a thread for the browsers that accept gzip.
"""

from __future__ import annotations

import asyncio
import gzip
import hmac
import json
import logging
import time
from importlib import resources
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote

from nats.js import JetStreamContext

from sidecar.admin import jobpage, markup, page
from sidecar.admin.actions import ManualRuns
from sidecar.admin.filterform import job_filter, next_jobs, selection_of
from sidecar.admin.jobacts import ACTIONS, JobActs
from sidecar.admin.jobwrite import API_ACTIONS, api_action
from sidecar.admin.live import Live
from sidecar.admin.pagecache import PageData
from sidecar.admin.server import Answer, Request, Stream
from sidecar.admin.sessions import Sessions
from sidecar.admin.tokens import TokenFile
from sidecar.config.fields import whole
from sidecar.config.load import Config, Secrets
from sidecar.core.clock import Clock
from sidecar.core.errors import SidecarError
from sidecar.obs.exposition import RENDER_SLICE

if TYPE_CHECKING:
    from sidecar.admin.jobkeys import JobKeys
    from sidecar.fleet.member import Fleet
    from sidecar.store.guard import StreamGuard

log = logging.getLogger(__name__)

RUNS_LIMIT = 50
RUNS_MAX = 200
COMPRESS_OVER = 16 * 1024
JSON = "application/json"
HTML = "text/html; charset=utf-8"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
)
STATIC = {
    "page.css": "text/css; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "icon.svg": "image/svg+xml",
}


def _json(status: int, data: object) -> Answer:
    return Answer(status, JSON, json.dumps(data).encode(), SECURITY)


def _html(status: int, text: str, extra: tuple[tuple[str, str], ...] = ()) -> Answer:
    return Answer(status, HTML, text.encode(), (*SECURITY, *extra))


class PageApp:
    """The routes above for one sidecar."""

    def __init__(
        self,
        config: Config,
        fleet: Fleet,
        guard: StreamGuard,
        clock: Clock | None = None,
        job_secrets: Secrets | None = None,
        tokens: TokenFile | None = None,
        *,
        bucket_jobs: JobKeys | None = None,
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.jobs = fleet.jobs  # the job set (sidecar/config/jobset.py)
        self.guard = guard
        self.clock = clock or Clock()
        self.live = Live(config, fleet)
        self.tokens = tokens or TokenFile(config.admin.token_file)
        self.sessions = Sessions(self.tokens)
        # Jobs of the state bucket (POST /api/v1/bucket-jobs/...), the daemon's.
        self.bucket_jobs = bucket_jobs
        self.data = PageData(config, fleet, guard, self.clock, self.live, bucket_jobs=bucket_jobs)
        # What the page's forms and the API do to a job (its run-now runs: ``attach``).
        self.acts = JobActs(config, fleet, job_secrets)
        self._static = {
            name: (resources.files("sidecar").joinpath("static", name).read_bytes(), ctype)
            for name, ctype in STATIC.items()
        }

    def attach(self, js: JetStreamContext, runs: ManualRuns | None) -> None:
        self.data.js = js
        self.acts.runs = runs
        self.live.attach(js)

    # ------------------------------------------------------------------ routes

    async def __call__(self, req: Request) -> Answer | Stream | None:
        if not self.config.admin.page:
            return None
        parts = [unquote(p) for p in req.path.split("/")[1:]]
        try:
            if req.method == "POST":
                return await self._post(req, parts)
            if req.method not in ("GET", "HEAD"):
                return _json(405, {"error": "method not allowed"})
            answer = await self._get(req, parts)
        except SidecarError as exc:
            return _json(503, {"error": str(exc)})
        if (
            isinstance(answer, Answer)
            and len(answer.body) > COMPRESS_OVER
            and "gzip" in req.headers.get("accept-encoding", "")
        ):
            # zlib lets go of the GIL: the loop goes on while a big page is packed.
            body = await asyncio.to_thread(gzip.compress, answer.body, 1, mtime=0)
            extra = (("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding"))
            return Answer(answer.status, answer.ctype, body, (*answer.headers, *extra))
        return answer

    async def _get(self, req: Request, parts: list[str]) -> Answer | Stream | None:
        q = parse_qs(req.query)
        if parts == [""]:
            try:
                return _html(200, await self._index(req))
            except ValueError as exc:
                said = markup.message("Not a job filter", str(exc))
                return _html(400, self._wrap(req, "Bad request", said))
        if parts == ["favicon.ico"]:
            parts = ["static", "icon.svg"]
        if parts[:1] == ["static"] and len(parts) == 2 and parts[1] in self._static:
            body, ctype = self._static[parts[1]]
            return Answer(200, ctype, body, (*SECURITY[:-1], ("Cache-Control", "max-age=300")))
        if parts[:1] == ["jobs"] and len(parts) == 2:
            if parts[1] not in self.jobs:
                return _html(404, self._wrap(req, "Not found", markup.message("No such job", "")))
            return _html(200, await self._job_page(req, parts[1], q))
        if parts[:1] == ["fragment"]:
            return await self._fragment(req, parts[1:], q)
        if parts[:2] != ["api", "v1"]:
            return None
        rest = parts[2:]
        if rest == ["jobs"]:
            try:
                jobs, picked = await self.data.selected(selection_of(q))
            except ValueError as exc:  # a parameter, named
                return _json(400, {"error": str(exc)})
            return _json(200, {"jobs": jobs, "selection": picked})
        if rest == ["fleet"]:
            return _json(200, await self.data.fleet_data())
        if rest == ["events"]:
            return Stream(self.live.events(), headers=SECURITY)
        if rest[:1] == ["jobs"] and len(rest) in (2, 3):
            name = rest[1]
            if name not in self.jobs:
                return _json(404, {"error": f"no job named {name!r} in this sidecar's config"})
            limit, before = _paging(q)
            if len(rest) == 3 and rest[2] == "runs":
                return _json(200, await self.data.runs_data(name, limit, before))
            if len(rest) == 2:
                data = self.data.job_data(name)
                data["actions"] = self.data.actions_data(name)
                return _json(200, data)
        return _json(404, {"error": "not found"})

    # ------------------------------------------------------------------ pages

    def _wrap(self, req: Request, title: str, body: str) -> str:
        who = self.sessions.who(req)
        csrf = self.sessions.csrf(req) if who else self.sessions.login_csrf()
        return markup.layout(title, body, who, csrf, self.tokens.enabled)

    async def _index(self, req: Request) -> str:
        sel = selection_of(parse_qs(req.query))  # ValueError: a 400 (_get)
        jobs, picked = await self.data.selected(sel)
        rows = []
        since = time.perf_counter()
        for job in jobs:
            rows.append(self.data.row(job))
            if time.perf_counter() - since > RENDER_SLICE:
                await asyncio.sleep(0)
                since = time.perf_counter()
        body = (
            job_filter(sel, picked, len(self.jobs))
            + page.jobs_table(rows, len(jobs) if not picked["next_after"] else picked["matched"])
            + next_jobs(sel, picked)
            + page.fleet_section(await self.data.fleet_data())
        )
        if not self.guard.connected.is_set():
            body = page.UNREACHABLE + body
        return self._wrap(req, f"Fleet · {self.config.instance_id}", body)

    async def _job_page(self, req: Request, name: str, q: dict[str, list[str]]) -> str:
        limit, before = _paging(q)
        title = f"{name} · fleet"
        if self.guard.connected.is_set():
            return self._wrap(req, title, await self._job_body(req, name, limit, before))
        try:  # NATS down: the runs read last, else none; at once either way
            body = await self._job_body(req, name, limit, before)
        except SidecarError:
            body = markup.message(name, "Its runs are read from the stream, out of reach now.")
        return self._wrap(req, title, page.UNREACHABLE + body)

    async def _job_body(self, req: Request, name: str, limit: int, before: int | None) -> str:
        runs = await self.data.runs_data(name, limit, before)
        who = self.sessions.who(req)
        forms = ""
        data = self.data.job_data(name)
        csrf = self.sessions.csrf(req) if who else None
        if csrf:
            forms = jobpage.action_forms(name, csrf, self.acts.secrets is not None)
        forms += jobpage.at_section(name, data.get("at_pending") or [], csrf)
        return jobpage.job_page(
            data,
            runs["runs"],
            runs["next_before"],
            self.data.actions_data(name),
            forms,
            limit,
        )

    async def _fragment(
        self, req: Request, rest: list[str], q: dict[str, list[str]]
    ) -> Answer | None:
        if rest == ["jobs"]:
            # objects() builds again what changed (the event that asks came
            # after the change), of the rows asked for only.
            wanted = ",".join(q.get("names", [])).split(",")
            rows = [self.data.row(job) for job in await self.data.objects(wanted)]
            return _html(200, "".join(rows))
        if rest == ["fleet"]:
            return _html(200, page.fleet_section(await self.data.fleet_data()))
        if len(rest) == 2 and rest[0] == "job" and rest[1] in self.jobs:
            limit, before = _paging(q)
            return _html(200, await self._job_body(req, rest[1], limit, before))
        return None

    # ------------------------------------------------------------------ acting

    async def _post(self, req: Request, parts: list[str]) -> Answer:
        if not self.tokens.enabled:
            return _json(403, {"error": "read-only: this sidecar has no admin.token_file"})
        form = _form(req)
        if parts == ["login"]:
            return self._login(req, form)
        if parts == ["logout"]:
            if not (
                self.sessions.same_origin(req)
                and hmac.compare_digest(form.get("csrf", ""), self.sessions.csrf(req))
            ):
                return _json(403, {"error": "bad or missing CSRF token; reload the page"})
            return self._logout()
        api = parts[:2] == ["api", "v1"]
        rest = parts[2:] if api else parts
        if api and len(rest) == 3 and rest[0] == "bucket-jobs" and rest[2] in API_ACTIONS:
            return await self._bucket_job(req, rest[1], rest[2])
        if len(rest) != 3 or rest[0] != "jobs" or rest[2] not in ACTIONS:
            return _json(404, {"error": "not found"})
        job, action = rest[1], rest[2]
        if api:
            auth = req.headers.get("authorization", "")
            scheme, _, presented = auth.partition(" ")
            who = self.tokens.who(presented.strip()) if scheme.lower() == "bearer" else None
            if who is None:
                return _json(401, {"error": "a valid Authorization: Bearer <token> is needed"})
        else:
            who = self.sessions.who(req)
            if who is None:
                return _json(401, {"error": "sign in with a token first"})
            given = form.get("csrf", "")
            if not (
                self.sessions.same_origin(req)
                and hmac.compare_digest(given, self.sessions.csrf(req))
            ):
                return _json(403, {"error": "bad or missing CSRF token; reload the page"})
        if job not in self.jobs:
            return _json(404, {"error": f"no job named {job!r} in this sidecar's config"})
        via = "api" if api else "page"
        status, result = await self.acts.act(job, action, who, req.peer, form, via)
        if api:
            return _json(status, result)
        location = markup.job_href(job) + ("" if status < 300 else "?error=1")
        return Answer(303, "text/plain; charset=utf-8", b"", (*SECURITY, ("Location", location)))

    async def _bucket_job(self, req: Request, name: str, action: str) -> Answer:
        """Add, update or remove a job of the state bucket (sidecar/admin/jobwrite.py):
        with the admin token only, as the CLI would."""
        auth = req.headers.get("authorization", "")
        scheme, _, presented = auth.partition(" ")
        who = self.tokens.who(presented.strip()) if scheme.lower() == "bearer" else None
        if who is None:
            return _json(401, {"error": "a valid Authorization: Bearer <token> is needed"})
        bucket = self.fleet.bucket
        if bucket is None or self.bucket_jobs is None:
            return _json(503, {"error": "the state bucket is not open yet"})
        status, result = await api_action(
            self.config, self.bucket_jobs.file_names, bucket.kv, name, action, req.body, who
        )
        return _json(status, result)

    def _login(self, req: Request, form: dict[str, str]) -> Answer:
        if not self.sessions.same_origin(req):
            return _json(403, {"error": "cross-site sign-in refused"})
        # As every form: the sign-in form's CSRF token, curl or browser alike.
        if not self.sessions.login_csrf_ok(form.get("csrf", "")):
            return _json(403, {"error": "bad or missing CSRF token; reload the page"})
        name = self.tokens.who(form.get("token", ""))
        if name is None:
            body = markup.message("Sign-in refused", "That token is not in admin.token_file.")
            login = self.sessions.login_csrf()
            return _html(401, markup.layout("Sign-in refused", body, None, login, True))
        cookie = self.sessions.set_cookie(name)
        log.info("fleet page: %s signed in from %s", name, req.peer)
        return Answer(
            303,
            "text/plain; charset=utf-8",
            b"",
            (*SECURITY, ("Set-Cookie", cookie), ("Location", "/")),
        )

    def _logout(self) -> Answer:
        cookie = self.sessions.clear_cookie()
        return Answer(
            303,
            "text/plain; charset=utf-8",
            b"",
            (*SECURITY, ("Set-Cookie", cookie), ("Location", "/")),
        )


def _form(req: Request) -> dict[str, str]:
    """The fields of a form or JSON body (first value of each)."""
    ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
    if not req.body:
        return {}
    if ctype == "application/json":
        try:
            data = json.loads(req.body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): str(v) for k, v in data.items() if isinstance(v, str | int | float)}
    fields = parse_qs(req.body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in fields.items() if v}


def _paging(q: dict[str, list[str]]) -> tuple[int, int | None]:
    try:
        limit = max(1, min(RUNS_MAX, whole(str(q.get("limit", [RUNS_LIMIT])[0]))))
    except ValueError:
        limit = RUNS_LIMIT
    try:
        before = whole(q["before"][0]) if "before" in q else None
    except ValueError:
        before = None
    return limit, before
