"""The ``jobs:`` entries: one YAML map -> :class:`JobConfig`, and the rules between keys.

``parse_job`` reads a job's keys (its schedule with ``spread`` and
``exclude``, its request with the target's defaults applied, retries, pings
and expectations); the rules that need other jobs or the whole config are
``sidecar/config/job_rules.py``'s. Errors name the key's path
(``jobs[1].jitter``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote
from zoneinfo import ZoneInfo

from sidecar.config import calendars as shared
from sidecar.config import params
from sidecar.config.alerting import PingConfig, parse_expect, parse_pause_after, parse_ping
from sidecar.config.answer import parse_answer
from sidecar.config.fields import (
    CONTROL_RE,
    Section,
    format_duration,
    headers,
    key_text,
    short,
    string,
    target_url,
    zone,
)
from sidecar.config.keys import JOB_NAME, ConfigSection, one_of
from sidecar.config.model import (
    MAX_CANDIDATES,
    AfterConfig,
    CancelConfig,
    ClaimConfig,
    ConcurrencyConfig,
    JobConfig,
    RequestConfig,
    RetryConfig,
    TargetConfig,
)
from sidecar.core.clock import INSTANT_RANGE, epoch_of, in_range
from sidecar.core.errors import ConfigError, ScheduleError
from sidecar.when.schedule import parse_schedule
from sidecar.when.slots import Calendar, parse_calendar, parse_exclusion

if TYPE_CHECKING:  # loaded by the first ``calendars:`` entry (sidecar/config/calendars.py)
    from sidecar.when.shared import Resolved, SharedCalendar

CATCHUP = ("none", "latest", "all")
OVERLAP = ("allow", "skip", "replace", "buffer_one")
# The overlap policies that hold ``lock.<job>`` for every run (sidecar/run/overlap.py).
LOCKED = ("skip", "replace", "buffer_one")
# Those of them whose runs sidecar/run/overlap.py takes part in (its Overlap is
# made, its code imported, for the first job with one of them).
WAITING = ("replace", "buffer_one")
ON_LOST = ("record", "rerun")
MAX_RETRIES = 10
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# The keys of one entry of ``jobs:``.
JOB_KEYS = (
    "name",
    "schedule",
    "timezone",
    "jitter",
    "max_late",
    "history_size",
    "request",
    "catchup",
    "overlap",
    "on_lost",
    "retry",
    "spread",
    "exclude",
    "ping",
    "pause_after",
    "expect",
    "claim",
    "start_at",
    "end_at",
    "max_runs",
    "cancel",
    "concurrency",
    "run_on",
    "answer",
    "after",
)
# jobs[].run_on: once per slot for the fleet (one), or on every live instance.
RUN_ON = ("one", "every")
# jobs[].after.on: which endings of the other job's run are followed.
AFTER_ON = ("success", "failure", "always")
_AFTER_KEYS = ("job", "on")
# The keys a job with ``after`` may not have: its runs follow another job's, not
# a calendar, and are not retried (sidecar/run/chains.py).
_NOT_WITH_AFTER = ("schedule", "spread", "exclude", "start_at", "end_at", "catchup", "max_runs")
# The schedule of a job with ``after``: a calendar whose end_at (the epoch) is
# before every slot, so that its job loop claims nothing and status shows no
# next run.
NO_SLOTS = ("0 0 1 1 *", 0)
# max_runs: at most this many runs (any more would not be a cap).
MAX_RUNS = 2**31 - 1
_REQUEST_KEYS = ("method", "path", "query", "headers", "body", "timeout", "url")
_CANCEL_KEYS = ("method", "path", "grace")
_CONCURRENCY_KEYS = ("key", "limit")
# concurrency.limit: each slot is a key of the state bucket, tried in turn by a waiting run.
MAX_CONCURRENCY = 100
# concurrency.key: a token of the slot keys' names (conc.<key>.<n>).
_CONC_KEY_LENGTH = 64
# jobs[].cancel.grace when unset: how long a cancelled run may take to answer.
CANCEL_GRACE = 5.0


def _merge_headers(base: Mapping[str, str], extra: Mapping[str, str]) -> Mapping[str, str]:
    """``base`` overridden by ``extra``, header names compared case-insensitively."""
    if not extra and isinstance(base, MappingProxyType):
        return base  # the target's own: one mapping for every job that adds none
    lowered = {name.lower() for name in extra}
    merged = {name: text for name, text in base.items() if name.lower() not in lowered}
    return _shared_headers({**merged, **extra})


# Equal merged headers shared by the jobs that have them (issue 49); bounded.
_HEADERS: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}


def _shared_headers(headers: dict[str, str]) -> Mapping[str, str]:
    """A read-only `headers`, or an equal one made before (order kept: it is sent)."""
    key = tuple(headers.items())
    kept = _HEADERS.get(key)
    if kept is None:
        kept = MappingProxyType(headers)
        _keep(_HEADERS, key, kept)
    return kept


def parse_job(
    sec: ConfigSection,
    target: TargetConfig,
    defaults: ConfigSection,
    claim: ClaimConfig,
    calendars: Mapping[str, SharedCalendar] = MappingProxyType({}),
) -> JobConfig:
    """A job; `claim`: ``defaults.claim``, parsed once for every job; `calendars`:
    the config's ``calendars:``, which ``exclude: [calendar:<name>]`` names."""
    name = sec.get("name", None, string)
    if name is None:
        raise ConfigError(sec.key("name"), "required: letters, digits, _ and - only")
    if not JOB_NAME.fullmatch(name):
        raise ConfigError(
            sec.key("name"),
            f"{short(name)} is not a job name: letters, digits, _ and - only "
            "(it is a token of the NATS subjects)",
        )
    timezone = sec.get("timezone", ZoneInfo("UTC"), zone)
    after = _parse_after(sec, name)
    if after is None:
        schedule = _parse_calendar(sec, name, timezone, calendars)
    else:
        schedule = parse_calendar([NO_SLOTS[0]], timezone, name, end_ms=NO_SLOTS[1])
    req = ConfigSection(sec.data.get("request"), sec.key("request"), _REQUEST_KEYS)
    method = _method(req.text("method", "POST"))
    if method not in _METHODS:
        raise ConfigError(req.key("method"), f"expected one of {', '.join(_METHODS)}")
    path = _request_path(req, f"/jobs/{name}")
    path = _with_query(req, path)
    own_headers = req.get("headers", {}, headers)
    merged = _merge_headers(target.headers, own_headers)
    body = req.text("body", "")
    request = RequestConfig(
        method=method,
        path=path,
        headers=merged,
        body=body,
        timeout=req.duration("timeout", target.timeout, minimum_ms=1),
        url=req.get("url", target.url, lambda v, k: target_url(v, k, target.allow_remote)),
        params=_check_params(req, path, merged, own_headers, body),
    )
    retry = _parse_retry(ConfigSection(sec.data.get("retry"), sec.key("retry"), ("max", "backoff")))
    on_lost = sec.get("on_lost", "record", one_of(ON_LOST))
    if on_lost == "rerun" and retry.max < 1:
        raise ConfigError(
            sec.key("on_lost"),
            "rerun needs retry.max of at least 1 (the rerun is the next attempt)",
        )
    if after is not None and (retry.max or on_lost == "rerun"):
        raise ConfigError(
            sec.key("retry" if retry.max else "on_lost"),
            "a job with after is not retried (each run follows one run of "
            f"{after.job}; as one-off runs): remove it",
        )
    overlap = sec.get("overlap", "allow", one_of(OVERLAP))
    cancel = _parse_cancel(sec, request, overlap)
    run_on = sec.get("run_on", "one", one_of(RUN_ON))
    max_runs = sec.integer("max_runs", None, 1, MAX_RUNS)
    if run_on == "every":
        _check_every(sec, overlap, retry.max, on_lost, max_runs)
    return JobConfig(
        name=name,
        schedule=interned(schedule, _CALENDARS),
        timezone=timezone,
        jitter=sec.duration("jitter", 2.0),
        max_late=sec.duration("max_late", 60.0),
        history_size=sec.integer("history_size", None, 1, 2**63 - 1),
        request=request,
        catchup=sec.get("catchup", "none", one_of(CATCHUP)),
        overlap=overlap,
        cancel=interned(cancel),
        on_lost=on_lost,
        retry=interned(retry),
        ping=_job_ping(sec, defaults, name),
        pause_after=parse_pause_after(sec),
        expect=parse_expect(sec.data["expect"], sec.key("expect")) if sec.has("expect") else None,
        claim=interned(parse_claim(sec, claim)),
        max_runs=max_runs,
        concurrency=_parse_concurrency(sec),
        run_on=run_on,
        answer=interned(parse_answer(sec)),
        after=after,
    )


