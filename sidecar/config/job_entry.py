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
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from sidecar.config import calendars as shared
from sidecar.config.alerting import PingConfig, parse_expect, parse_pause_after, parse_ping
from sidecar.config.answer import parse_answer
from sidecar.config.fields import (
    Section,
    format_duration,
    short,
    string,
    zone,
)
from sidecar.config.interning import CALENDARS, interned
from sidecar.config.job_request import parse_cancel, parse_request
from sidecar.config.keys import JOB_NAME, ConfigSection, one_of
from sidecar.config.model import (
    MAX_CANDIDATES,
    AfterConfig,
    ClaimConfig,
    ConcurrencyConfig,
    JobConfig,
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
_CONCURRENCY_KEYS = ("key", "limit")
# concurrency.limit: each slot is a key of the state bucket, tried in turn by a waiting run.
MAX_CONCURRENCY = 100
# concurrency.key: a token of the slot keys' names (conc.<key>.<n>).
_CONC_KEY_LENGTH = 64


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
    request = parse_request(sec, name, target)
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
    cancel = parse_cancel(sec, request, overlap)
    run_on = sec.get("run_on", "one", one_of(RUN_ON))
    max_runs = sec.integer("max_runs", None, 1, MAX_RUNS)
    if run_on == "every":
        _check_every(sec, overlap, retry.max, on_lost, max_runs)
    return JobConfig(
        name=name,
        schedule=interned(schedule, CALENDARS),
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
