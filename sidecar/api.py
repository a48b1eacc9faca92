"""The fleet page's routes: HTML pages, ``/api/v1/...`` JSON, events, and actions.

Read (GET, anyone who reaches the admin port):
  ``/``, ``/jobs/<job>[?before=&limit=]``: the pages (sidecar/page.py);
  ``/api/v1/jobs``, ``/api/v1/jobs/<job>``, ``/api/v1/jobs/<job>/runs?limit=&before=``,
  ``/api/v1/fleet``: JSON built by sidecar/board.py, as ``status --json``;
  ``/api/v1/events``: server-sent events (sidecar/live.py);
  ``/fragment/...``: pieces of the pages that page.js swaps in on an event.
Act (POST, only with ``admin.token_file``; without it every POST is 403):
  ``/api/v1/jobs/<job>/{run-now,pause,resume,skip}`` with
  ``Authorization: Bearer <token>``; the same from the page's forms at
  ``/jobs/<job>/<action>`` with the session cookie that ``/login`` gives for a
  token, and the form's CSRF token. Sessions are signed with a key made at
  start (a restart signs everyone out) and name the token, never hold it.

Building 1,000 jobs' objects from scratch takes about 200 ms (their next
slots, mostly): it is done once, in slices (the loop is handed back every
``RENDER_SLICE``); after that only the jobs that changed are built and
rendered again (``jobs_data``), and big answers are compressed in a thread
for the browsers that accept gzip.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import hashlib
import hmac
import json
import logging
import secrets
import time
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote

from nats.js import JetStreamContext

from sidecar import page
from sidecar.actions import ManualRuns, actions_key, actions_of, pause, record_action, resume
from sidecar.board import NEXT_RUNS, fleet_part, job_object, stream_object
from sidecar.clock import Clock, parse_rfc3339, rfc3339
from sidecar.config import Config, Secrets
from sidecar.errors import SidecarError
from sidecar.exposition import RENDER_SLICE
from sidecar.live import Live
from sidecar.ops import skip as skip_runs
from sidecar.ops import until_of
from sidecar.orphans import run_by
from sidecar.runs import read_history
from sidecar.server import Answer, Request, Stream
from sidecar.skips import MAX_SKIP
from sidecar.state import View, mismatched_jobs
from sidecar.stream import StreamState, state_of
from sidecar.tokens import TokenFile

if TYPE_CHECKING:
    from sidecar.fleet import Fleet
    from sidecar.guard import StreamGuard

log = logging.getLogger(__name__)

RUNS_LIMIT = 50
RUNS_MAX = 200
HISTORY_REUSE = 1.0
COMPRESS_OVER = 16 * 1024
STREAM_REUSE = 2.0
SESSION_TTL = 12 * 3600
COOKIE = "anarchon_session"
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
ACTIONS = ("run-now", "pause", "resume", "skip")


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
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.guard = guard
        self.clock = clock or Clock()
        self.live = Live(config, fleet)
        self.tokens = TokenFile(config.admin.token_file)
        self.js: JetStreamContext | None = None
        self.runs: ManualRuns | None = None
        # ``skip`` writes with the CLI's own function, on its own connection.
        self.secrets = job_secrets
        self._key = secrets.token_bytes(32)
        self._objs: dict[str, dict[str, Any]] = {}  # job objects, by name
        self._rows: dict[str, str] = {}  # their rows of the table, rendered
        self._next_ms: dict[str, int] = {}  # each object's next slot: stale after it
        self._list: list[dict[str, Any]] = []
        self._running: set[str] = set()
        self._soonest = 0  # the earliest next slot of any job: objects are stale after it
        self._built_with: tuple[set[str], dict[str, str | None], dict[str, list[str]]] | None = None
        self._jobs_pending: asyncio.Future[list[dict[str, Any]]] | None = None
        self._stream: StreamState | None = None
        self._stream_at = 0.0
        self._history: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._static = {
            name: (resources.files("sidecar").joinpath("static", name).read_bytes(), ctype)
            for name, ctype in STATIC.items()
        }

    def attach(self, js: JetStreamContext, runs: ManualRuns | None) -> None:
        self.js = js
        self.runs = runs
        self.live.attach(js)

    # ------------------------------------------------------------------ data

    async def jobs_data(self) -> list[dict[str, Any]]:
        """Every job's object, current; only the jobs that changed are built again.

        A job is built again when the feed or the bucket's watch said it
        changed, when its next slot has passed, while it runs (its "for how
        long"), and all of them when the instances' settings or the stream's
        coverage changed. The rest are reused: with 1,000 jobs a page load
        costs the few that changed, not 1,000 schedules' next slots. The
        building is shared by concurrent requests and yields every
        RENDER_SLICE.
        """
        if self._jobs_pending is None:
            self._jobs_pending = asyncio.ensure_future(self._build_jobs())
        return await asyncio.shield(self._jobs_pending)

    async def _build_jobs(self) -> list[dict[str, Any]]:
        try:
            self.live.ensure_started()
            if not self.live.loaded.is_set():
                # Shown with what is known after that; events fill in the rest.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.live.loaded.wait(), 5.0)
            view = self.fleet.view
            mismatch = mismatched_jobs(view.instances())
            held = self._held()
            now_ms = self.clock.wall_ms()
            dirty = self.live.dirty
            self.live.dirty = set()
            runners = run_by(view.instances())
            if (mismatch, held, runners) != self._built_with:
                dirty = set(self.config.job_names)
                self._built_with = (mismatch, held, runners)
            if not dirty and not self._running and now_ms < self._soonest:
                return self._list  # nothing changed, no next slot passed: no walk at all
            since = time.perf_counter()
            for job in self.config.jobs:
                old = self._objs.get(job.name)
                if (
                    old is not None
                    and job.name not in dirty
                    and not old["running"]
                    and self._next_ms.get(job.name, 0) > now_ms
                ):
                    continue
                self._objs[job.name] = self._build(job.name, view, now_ms, mismatch, held, runners)
                self._rows.pop(job.name, None)
                if time.perf_counter() - since > RENDER_SLICE:
                    await asyncio.sleep(0)
                    since = time.perf_counter()
            self._list = [self._objs[name] for name in self.config.job_names]
            self._running = {j["name"] for j in self._list if j["running"]}
            self._soonest = min(self._next_ms.values(), default=now_ms)
            return self._list
        finally:
            self._jobs_pending = None

    def _build(
        self,
        name: str,
        view: View,
        now_ms: int,
        mismatch: set[str],
        held: dict[str, str | None],
        runners: dict[str, list[str]],
    ) -> dict[str, Any]:
        job = self.config.job(name)
        upcoming = job.schedule.runs(now_ms, NEXT_RUNS)  # exclusions applied
        self._next_ms[name] = upcoming[0]
        return job_object(job, view, self.live.recent, now_ms, mismatch, held, upcoming, runners)

    def row(self, job: dict[str, Any]) -> str:
        """A job's row of the table, rendered once per change."""
        name = str(job["name"])
        html = self._rows.get(name)
        if html is None:
            html = self._rows[name] = page.job_row(job)
        return html

    def _held(self) -> dict[str, str | None]:
        uncovered = getattr(self.guard, "uncovered", None) or {}
        return {name: uncovered.get(name) for name in self.config.job_names}

    def job_data(self, name: str) -> dict[str, Any]:
        """One job's object, fresh (one job is cheap); the shared ones stay as they are."""
        view = self.fleet.view
        mismatch = mismatched_jobs(view.instances())
        job = self.config.job(name)
        now_ms = self.clock.wall_ms()
        runners = run_by(view.instances())
        held = self._held()
        return job_object(job, view, self.live.recent, now_ms, mismatch, held, runners=runners)

    async def _stream_state(self) -> StreamState | None:
        """The stream's state, read at most every STREAM_REUSE seconds (else the guard's)."""
        if self.js is not None and time.monotonic() - self._stream_at > STREAM_REUSE:
            self._stream_at = time.monotonic()
            try:
                info = await self.js.stream_info(self.guard.spec.name)
                self._stream = state_of(info)
            except Exception as exc:  # shown as the guard last saw it
                log.debug("fleet page: stream info: %r", exc)
                self._stream = None
        return self._stream or self.guard.stream_state

    async def fleet_data(self) -> dict[str, Any]:
        state = await self._stream_state()
        stream = stream_object(state, self.guard.answered_domain) if state is not None else None
        bucket = {
            "name": self.fleet.spec.bucket,
            "problem": self.fleet.bucket_problem,
            "keys": len(self.fleet.view.keys),
        }
        now_ms = self.clock.wall_ms()
        fleet = fleet_part(self.config, self.fleet.view, stream, bucket, now_ms, self.live.seen)
        return {**fleet, "served_by": self.config.instance_id}

    async def runs_data(self, name: str, limit: int, before: int | None) -> dict[str, Any]:
        cached = self._history.get(name)
        if cached is not None and time.monotonic() - cached[0] < HISTORY_REUSE:
            runs = cached[1]
        else:
            if self.js is None:
                raise SidecarError("not connected to NATS yet")
            spec = self.guard.spec
            latest = self.clock.wall_ms() + round(self.config.nats.duplicate_window * 1000)
            hist = await read_history(self.js, spec.name, spec.prefix, name, latest)
            runs = [_run_object(r.as_dict(), r.seq) for r in hist.runs]
            if len(self._history) > 8:
                self._history.clear()
            self._history[name] = (time.monotonic(), runs)
        start = 0
        if before is not None:
            start = next((i + 1 for i, r in enumerate(runs) if r["fence"] == before), None) or next(
                (i for i, r in enumerate(runs) if r["fence"] < before), len(runs)
            )
        page_runs = runs[start : start + limit]
        more = start + limit < len(runs)
        return {
            "runs": page_runs,
            "next_before": page_runs[-1]["fence"] if more and page_runs else None,
        }

    def actions_data(self, name: str) -> list[dict[str, Any]]:
        entry = self.fleet.view.keys.get(actions_key(name))
        return actions_of(entry.value) if entry is not None else []

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
            return _html(200, await self._index(req))
        if parts == ["favicon.ico"]:
            parts = ["static", "icon.svg"]
        if parts[:1] == ["static"] and len(parts) == 2 and parts[1] in self._static:
            body, ctype = self._static[parts[1]]
            return Answer(200, ctype, body, (*SECURITY[:-1], ("Cache-Control", "max-age=300")))
        if parts[:1] == ["jobs"] and len(parts) == 2:
            if parts[1] not in self.config.job_names:
                return _html(404, self._wrap(req, "Not found", page.message("No such job", "")))
            return _html(200, await self._job_page(req, parts[1], q))
        if parts[:1] == ["fragment"]:
            return await self._fragment(req, parts[1:], q)
        if parts[:2] != ["api", "v1"]:
            return None
        rest = parts[2:]
        if rest == ["jobs"]:
            return _json(200, {"jobs": await self.jobs_data()})
        if rest == ["fleet"]:
            return _json(200, await self.fleet_data())
        if rest == ["events"]:
            return Stream(self.live.events(), headers=SECURITY)
        if rest[:1] == ["jobs"] and len(rest) in (2, 3):
            name = rest[1]
            if name not in self.config.job_names:
                return _json(404, {"error": f"no job named {name!r} in this sidecar's config"})
            limit, before = _paging(q)
            if len(rest) == 3 and rest[2] == "runs":
                return _json(200, await self.runs_data(name, limit, before))
            if len(rest) == 2:
                data = self.job_data(name)
                data["actions"] = self.actions_data(name)
                return _json(200, data)
        return _json(404, {"error": "not found"})

    # ------------------------------------------------------------------ pages

    def _wrap(self, req: Request, title: str, body: str) -> str:
        who = self._session(req)
        csrf = self._csrf(req) if who else None
        return page.layout(title, body, who, csrf, self.tokens.enabled)

    async def _index(self, req: Request) -> str:
        jobs = await self.jobs_data()
        rows = []
        since = time.perf_counter()
        for job in jobs:
            rows.append(self.row(job))
            if time.perf_counter() - since > RENDER_SLICE:
                await asyncio.sleep(0)
                since = time.perf_counter()
        body = page.jobs_table(rows, len(jobs)) + page.fleet_section(await self.fleet_data())
        return self._wrap(req, f"Fleet · {self.config.instance_id}", body)

    async def _job_page(self, req: Request, name: str, q: dict[str, list[str]]) -> str:
        limit, before = _paging(q)
        return self._wrap(req, f"{name} · fleet", await self._job_body(req, name, limit, before))

    async def _job_body(self, req: Request, name: str, limit: int, before: int | None) -> str:
        runs = await self.runs_data(name, limit, before)
        who = self._session(req)
        forms = ""
        if who:
            forms = page.action_forms(name, self._csrf(req), self.secrets is not None)
        return page.job_page(
            self.job_data(name),
            runs["runs"],
            runs["next_before"],
            self.actions_data(name),
            forms,
            limit,
        )

    async def _fragment(
        self, req: Request, rest: list[str], q: dict[str, list[str]]
    ) -> Answer | None:
        if rest == ["jobs"]:
            # jobs_data() builds again what changed (the event that asks came
            # after the change): every viewer asking at once shares one build.
            wanted = set(",".join(q.get("names", [])).split(","))
            rows = [self.row(job) for job in await self.jobs_data() if job["name"] in wanted]
            return _html(200, "".join(rows))
        if rest == ["fleet"]:
            return _html(200, page.fleet_section(await self.fleet_data()))
        if len(rest) == 2 and rest[0] == "job" and rest[1] in self.config.job_names:
            limit, before = _paging(q)
            return _html(200, await self._job_body(req, rest[1], limit, before))
        return None

    # ------------------------------------------------------------------ sessions

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()[:32]

    def _cookie(self, req: Request) -> str | None:
        for part in req.headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return value
        return None

    def _session(self, req: Request) -> str | None:
        """The token name of a valid session cookie, else None."""
        cookie = self._cookie(req)
        if not cookie or not self.tokens.enabled:
            return None
        try:
            raw_name, expires, sig = cookie.split("|")
            name = base64.urlsafe_b64decode(raw_name.encode()).decode()
            alive = int(expires) > time.time()
        except ValueError:
            return None
        ok = hmac.compare_digest(sig, self._sign(f"{raw_name}|{expires}"))
        if not (ok and alive):
            return None
        self.tokens.who("")  # re-reads a changed file: a removed name signs out
        return name if name in self.tokens.tokens else None

    def _csrf(self, req: Request) -> str:
        return self._sign("csrf|" + (self._cookie(req) or ""))

    def _same_origin(self, req: Request) -> bool:
        origin = req.headers.get("origin")
        if origin is None:  # not a browser (curl): the CSRF token still has to match
            return True
        host = req.headers.get("host", "")
        return origin.split("://", 1)[-1] == host

    # ------------------------------------------------------------------ acting

    async def _post(self, req: Request, parts: list[str]) -> Answer:
        if not self.tokens.enabled:
            return _json(403, {"error": "read-only: this sidecar has no admin.token_file"})
        form = _form(req)
        if parts == ["login"]:
            return self._login(req, form)
        if parts == ["logout"]:
            return self._logout()
        api = parts[:2] == ["api", "v1"]
        rest = parts[2:] if api else parts
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
            who = self._session(req)
            if who is None:
                return _json(401, {"error": "sign in with a token first"})
            given = form.get("csrf", "")
            if not (self._same_origin(req) and hmac.compare_digest(given, self._csrf(req))):
                return _json(403, {"error": "bad or missing CSRF token; reload the page"})
        if job not in self.config.job_names:
            return _json(404, {"error": f"no job named {job!r} in this sidecar's config"})
        via = "api" if api else "page"
        status, result = await self._act(job, action, who, req.peer, form, via)
        if api:
            return _json(status, result)
        location = page.job_href(job) + ("" if status < 300 else "?error=1")
        return Answer(303, "text/plain; charset=utf-8", b"", (*SECURITY, ("Location", location)))

    async def _act(
        self, job: str, action: str, who: str, peer: str, form: dict[str, str], via: str
    ) -> tuple[int, dict[str, Any]]:
        bucket = self.fleet.bucket
        if bucket is None:
            return 503, {"error": "the state bucket is not open yet"}
        detail = ""
        result: dict[str, Any] = {"job": job, "action": action, "by": who}
        if action == "pause":
            reason = form.get("reason", "")[:200]
            until = form.get("until", "").strip() or None
            if until is not None:  # parsed as `pause --until` does: a time or a duration
                try:
                    until = rfc3339(until_of(until, time.time()))
                except ValueError as exc:
                    return 400, {"error": f"until: {exc}"}
            value = await pause(bucket.kv, job, who, reason, until)
            detail = reason + (f" (until {until})" if until else "")
            result["pause"] = value
        elif action == "resume":
            was = await resume(bucket.kv, job)
            if was is None:
                return 409, {"error": f"{job} was not paused"}
            detail = f"paused by {was.get('by', '?')} at {was.get('at', '?')}"
        elif action == "run-now":
            if self.runs is None:
                return 503, {"error": "not connected to NATS yet"}
            token = await self.runs.start(job)
            detail = f"run {token}"
            result["run_id"] = token
        else:
            if self.secrets is None:
                return 503, {"error": "skip is not available on this sidecar"}
            try:
                count = int(form.get("count", "1") or "1")
            except ValueError:
                return 400, {"error": f"count: a whole number 1 to {MAX_SKIP}"}
            reason = form.get("reason", "")[:200]
            try:  # the same write as `anarchon-sidecar skip`
                added, left = await skip_runs(
                    self.config, self.secrets, self.config.job(job), count, who, reason
                )
            except ValueError as exc:
                return 400, {"error": f"count: {exc}"}
            detail = f"skip {', '.join(rfc3339(s / 1000) for s in added)}" + (
                f": {reason}" if reason else ""
            )
            result["skipped"] = added  # the slots' ids (epoch ms), as ``skip.<job>`` holds them
            result["skip_pending"] = left
        at = rfc3339(time.time())
        entry = {
            "at": at,
            "by": who,
            "action": action,
            "from": peer,
            "via": via,
            "instance": self.config.instance_id,
            "detail": detail,
        }
        await record_action(bucket.kv, job, entry)
        log.info("fleet page: %s %s by %s from %s: %s", action, job, who, peer, detail)
        result["at"] = at
        return 200, result

    def _login(self, req: Request, form: dict[str, str]) -> Answer:
        if not self._same_origin(req):
            return _json(403, {"error": "cross-site sign-in refused"})
        name = self.tokens.who(form.get("token", ""))
        if name is None:
            body = page.message("Sign-in refused", "That token is not in admin.token_file.")
            return _html(401, page.layout("Sign-in refused", body, None, None, True))
        raw = base64.urlsafe_b64encode(name.encode()).decode()
        expires = str(int(time.time()) + SESSION_TTL)
        value = f"{raw}|{expires}|{self._sign(f'{raw}|{expires}')}"
        cookie = f"{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={SESSION_TTL}"
        log.info("fleet page: %s signed in from %s", name, req.peer)
        return Answer(
            303,
            "text/plain; charset=utf-8",
            b"",
            (*SECURITY, ("Set-Cookie", cookie), ("Location", "/")),
        )

    def _logout(self) -> Answer:
        cookie = f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
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
        limit = max(1, min(RUNS_MAX, int(q.get("limit", [RUNS_LIMIT])[0])))
    except ValueError:
        limit = RUNS_LIMIT
    try:
        before = int(q["before"][0]) if "before" in q else None
    except ValueError:
        before = None
    return limit, before


def _run_object(run: dict[str, Any], seq: int) -> dict[str, Any]:
    """A history run with its fence (the claim's sequence) and lateness."""
    late = None
    try:
        if run.get("started_at") and run.get("scheduled_at"):
            late = round(
                (parse_rfc3339(run["started_at"]) - parse_rfc3339(run["scheduled_at"])) * 1000
            )
    except (ValueError, OverflowError, OSError):  # hostile times: no lateness shown
        late = None
    return {**run, "fence": seq, "late_ms": late}