_T = TypeVar("_T")
# Equal small settings (retry, cancel, claim, answer) shared by every job that has
# them: 100,000 jobs of a few kinds hold a few objects, not 100,000 (issue 49).
_SHARED: dict[object, object] = {}
_SHARED_MAX = 4096


# The calendars apart: thousands of distinct schedules (a minute per tenant) must not
# fill the small settings' table.
_CALENDARS: dict[object, object] = {}


def interned(value: _T, table: dict[object, object] = _SHARED) -> _T:
    """`value`, or an equal one made before (frozen, so sharing changes nothing)."""
    try:
        kept = table.get(value)
    except TypeError:  # not hashable
        return value
    if kept is not None:
        return kept  # type: ignore[return-value]
    _keep(table, value, value)
    return value


def _keep(table: dict[Any, Any], key: object, value: object) -> None:
    """Keep `value` under `key`; a full table first forgets its oldest entry.

    Not "stop keeping once full": a sidecar whose jobs changed over weeks would
    then share nothing new, and what a job shares would depend on what came
    before it. A job keeps the object it was given either way.
    """
    if len(table) >= _SHARED_MAX:
        del table[next(iter(table))]
    table[key] = value


def _parse_concurrency(sec: ConfigSection) -> ConcurrencyConfig | None:
    """``jobs[].concurrency: {key, limit}``: a limit shared by every job with the key."""
    if not sec.has("concurrency"):
        return None
    conc = ConfigSection(sec.data["concurrency"], sec.key("concurrency"), _CONCURRENCY_KEYS)
    key = conc.text("key", None)
    if key is None:
        raise ConfigError(conc.key("key"), "required: the name the jobs sharing the limit give")
    if not JOB_NAME.fullmatch(key) or len(key) > _CONC_KEY_LENGTH:
        raise ConfigError(
            conc.key("key"),
            f"{short(key)} is not a concurrency key: letters, digits, _ and - only, at most "
            f"{_CONC_KEY_LENGTH} (it names the state bucket's keys conc.<key>.<n>)",
        )
    limit = conc.integer("limit", None, 1, MAX_CONCURRENCY)
    if limit is None:
        raise ConfigError(conc.key("limit"), "required: how many runs with this key at once")
    return ConcurrencyConfig(key, limit)


