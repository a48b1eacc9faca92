"""A ``job.<name>`` key of the state bucket checked: what a job of the bucket may be.

A key ``job.<name>`` holds one job as JSON: the same mapping as an entry of
``jobs:`` plus ``id`` (the caller's external id: adding the same job with the
same id again changes nothing) and ``by``/``at`` (who wrote it, when). It is
parsed by the config's own parser (``parse_job``, ``check_windows``,
``check_fit``) with the file's ``target`` and ``defaults``, and three more
rules, because whoever can write the bucket is not whoever wrote the file
(SECURITY.md): the target is the file's (no ``request.url``), no ``ping``
(its URL would be anywhere), and no header the file's ``target.headers``
sets (the app's credentials stay the file's).

The daemon's take-up (sidecar/admin/bucket_jobs.py), the writes
(sidecar/admin/jobwrite.py) and ``status``/``job list`` judge a key here alike:
``judge``, the cap (``beyond_cap``; the take-up's in slices,
``beyond_cap_in_slices``) and the ``listing`` of every key with its state.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any

from sidecar.config.bucketrules import check_headers, check_name_length, check_value_size
from sidecar.config.fields import short, shown_text, type_name
from sidecar.config.job_entry import (
    JOB_KEYS,
    parse_claim,
    parse_job,
)
from sidecar.config.job_rules import check_fit, check_windows
from sidecar.config.keys import ConfigSection
from sidecar.config.model import Config, JobConfig
from sidecar.core.clock import rfc3339
from sidecar.core.errors import ConfigError
from sidecar.core.slices import RUN, Budget, chunks, sort
from sidecar.store.state import View

PREFIX = "job."
FILE, BUCKET = "file", "bucket"
# Keys of a stored job that are not the job's: the external id, who and when.
META_KEYS = ("id", "by", "at")
MAX_ID = 200
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The size of a definition's digest (``canonical``).
CANON_BYTES = 16


def job_key(name: str) -> str:
    return f"{PREFIX}{name}"


@dataclass(frozen=True, slots=True)
class BucketJob:
    """A valid job of the state bucket: the parsed job, its external id, its definition."""

    job: JobConfig
    id: str
    # The stored mapping without by/at, as canonical JSON: equal means the same job.
    canon: bytes  # canonical(): a digest of the definition
    # What ``listing`` shows of the stored value besides the job (the view lets a
    # running job's bytes go, sidecar/store/state.py ``View.hold``): whether it
    # has an ``id`` (else null is shown), ``by`` (interned) and ``at`` (``kept_at``).
    id_stored: bool = True
    by: object = None
    at: object = None


def kept_by(by: object) -> object:
    """A stored value's ``by`` as a running job keeps it: one string per writer
    (most jobs are written by a few), else as it is."""
    return sys.intern(by) if isinstance(by, str) else by


def kept_at(at: object) -> object:
    """A stored value's ``at`` as a running job keeps it, ``shown_at`` gives it back
    exactly: the epoch ms (an int, not a 24-character string: issue 49) when it is
    the RFC 3339 text ``rfc3339`` writes for them, else a string as it is, else
    any other JSON value in a 1-tuple (an int stored there is not epoch ms)."""
    if at is None:
        return None
    if not isinstance(at, str):
        return (at,)
    try:
        when = datetime.fromisoformat(at)
    except ValueError:
        return at
    if when.tzinfo is None:
        return at
    ms = (when - _EPOCH) // timedelta(milliseconds=1)
    return ms if rfc3339(ms / 1000) == at else at


def shown_at(kept: object) -> object:
    """The stored ``at`` that ``kept_at`` kept as `kept`."""
    if isinstance(kept, int):
        return rfc3339(kept / 1000)
    if isinstance(kept, tuple):
        return kept[0]
    return kept


def definition(value: Mapping[str, Any]) -> dict[str, Any]:
    """The stored mapping without ``by``/``at``: what makes two writes the same job."""
    return {k: v for k, v in value.items() if k not in ("by", "at")}


def canonical(value: Mapping[str, Any]) -> bytes:
    """A digest of the job's definition (its sorted JSON): equal for the same job.
    A digest, not the text: 100,000 jobs keep one each (issue 49)."""
    text = json.dumps(definition(value), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=CANON_BYTES).digest()


def external_id(value: object, key: str) -> str:
    """A job's id: 1 to MAX_ID characters, shown as they are (no control or bidi ones)."""
    if not isinstance(value, str) or not value or len(value) > MAX_ID:
        raise ConfigError(key, f"expected an id of 1 to {MAX_ID} characters, got {short(value)}")
    return shown_text(value, key, MAX_ID)


