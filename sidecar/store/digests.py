"""What a presence says of the jobs an instance runs, and how two are compared.

Each instance's presence (``instance.<id>``) carries a short hash of each file
job's settings (``job_hash``), one entry for its whole set of jobs of the state
bucket (``BUCKET_SET``: a count and ``set_hash``, so that the presence does not
grow with them) and the kind of hash (``HASH_KIND``). ``mismatched_jobs`` and
``mismatched_calendars`` find the live instances that run a job, or hold a shared
calendar, with different settings: status's "settings differ" and
``anarchon_fleet_config_mismatch`` (docs/METRICS.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from sidecar.core.slices import Budget, chunks, sort

if TYPE_CHECKING:
    from sidecar.config.model import JobConfig


def job_hash(job: JobConfig) -> str:
    """A short hash of the settings that decide when and how a job runs.

    Not the app's address (``target.url``, ``request.url``: host and port or
    socket only): each replica calls its own app wherever it listens, and two
    replicas that differed only in the app's port were flagged "settings
    differ". Nor the instance's own ports (metrics): they are not hashed.
    """
    req = job.request
    parts = [
        job.schedule.identity,  # the expression alone for a plain job
        job.timezone.key,
        repr(job.jitter),
        repr(job.max_late),
        req.method,
        req.path,
        getattr(job, "catchup", "none"),
    ]
    # Leases and attempts (docs/CONFIG.md: retry, on_lost), only when not the defaults: a job left
    # at the defaults hashes as it did before they existed.
    extra = (job.overlap, job.on_lost, repr(job.retry.max), repr(job.retry.backoff))
    if extra != ("allow", "record", "0", "30.0"):
        parts.extend(extra)
    # pause_after and expect decide what the fleet does after a run: only when set.
    if getattr(job, "pause_after", None) is not None:
        parts.append(f"pause_after={job.pause_after}")
    if getattr(job, "expect", None) is not None:
        parts.append(f"expect={job.expect}")
    if getattr(job, "max_runs", None) is not None:
        parts.append(f"max_runs={job.max_runs}")
    if (conc := getattr(job, "concurrency", None)) is not None:
        parts.append(f"concurrency={conc.key}/{conc.limit}")
    if getattr(job, "run_on", "one") != "one":
        parts.append(f"run_on={job.run_on}")
    # after (a chain): which job's runs it follows, and on which endings.
    if getattr(job, "after", None) is not None:
        parts.append(f"after={job.after}")
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:12]


# The kind of job hashes an instance publishes (its presence's ``digest``).
# 0.1.0 published none and hashed the app's address too; hashes are compared
# only with hashes of the same kind, so that a rolling update from 0.1.0 does
# not show every job as "settings differ" (tests/test_upgrade.py).
HASH_KIND = 2


# A presence's jobs of the state bucket (``job.<name>``): one entry for the whole set,
# ``{"count": n, "hash": h}`` (h: ``config_hash`` of their names and job hashes), so
# that the presence does not grow with them (3,000 of them made it 504 KB, half of
# NATS's default payload limit). The file's jobs stay one hash each under ``jobs``;
# a job listed there is read as run by that instance either way.
BUCKET_SET = "bucket_jobs"
# The name ``mismatched_jobs`` gives to the bucket's jobs when two instances run
# different sets of them (not a job name: a job's name has no ``.`` nor ``*``).
BUCKET_MISMATCH = "job.*"
BUCKET_PREFIX = "job."


def config_hash(jobs: object, bucket: object = None) -> str:
    """A short hash of an instance's job settings (names and per-job hashes, and the
    hash of its set of jobs of the state bucket when it has one)."""
    data = dict(jobs) if isinstance(jobs, dict) else {}
    if isinstance(bucket, dict):
        data[BUCKET_MISMATCH] = bucket.get("hash")
    text = json.dumps(data, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


V = TypeVar("V")


async def set_hash(items: Mapping[str, V], budget: Budget, hash_of: Callable[[V], str]) -> str:
    """``config_hash({name: hash_of(item) ...})`` of `items`, the same text hashed,
    made a slice at a time: the names sorted in slices (sidecar/core/slices.py), the
    JSON written and hashed a chunk of them at a time, no copy of the mapping. The
    presence's hash of 100,000 jobs of the state bucket held the loop for 150 ms in
    one piece (docs/PERFORMANCE.md, "One scrape at 100,000 jobs"). Other instances,
    of any version, compare the result with theirs, so the text is
    ``json.dumps(sort_keys=True)``'s to the byte (tests/store/test_set_hash.py).
    `items` must not change while this runs."""
    digest = hashlib.sha256(b"{")
    first = True
    for names in chunks(await sort(items, budget)):
        # A dict keeps the order it is given: the sorted chunk, without its braces.
        text = json.dumps({name: hash_of(items[name]) for name in names})[1:-1]
        digest.update(text.encode() if first else b", " + text.encode())
        first = False
        await budget.pause()
    digest.update(b"}")
    return digest.hexdigest()[:12]


def bucket_set(value: dict[str, Any]) -> dict[str, Any] | None:
    """A presence's entry for its jobs of the state bucket; None when it has none."""
    entry = value.get(BUCKET_SET)
    return entry if isinstance(entry, dict) and entry.get("count") else None


def runs_job(value: dict[str, Any], job: str, bucket_job: bool) -> bool:
    """Whether the instance of presence `value` runs `job` (`bucket_job`: a ``job.``
    key of that name is in the bucket)."""
    jobs = value.get("jobs")
    if isinstance(jobs, dict) and job in jobs:
        return True
    return bucket_job and bucket_set(value) is not None


def mismatched_jobs(instances: dict[str, dict[str, Any]]) -> set[str]:
    """Jobs that two live instances (of the same kind of hash) run with different
    settings; ``job.*`` when two run different sets of jobs of the state bucket."""
    seen: dict[tuple[str, str], set[str]] = {}
    # One ``jobs`` mapping per distinct setting (shared by the View's instances).
    distinct = {(id(v.get("jobs")), str(v.get("digest", 1))): v for v in instances.values()}
    for (_, kind), value in distinct.items():
        jobs = value.get("jobs")
        if not isinstance(jobs, dict):
            continue
        for name, digest in jobs.items():
            seen.setdefault((kind, str(name)), set()).add(str(digest))
    for value in instances.values():
        entry = bucket_set(value)
        if entry is not None:
            kind = str(value.get("digest", 1))
            seen.setdefault((kind, BUCKET_MISMATCH), set()).add(str(entry.get("hash")))
    return {name for (_, name), digests in seen.items() if len(digests) > 1}


def mismatched_calendars(instances: dict[str, dict[str, Any]]) -> set[str]:
    """Shared calendars that two live instances hold with different contents.

    Each presence names its ``calendars`` with their content hashes; an instance
    without the name (or without the field: an older version) is not compared.
    Only a name: the jobs that use one already differ (their hash covers it).
    """
    seen: dict[str, set[str]] = {}
    for value in instances.values():
        calendars = value.get("calendars")
        if not isinstance(calendars, dict):
            continue
        for name, digest in calendars.items():
            if isinstance(name, str) and isinstance(digest, str):
                seen.setdefault(name, set()).add(digest)
    return {name for name, digests in seen.items() if len(digests) > 1}