def _check_every(
    sec: ConfigSection, overlap: str, retries: int, on_lost: str, max_runs: int | None
) -> None:
    """``run_on: every`` refuses what it cannot make exact per instance: each of these
    keys is a fleet-wide lock, count or lease, or a further claim of the slot
    (docs/CONFIG.md, docs/GUARANTEES.md)."""
    why = "does not go with run_on: every (each instance runs each slot once, on its own)"
    if overlap != "allow":
        raise ConfigError(sec.key("overlap"), f"{overlap} {why}: leave it allow")
    if retries > 0:
        raise ConfigError(f"{sec.key('retry')}.max", f"{retries} {why}: leave it 0")
    if on_lost != "record":
        raise ConfigError(sec.key("on_lost"), f"{on_lost} {why}: leave it record")
    if max_runs is not None:
        raise ConfigError(sec.key("max_runs"), f"a fleet-wide count {why}")
    own = sec.data.get("claim")
    if isinstance(own, dict) and own.get("candidates") is not None:
        raise ConfigError(f"{sec.key('claim')}.candidates", f"every instance claims: it {why}")


def _parse_after(sec: ConfigSection, name: str) -> AfterConfig | None:
    """``jobs[].after``: ``{job: A, on: success|failure|always}``; None when absent.
    Whether A exists and the chain has no cycle is ``check_chains``'s (the whole
    config)."""
    if sec.data.get("after") is None:
        return None
    raw = sec.data["after"]
    if isinstance(raw, dict) and True in raw and "on" not in raw:
        # YAML 1.1 reads a bare ``on:`` key as the boolean true.
        raw = {("on" if k is True else k): v for k, v in raw.items()}
    aft = ConfigSection(raw, sec.key("after"), _AFTER_KEYS)
    other = aft.get("job", None, string)
    if other is None:
        raise ConfigError(aft.key("job"), "required: the name of the job this one runs after")
    if other == name:
        raise ConfigError(
            aft.key("job"), f"{short(other)} is this job: a job cannot run after itself"
        )
    for key in _NOT_WITH_AFTER:
        if sec.has(key):
            raise ConfigError(
                sec.key(key),
                f"not with after: this job runs after each run of {short(other)}, "
                "not on a calendar of its own (remove one of them)",
            )
    return AfterConfig(job=other, on=aft.get("on", "success", one_of(AFTER_ON)))


