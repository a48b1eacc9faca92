"""Jobs that no live instance runs any more: their leases judged, their keys removed.

A job removed or renamed in the config of the whole fleet leaves keys behind
in the state bucket: the lease of a run that was going (``run.*``,
``lock.*``), a retry that was due (``due.*``), a pause (``paused.*``).
docs/RELEASES.md ("Jobs changed on a live fleet") says what happens to each;
here is the part that needs code:

- A lease expires whoever holds it (its TTL); the expiry of a lease of a job
  that is not in this sidecar's config is still judged (recorded ``lost``
  once) when no live instance other than the lease's own holder runs the
  job: nobody else would (``judges``).
- the other keys of a job (``paused.*``, ``due.*``, ``health.*``, ``skip.*``,
  ``backfill.*``, ``since.*``, ``actions.*``, ``count.*``, ``at.*``) that this sidecar saw a live
  instance run, and that no live instance has listed since for ``grace``,
  are deleted by their revision (``Orphans.run``), so that renames and
  removals leave nothing behind; a pause written again meanwhile conflicts
  and stays. A job never seen run is left alone: a job paused before it is
  deployed stays paused. Only a sidecar whose own presence is in its view
  sweeps: without presence (no TTLs, not synced) "no live instance runs it"
  would be a guess.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from sidecar.core.clock import Clock
from sidecar.core.errors import CasConflict
from sidecar.core.wire import instance_key
from sidecar.store.kv import Keys
from sidecar.store.state import PRESENCE_TTL, Removal, View

if TYPE_CHECKING:
    from sidecar.config.load import Config

log = logging.getLogger("sidecar.orphans")

# How often the view is looked at for keys of jobs nobody runs.
SWEEP_EVERY = 5.0
# Key kinds removed when their job is run by no live instance (leases expire
# by their TTL, ``event.*`` markers by theirs; these have none).
SWEPT = (
    "paused",
    "due",
    "health",
    "skip",
    "backfill",
    "since",
    "actions",
    "count",
    "at",
    "buffer",
)
# Every key kind that belongs to one job: ``<kind>.<job>[.<more>]``.
PER_JOB = (*SWEPT, "run", "lock", "stop")


def grace(lease_ttl: float) -> float:
    """How long no live instance must have listed a job before its keys go.

    Longer than a killed instance's presence lingers (PRESENCE_TTL) twice
    over, and than a lease, so a rolling restart never counts as a removal.
    """
    return max(lease_ttl, 2 * PRESENCE_TTL)


def job_of(key: str) -> str | None:
    """The job of a per-job key (``paused.``, ``due.``, ``run.``, ``lock.``, ``health.``...)."""
    kind, _, rest = key.partition(".")
    if kind not in PER_JOB or not rest:
        return None
    return rest.split(".", 1)[0] or None


def jobs_run(instances: dict[str, dict[str, Any]], but: object = None) -> set[str]:
    """The jobs that the live instances (all but `but`) list in their presence."""
    out: set[str] = set()
    for instance, value in instances.items():
        jobs = value.get("jobs")
        if instance != but and isinstance(jobs, dict):
            out.update(str(name) for name in jobs)
    return out


def run_by(instances: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """For each job a live instance lists: which instances, sorted."""
    out: dict[str, list[str]] = {}
    for instance, value in sorted(instances.items()):
        jobs = value.get("jobs")
        for name in jobs if isinstance(jobs, dict) else ():
            out.setdefault(str(name), []).append(instance)
    return out


class Orphans:
    """One sidecar's watch over the keys of jobs that the fleet no longer runs."""

    def __init__(self, config: Config, view: View, clock: Clock) -> None:
        self.config = config
        self.view = view
        self.clock = clock
        self.grace = grace(config.nats.lease_ttl)
        self.own = frozenset(job.name for job in config.jobs)
        self.since: dict[str, float] = {}  # job -> monotonic time it was first seen unrun
        self.seen: set[str] = set()  # jobs a live instance was seen to run

    def judges(self, removal: Removal) -> bool:
        """Whether this sidecar records the expiry of a lease of a job not in its config."""
        if not self.view.synced:
            return False
        job = job_of(removal.key)
        holder = removal.entry.value.get("instance")
        return job is not None and job not in jobs_run(self.view.instances(), but=holder)

    def stale(self, now: float) -> list[tuple[str, int]]:
        """(key, revision) of the swept keys whose job nobody has run for `grace`."""
        if not self.view.synced or instance_key(self.config.instance_id) not in self.view.keys:
            self.since.clear()
            return []
        run = jobs_run(self.view.instances()) | self.own
        keys = {
            key: job
            for key in self.view.keys
            if key.partition(".")[0] in SWEPT and (job := job_of(key)) is not None
        }
        # Bounded: forgotten once neither run nor holding a key.
        self.seen = (self.seen | run) & (run | set(keys.values()))
        unrun = {job for job in keys.values() if job not in run and job in self.seen}
        self.since = {job: self.since.get(job, now) for job in unrun}
        return [
            (key, self.view.keys[key].revision)
            for key, job in sorted(keys.items())
            if job in unrun and now - self.since[job] >= self.grace
        ]

    async def run(self, keys: Keys) -> None:
        """Delete stale keys every SWEEP_EVERY seconds, until cancelled."""
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            for key, revision in self.stale(self.clock.monotonic()):
                try:
                    await keys.delete(key, revision)
                except CasConflict:
                    continue  # written again, or another sidecar removed it first
                except Exception as exc:  # NATS away: the next sweep tries again
                    log.debug("state bucket: removing %s: %r", key, exc)
                    continue
                log.warning(
                    "state bucket: removed %s: no live instance has run job %s for %gs "
                    "(removed or renamed in the config)",
                    key,
                    job_of(key),
                    self.grace,
                )