def parse_bucket_job(config: Config, value: object, path: str) -> BucketJob:
    """A job of the state bucket (or of `job add`'s file), checked as the config's jobs
    are, plus the bucket's own rules; ConfigError naming the key's path."""
    if not isinstance(value, dict):
        raise ConfigError(path, f"expected a map (a job as in jobs:), got {type_name(value)}")
    limits = config.bucket_jobs
    # First the size, so that a huge value costs no parsing.
    check_value_size(limits, value, path)
    data = {k: v for k, v in value.items() if k not in META_KEYS}
    sec = ConfigSection(data, path, JOB_KEYS)
    if sec.has("ping"):
        raise ConfigError(
            sec.key("ping"),
            "a job of the state bucket cannot set ping (its URL could be anywhere); "
            "defaults.ping of the config file applies",
        )
    if sec.has("after"):
        raise ConfigError(
            sec.key("after"),
            "a job of the state bucket cannot run after another job (chains are "
            "checked for cycles across the config file's jobs): give it a schedule",
        )
    request = data.get("request")
    if isinstance(request, dict):
        if request.get("url") is not None:
            raise ConfigError(
                f"{path}.request.url",
                "a job of the state bucket calls the config file's target: "
                "choose method, path, headers and body only",
            )
        extra = request.get("headers")
        if isinstance(extra, dict):
            check_headers(extra, f"{path}.request.headers")
            fixed = {name.lower() for name in config.target.headers}
            for name in extra:
                if isinstance(name, str) and name.lower() in fixed:
                    raise ConfigError(
                        f"{path}.request.headers.{name}",
                        "set by target.headers in the config file; a job of the state "
                        "bucket cannot replace it",
                    )
    defaults = ConfigSection(dict(config.defaults), "defaults", ("ping", "claim"))
    job = parse_job(sec, config.target, defaults, parse_claim(defaults), config.calendars)
    check_name_length(limits, job.name, path)
    size = config.effective_history_size
    if job.history_size is not None and job.history_size > size:
        raise ConfigError(
            sec.key("history_size"),
            f"at most the stream's history size {size} (set by the config file)",
        )
    check_windows(config, job, path, size)
    check_fit(job, config.nats.ack_timeout, path)
    ident = external_id(value.get("id", job.name), f"{path}.id")
    return BucketJob(
        job,
        ident,
        canonical({**data, "id": ident}),
        "id" in value,
        kept_by(value.get("by")),
        kept_at(value.get("at")),
    )


def judge(config: Config, key: str, value: object) -> BucketJob:
    """The job of the key ``job.<name>`` holding `value`; ConfigError when it is none."""
    bucket_job = parse_bucket_job(config, value, key)
    name = key[len(PREFIX) :]
    if bucket_job.job.name != name:
        raise ConfigError(f"{key}.name", f"must be the key's name {name!r}")
    return bucket_job


def beyond_cap(view: View, cap: int) -> set[str]:
    """The names of the ``job.`` keys beyond `cap` (``bucket_jobs.max_jobs``): the
    latest written, by revision, which every sidecar's view holds alike."""
    keys = view.keys
    names = [k for k in keys if k.startswith(PREFIX)]
    if len(names) <= cap:
        return set()
    names.sort(key=lambda k: keys[k].revision)
    return {k[len(PREFIX) :] for k in names[cap:]}


