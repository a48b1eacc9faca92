"""Jobs that no live instance runs: who judges the expiry of their leases.

A job removed or renamed in the config of the whole fleet (or retired with
``job remove``) can leave keys behind in the state bucket. Nothing here
removes them: docs/RELEASES.md ("Jobs changed on a live fleet") says what
happens to each, and docs/GUARANTEES.md ("What the fleet removes on its
own") what the fleet removes at all. In short:

- A lease (``run.*``, ``lock.*``) expires whoever holds it (its TTL); the
  expiry of a lease of a job that is not in this sidecar's config is still
  judged (recorded ``lost`` once) when no live instance other than the
  lease's own holder runs the job: nobody else would (``Orphans.judges``).
- An operator's intent (``paused.*``, ``count.*``, ``skip.*``, ``at.*``,
  ``backfill.*``, ``since.*``, ``job.*``), a pending run (``buffer.*``, and
  ``due.*`` until its own TTL) and the record of acts (``actions.*``) are
  never removed because no live instance runs the job: a scale-to-zero, a
  Recreate deploy or a crash loop looks exactly like a removal from here,
  and must not undo a pause or a ``max_runs`` count. Only a command of this
  project (``resume``, ``forget``, ...) or ``nats kv del`` removes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sidecar.store.digests import BUCKET_PREFIX, bucket_set, runs_job
from sidecar.store.state import Removal, View

# Every key kind that belongs to one job: ``<kind>.<job>[.<more>]``.
PER_JOB = (
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
    "run",
    "lock",
    "stop",
)


def job_of(key: str) -> str | None:
    """The job of a per-job key (``paused.``, ``due.``, ``run.``, ``lock.``, ``health.``...)."""
    kind, _, rest = key.partition(".")
    if kind not in PER_JOB or not rest:
        return None
    return rest.split(".", 1)[0] or None


def run_by(
    instances: dict[str, dict[str, Any]], bucket: Iterable[str] = ()
) -> dict[str, list[str]]:
    """For each job a live instance runs: which instances, sorted (`bucket`: the
    state bucket's jobs, run by each instance whose presence has a set of them)."""
    out: dict[str, list[str]] = {}
    names = sorted(bucket)
    for instance, value in sorted(instances.items()):
        jobs = value.get("jobs")
        listed = jobs if isinstance(jobs, dict) else {}
        for name in listed:
            out.setdefault(str(name), []).append(instance)
        if names and bucket_set(value) is not None:
            for name in names:
                if name not in listed:
                    out.setdefault(name, []).append(instance)
    return out


class Orphans:
    """One sidecar's judgement over the leases of jobs that it does not run."""

    def __init__(self, view: View) -> None:
        self.view = view

    def judges(self, removal: Removal) -> bool:
        """Whether this sidecar records the expiry of a lease of a job not in its config:
        no live instance but the lease's holder runs the job (``runs_job``)."""
        view = self.view
        if not view.synced:
            return False
        job = job_of(removal.key)
        if job is None:
            return False
        # The presences as last read (``View.presences``) and one look-up: a sidecar
        # restarted mid-burst judges thousands of expiring leases of jobs it has not
        # taken up yet (reading the whole view for each: about 25 ms at 100,000 jobs).
        holder = removal.entry.value.get("instance")
        in_bucket = f"{BUCKET_PREFIX}{job}" in view.keys
        return not any(
            runs_job(value, job, in_bucket)
            for instance, value in view.presences().items()
            if instance != holder
        )