def _with_query(req: ConfigSection, path: str) -> str:
    """`path` with ``request.query`` appended: names and values plain text, which
    are percent-encoded here (run parameters in a value stay, rendered per run)."""
    raw = req.data.get("query")
    if raw is None:
        return path
    if not isinstance(raw, dict):
        raise ConfigError(req.key("query"), "expected a map of query names to values")
    pairs = []
    for name, value in raw.items():
        key = f"{req.key('query')}.{key_text(name)}"
        if not isinstance(name, str) or not name or CONTROL_RE.search(name):
            raise ConfigError(key, "not a query name: a non-empty string")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ConfigError(key, "expected a string (or a number)")
        text = str(value)
        if CONTROL_RE.search(text):
            raise ConfigError(key, "must not contain control characters")
        encoded = params.query_text(text, params.parse(text, params.QUERY, key))
        pairs.append(f"{quote(name, safe='')}={encoded}")
    if not pairs:
        return path
    return path + ("&" if "?" in path else "?") + "&".join(pairs)


def _check_params(
    req: ConfigSection,
    path: str,
    merged: Mapping[str, str],
    own_headers: Mapping[str, str],
    body: str,
) -> bool:
    """Whether the request has run parameters; ConfigError naming the key of an
    unknown or malformed one (a header of ``target.headers`` by its own key)."""
    found = params.parse(path, params.PATH, req.key("path")) is not None
    for name, text in merged.items():
        key = (
            f"{req.key('headers')}.{key_text(name)}"
            if name in own_headers
            else f"target.headers.{key_text(name)}"
        )
        found = params.parse(text, params.HEADER, key) is not None or found
    return params.parse(body, params.BODY, req.key("body")) is not None or found


