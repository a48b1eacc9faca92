"""The one job set of a sidecar (sidecar/config/jobset.py): the file's jobs, then the
state bucket's by name; put and remove are one call each, told to subscribers."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.config.jobset import Change, JobSet
from sidecar.config.load import JobConfig, parse_config
from sidecar.core.errors import ConfigError
from tests.support import job


def jobs_of(*names: str) -> tuple[JobConfig, ...]:
    return parse_config({"jobs": [job(n) for n in names]}, {}).jobs


def test_the_files_jobs_first_then_the_buckets_by_name() -> None:
    file_jobs = jobs_of("zeta", "alpha")
    bucket = jobs_of("t-2", "t-1", "b")
    seen: list[Change] = []
    jobs = JobSet(file_jobs)
    jobs.subscribe(seen.append)
    assert jobs.names == ("zeta", "alpha") and len(jobs) == 2 and jobs.version == 0
    jobs.put(bucket)
    assert jobs.names == ("zeta", "alpha", "b", "t-1", "t-2")
    assert list(jobs) == list(jobs.names) and jobs["t-1"] is bucket[1]
    assert jobs.from_file("alpha") and not jobs.from_file("b") and not jobs.from_file("nope")
    assert seen == [Change(put=bucket)] and jobs.version == 1
    # Changed: the new value in place, the order the same, one change.
    changed = dataclasses.replace(bucket[0], max_late=99.0)
    jobs.put([changed])
    assert jobs["t-2"].max_late == 99.0 and jobs.names[-1] == "t-2"
    assert seen[-1] == Change(put=(changed,))
    jobs.remove(["t-1", "alpha", "nope", "t-1"])  # a file job, an unknown name: left alone
    assert jobs.names == ("zeta", "alpha", "b", "t-2")
    assert seen[-1] == Change(removed=("t-1",)) and jobs.version == 3
    jobs.remove(["nope"])  # nothing removed: no change told
    jobs.put([])
    assert jobs.version == 3 and len(seen) == 3
    assert jobs.get("t-1") is None and "t-1" not in jobs
    with pytest.raises(ConfigError, match="no job named 't-1'"):
        jobs.job("t-1")


def test_a_bucket_job_never_replaces_a_file_job() -> None:
    jobs = JobSet(jobs_of("report"))
    with pytest.raises(ValueError, match="config file's"):
        jobs.put(jobs_of("other", "report"))
    assert jobs.names == ("report",) and jobs.version == 0


def test_a_listener_subscribed_while_a_change_is_told_is_not_told_that_change() -> None:
    """A part made by its first job of a kind (a listener) subscribes itself then: it
    reads the set as it is, and is told only the changes after."""
    jobs = JobSet(())
    told: list[Change] = []

    def make_part(change: Change) -> None:
        if not told and change.put:
            jobs.subscribe(told.append)

    jobs.subscribe(make_part)
    first = jobs_of("a")
    jobs.put(first)
    assert told == []
    jobs.remove(["a"])
    assert told == [Change(removed=("a",))]


def test_the_latest_claim_is_the_largest_jitter_and_lateness_any_job_had() -> None:
    """How long after a slot a claim may come: the fleet's view and the claim window
    keep their marks that long. A removed job's last claims may still come."""
    jobs = JobSet(jobs_of("a"))
    base = jobs.latest_claim
    late = dataclasses.replace(jobs_of("t")[0], max_late=300.0)
    jobs.put([late])
    assert jobs.latest_claim == late.jitter + 300.0 > base
    jobs.remove(["t"])
    assert jobs.latest_claim == late.jitter + 300.0