async def beyond_cap_in_slices(view: View, cap: int, budget: Budget) -> set[str]:
    """``beyond_cap(view, cap)`` a slice at a time (sidecar/core/slices.py): the
    take-up's round looks at every key, and with 100,000 jobs the scan and the sort
    by revision held the loop in one piece (docs/PERFORMANCE.md, "One scrape at
    100,000 jobs"). A key written or removed meanwhile may be counted where it no
    longer is: the take-up scans again (sidecar/admin/bucket_jobs.py ``_place``), and
    a key the scan did not see waits for the next round."""
    if len(view.keys) <= cap:  # fewer keys of any kind than the cap: nothing to read
        return set()
    found: list[tuple[int, str]] = []
    for part in chunks(list(view.keys), RUN):
        keys = view.keys  # a re-read replaces the mapping (sidecar/store/watch.py)
        for key in part:
            if key.startswith(PREFIX) and (entry := keys.get(key)) is not None:
                found.append((entry.revision, key))
        await budget.pause()
    if len(found) <= cap:
        return set()
    # By revision alone, stable: ties (none in a real bucket) in the view's order, as above.
    ordered = await sort(found, budget, key=itemgetter(0))
    beyond: set[str] = set()
    for latest in chunks(ordered[cap:], RUN):
        beyond.update(key[len(PREFIX) :] for _, key in latest)
        await budget.pause()
    return beyond


def listing(
    config: Config,
    view: View,
    file_names: frozenset[str] | None = None,
    held: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every ``job.<name>`` key of `view`: name, id, state (``run``, ``shadowed`` by the
    file, ``invalid``, beyond the cap included) and why, as ``status`` and ``job list``
    show them. `held`: the ``id``, ``by`` and ``at`` of the keys whose bytes the view
    let go (``View.hold``: their jobs run, judged at that revision), by key, as
    their running entries keep them (sidecar/admin/bucket_jobs.py)."""
    out = []
    beyond = beyond_cap(view, config.bucket_jobs.max_jobs)
    for key in sorted(k for k in view.keys if k.startswith(PREFIX)):
        name = key[len(PREFIX) :]
        entry = view.keys[key]
        value = (held or {}).get(key, {}) if entry.held else entry.value
        item: dict[str, Any] = {
            "name": name,
            "id": value.get("id"),
            "by": value.get("by"),
            "at": value.get("at"),
            "state": "run",
            "problem": None,
        }
        if name in (config.job_names if file_names is None else file_names):
            item["state"] = "shadowed"
            item["problem"] = "the config file has a job of this name; the file's job runs"
        elif name in beyond:
            item["state"] = "invalid"
            item["problem"] = (
                f"beyond bucket_jobs.max_jobs ({config.bucket_jobs.max_jobs}): written "
                "after the most jobs the config file allows"
            )
        elif not entry.held:  # a held key's job runs: judged at this revision
            try:
                judge(config, key, value)
            except ConfigError as exc:
                item["state"] = "invalid"
                item["problem"] = str(exc)
        out.append(item)
    return out


def with_bucket_jobs(config: Config, view: View) -> Config:
    """`config` with the valid, unshadowed jobs of the bucket after the file's (status)."""
    extra = []
    for item in listing(config, view):
        if item["state"] == "run":
            key = job_key(item["name"])
            extra.append(judge(config, key, view.keys[key].value).job)
    return dataclasses.replace(config, jobs=(*config.jobs, *extra))


def with_sources(
    obj: dict[str, Any], file_names: tuple[str, ...], items: list[dict[str, Any]]
) -> dict[str, Any]:
    """``status``: each job's ``source`` (file or bucket) and ``id``, and every job key
    of the bucket with its state (``bucket_jobs``)."""
    ids = {item["name"]: item["id"] for item in items}
    for job in obj.get("jobs") or []:
        name = job.get("name")
        job["source"] = FILE if name in file_names else BUCKET
        job["id"] = None if name in file_names else ids.get(name)
    obj["bucket_jobs"] = items
    return obj