def _parse_calendar(
    sec: ConfigSection, name: str, timezone: ZoneInfo, calendars: Mapping[str, SharedCalendar]
) -> Calendar:
    """``schedule`` (one expression or a list), ``spread`` and ``exclude`` of a job
    (its dates and intervals, and the shared calendars it names)."""
    raw = sec.data.get("schedule")
    if raw is None:
        raise ConfigError(sec.key("schedule"), "required, e.g. '*/5 * * * *'")
    if isinstance(raw, list):
        if not raw:
            raise ConfigError(sec.key("schedule"), "expected one expression or a list of them")
        exprs = [string(v, f"{sec.key('schedule')}[{i}]") for i, v in enumerate(raw)]
        keys = [f"{sec.key('schedule')}[{i}]" for i in range(len(raw))]
    else:
        exprs = [string(raw, sec.key("schedule"))]
        keys = [sec.key("schedule")]
    for expr, key in zip(exprs, keys, strict=True):
        try:
            parse_schedule(expr, timezone)
        except ScheduleError as exc:
            raise ConfigError(key, " ".join(str(exc).split())) from exc
    spread = sec.duration("spread", 0.0)
    if 0 < spread < 1:
        raise ConfigError(sec.key("spread"), "0, or at least 1s (offsets are whole seconds)")
    excludes = sec.data.get("exclude") or []
    if not isinstance(excludes, list):
        raise ConfigError(
            sec.key("exclude"),
            "expected a list of dates, ISO 8601 intervals and calendar:<name> entries",
        )
    plain: list[str] = []
    used: list[Resolved] = []
    for i, text in enumerate(excludes):
        key = f"{sec.key('exclude')}[{i}]"
        if shared.is_reference(string(text, key)):
            found = shared.resolve(text, key, calendars, timezone)
            if found.name not in {u.name for u in used}:
                used.append(found)
            continue
        try:
            parse_exclusion(text, timezone)
        except ValueError as exc:
            raise ConfigError(key, str(exc)) from exc
        plain.append(str(text))
    start_ms = _instant_ms(sec, "start_at", timezone)
    end_ms = _instant_ms(sec, "end_at", timezone)
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise ConfigError(sec.key("end_at"), "must not be before start_at")
    calendar = parse_calendar(exprs, timezone, name, spread, plain, start_ms, end_ms, tuple(used))
    if start_ms is not None:
        try:
            calendar.next_slot(start_ms - 1)
        except ScheduleError:  # start_at past the schedule's last slot the sidecar can name
            raise ConfigError(
                sec.key("start_at"), "the schedule has no slot from start_at before 10000-01-01"
            ) from None
    if spread and spread * 1000 >= (interval := calendar.min_interval_ms()):
        # A slot moved past the next one's time would blur which slot is which.
        raise ConfigError(
            sec.key("spread"),
            f"spread ({format_duration(spread)}) must be shorter than the schedule's "
            f"shortest interval ({format_duration(interval / 1000)})",
        )
    return calendar


def _instant_ms(sec: ConfigSection, name: str, timezone: ZoneInfo) -> int | None:
    """``start_at``/``end_at``: an ISO 8601 instant (without an offset: a wall time in
    the job's timezone; a date alone: its midnight there), whole seconds, epoch ms."""
    value = sec.data.get(name)
    if value is None:
        return None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                sec.key(name),
                f"{short(sec.data[name])} is not an ISO 8601 date and time "
                "(2026-01-01T09:00:00Z, or without an offset a wall time in the job's timezone)",
            ) from None
    if not isinstance(value, datetime):
        raise ConfigError(
            sec.key(name), "expected an ISO 8601 date and time, e.g. 2026-01-01T09:00:00Z"
        )
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone)
    # By subtraction: astimezone(UTC) overflows at both ends of the range.
    at = epoch_of(value)
    if not in_range(at):
        raise ConfigError(sec.key(name), f"out of range: the sidecar names {INSTANT_RANGE}")
    ms = round(at * 1000)
    if ms % 1000:
        raise ConfigError(sec.key(name), "whole seconds only (slots are whole seconds)")
    return ms


