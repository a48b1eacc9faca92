"""The rules between a job's keys and the rest of the config: what one job's
entry cannot tell alone (docs/CONFIG.md).

``check_concurrency`` and ``check_chains`` read every job (one limit per
concurrency key; every ``after.job`` names a job, and no chain comes back to
where it began); ``check_windows`` and ``check_fit`` hold a job's timing against
the NATS settings: the duplicate window and the history size that keep a slot
from running twice, and a claim fallback that still ends in time. Errors name
the key's path (``jobs[1].jitter``).
"""

from __future__ import annotations

from sidecar.config.fields import format_duration, short
from sidecar.config.model import Config, JobConfig
from sidecar.core.errors import ConfigError


def check_concurrency(jobs: tuple[JobConfig, ...]) -> None:
    """Every job sharing a concurrency key gives it the same limit: two limits for one
    set of slot keys would let the larger one fill slots the smaller never counts."""
    first: dict[str, tuple[int, int]] = {}
    for index, job in enumerate(jobs):
        if job.concurrency is None:
            continue
        key, limit = job.concurrency.key, job.concurrency.limit
        seen = first.setdefault(key, (index, limit))
        if seen[1] != limit:
            raise ConfigError(
                f"jobs[{index}].concurrency.limit",
                f"concurrency key {key!r} has limit {limit} here but {seen[1]} in "
                f"jobs[{seen[0]}] ({jobs[seen[0]].name}): every job sharing a key gives "
                "the same limit",
            )


def check_chains(jobs: tuple[JobConfig, ...] | list[JobConfig], path: str = "jobs") -> None:
    """Every ``after.job`` names a job of `jobs`, and no chain comes back to where it
    began (A after B after A). ConfigError names the ``after.job`` key."""
    index = {job.name: i for i, job in enumerate(jobs)}
    by_name = {job.name: job for job in jobs}
    for i, job in enumerate(jobs):
        if job.after is None:
            continue
        key = f"{path}[{i}].after.job"
        if job.after.job not in by_name:
            raise ConfigError(key, f"no job named {short(job.after.job)} in jobs")
        seen = [job.name]
        other: JobConfig | None = by_name[job.after.job]
        while other is not None:
            if other.name == job.name:
                chain = " after ".join([*seen, job.name])
                raise ConfigError(key, f"a cycle: {chain}; a chain must end at a scheduled job")
            seen.append(other.name)
            after = other.after
            other = by_name.get(after.job) if after is not None else None
            if len(seen) > len(index) + 1:  # a cycle not through this job: its own error
                break


def check_windows(config: Config, job: JobConfig, path: str, size: int) -> None:
    """The two timing rules that keep a slot from running twice; `size`: the history size."""
    late = job.jitter + job.max_late
    late_ms = round(late * 1000)
    window = config.nats.duplicate_window
    if late_ms >= round(window * 1000):
        raise ConfigError(
            f"{path}.jitter",
            f"jitter ({format_duration(job.jitter)}) + max_late ({format_duration(job.max_late)})"
            f" must be shorter than nats.duplicate_window ({format_duration(window)})",
        )
    # Every attempt of a slot is a claim on the job's subject (retry).
    per_slot = 1 + job.retry.max
    if size * job.schedule.interval_floor_ms() > late_ms * per_slot:
        # Even the shortest interval any schedule can have is enough: skip
        # min_interval_ms(), which walks a year of slots (10-15 ms a job).
        return
    interval_ms = job.schedule.min_interval_ms()
    if size * interval_ms <= late_ms * per_slot:
        attempts = f" / {per_slot} claims a slot (1 + retry.max)" if per_slot > 1 else ""
        raise ConfigError(
            f"{path}.history_size" if job.history_size is not None else "nats.history_size",
            f"history_size {size} x the shortest interval {format_duration(interval_ms / 1000)}"
            f"{attempts} = {format_duration(size * interval_ms / 1000 / per_slot)} does not "
            f"cover jitter + max_late ({format_duration(late)}): after a restart JetStream "
            "rebuilds its duplicate memory only from the claims still stored, so a late "
            "instance could claim an already trimmed slot again; raise history_size",
        )


def check_fit(job: JobConfig, ack_timeout: float, path: str) -> None:
    """``jitter + claim.fallback + nats.ack_timeout`` must be shorter than ``max_late``:
    a slot whose candidates died is claimed by the others in time."""
    claim = job.claim
    if claim.candidates < 1:
        return
    need = job.jitter + claim.fallback + ack_timeout
    if round(need * 1000) >= round(job.max_late * 1000):
        raise ConfigError(
            f"{path}.claim.fallback",
            f"jitter ({format_duration(job.jitter)}) + claim.fallback "
            f"({format_duration(claim.fallback)}) + nats.ack_timeout "
            f"({format_duration(ack_timeout)}) must be shorter than max_late "
            f"({format_duration(job.max_late)}): when the candidates are gone the others "
            "claim after the fallback, and that claim must still be in time",
        )