def _job_ping(sec: ConfigSection, defaults: ConfigSection, name: str) -> PingConfig | None:
    """The job's own ``ping``, else ``defaults.ping`` with ``{job}`` filled in."""
    if sec.has("ping"):
        return parse_ping(sec.data["ping"], sec.key("ping"), name)
    if defaults.has("ping"):
        return parse_ping(defaults.data["ping"], "defaults.ping", name)
    return None


def _parse_cancel(sec: ConfigSection, request: RequestConfig, overlap: str) -> CancelConfig:
    """``jobs[].cancel``: the request that asks the app to stop a run (``overlap: replace``)."""
    if sec.has("cancel") and overlap != "replace":
        raise ConfigError(sec.key("cancel"), "only used with overlap: replace")
    can = ConfigSection(sec.data.get("cancel"), sec.key("cancel"), _CANCEL_KEYS)
    method = _method(can.text("method", "DELETE"))
    if method not in _METHODS:
        raise ConfigError(can.key("method"), f"expected one of {', '.join(_METHODS)}")
    path = _request_path(can, request.path)
    # Rendered with the run's values as the trigger's path is (docs/TRIGGER.md).
    cancel_params = params.parse(path, params.PATH, can.key("path")) is not None
    if method == request.method and path == request.path:
        raise ConfigError(
            can.key("method"),
            f"{method} {path} is the trigger itself: give the cancel request another "
            "method or path",
        )
    grace = can.duration("grace", CANCEL_GRACE, minimum_ms=100)
    max_late = sec.duration("max_late", 60.0)
    if overlap == "replace" and grace >= max_late:
        raise ConfigError(
            can.key("grace"),
            f"{format_duration(grace)} must be shorter than max_late "
            f"({format_duration(max_late)}): the new slot waits at most max_late for the "
            "replaced run to end",
        )
    if overlap != "replace" and path == request.path:
        # Never sent (only ``replace`` cancels): "" for the request's own path, as
        # sidecar/run/overlap.py reads it, so that the jobs of equal settings share
        # one CancelConfig (``interned``, issue 49) instead of one per path.
        path = ""
    return CancelConfig(method=method, path=path, grace=grace, params=cancel_params)


def _method(text: str) -> str:
    """A request's method in capitals: one of ``_METHODS``'s own strings when it is
    one (not a new string per job), else as written for the caller's error."""
    upper = text.upper()
    for known in _METHODS:
        if upper == known:
            return known
    return upper


def _request_path(sec: ConfigSection, default: str) -> str:
    """``path`` of a request (or of its cancel): a request target as written."""
    path = sec.text("path", default)
    if not path.startswith("/") or CONTROL_RE.search(path) or " " in path:
        raise ConfigError(
            sec.key("path"), "must start with / and contain no spaces or control chars"
        )
    # Sent and signed (v2) exactly as written: only what HTTP allows in a
    # request target as is, so nothing on the way re-encodes it.
    if not path.isascii() or "#" in path:
        raise ConfigError(
            sec.key("path"),
            "ASCII only and no '#': percent-encode other characters (e.g. %C3%A4 for ä)",
        )
    return path


def _parse_retry(sec: ConfigSection) -> RetryConfig:
    return RetryConfig(
        max=sec.integer("max", 0, 0, MAX_RETRIES),
        backoff=sec.duration("backoff", 30.0, minimum_ms=1000),
    )


CLAIM_KEYS = ("candidates", "fallback")


def parse_claim(sec: Section, base: ClaimConfig = ClaimConfig()) -> ClaimConfig:
    """``claim`` of the section ``sec`` (a job, or ``defaults``): its keys over ``base``'s."""
    if sec.data.get("claim") is None:
        return base  # most jobs: the defaults' as they are
    own = Section(sec.data["claim"], sec.key("claim"), CLAIM_KEYS)
    return ClaimConfig(
        own.integer("candidates", base.candidates, 0, MAX_CANDIDATES),
        own.duration("fallback", base.fallback, minimum_ms=100),
    )
