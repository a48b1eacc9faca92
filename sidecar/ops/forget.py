"""``forget JOB``: every key of a job retired from the whole fleet, removed on purpose.

The fleet never removes a job's keys because no live instance runs it (a
scale-to-zero looks exactly like a retirement: sidecar/fleet/orphans.py,
docs/GUARANTEES.md), so a job taken out of the config of every sidecar keeps
its pause, its ``max_runs`` count, its skips, one-off runs, backfill,
catch-up bound, kept slot, due attempts, health and record of acts. This
command removes them when the operator says the job is gone, and only then:

- a job of the config given to the command is refused (exit 2: the sidecars
  of that config would run it), and so is a job of the state bucket
  (``job.<name>``: ``job remove`` first, with its id check);
- a job that a live instance lists in its presence, or whose run or overlap
  lock holds a lease, is refused (``ForgetRefused``): its keys are in use;
- each key is deleted by its revision, so one written meanwhile (a pause
  set again) stays and is named.

Leases (``run.*``, ``lock.*``), stop requests (``stop.*``) and notification
markers (``event.*``) expire by their own TTL and are never touched here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.js import JetStreamContext

from sidecar.admin.jobcheck import job_key
from sidecar.config.load import Config, Secrets
from sidecar.core.errors import CasConflict, ForgetRefused, StreamNotFound
from sidecar.fleet.orphans import PER_JOB, job_of, run_by
from sidecar.ops.streamops import answered
from sidecar.store.connection import connected, one_shot_js
from sidecar.store.kv import delete_at
from sidecar.store.state import read_view, state_spec

# The kinds a run in flight holds (a lease): the job is in use while one is there.
LEASES = ("run", "lock")
# Kept by their own TTL, gone after it: never deleted here.
EXPIRING = (*LEASES, "stop")
FORGOTTEN = tuple(kind for kind in PER_JOB if kind not in EXPIRING)


@dataclass(frozen=True)
class Forgotten:
    """What ``forget`` did: the keys removed, and those written again meanwhile (kept)."""

    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


async def forget(config: Config, secrets: Secrets, job: str) -> Forgotten:
    """Delete every key of `job` of the ``FORGOTTEN`` kinds, each by its revision."""
    async with connected(config, secrets) as conn:
        with answered("the state bucket did not answer: nothing more forgotten"):
            return await _forget(one_shot_js(conn), config, job)


async def _forget(js: JetStreamContext, config: Config, job: str) -> Forgotten:
    """The checks of the module doc on one read of the bucket, then the deletes."""
    view = await read_view(js, config)
    if view is None:
        raise StreamNotFound(
            f"state bucket {state_spec(config).bucket} does not exist: nothing to forget"
        )
    if job_key(job) in view.keys:
        raise ForgetRefused(
            f"{job} is a job of the state bucket ({job_key(job)}): "
            f"`job remove {job}` first, then forget it"
        )
    if by := run_by(view.instances()).get(job):
        raise ForgetRefused(
            f"{job} is run by {', '.join(by)} (live instances): remove it from their "
            "config first; forget is for a job no sidecar runs"
        )
    mine = sorted(key for key in view.keys if job_of(key) == job)
    if leases := [key for key in mine if key.partition(".")[0] in LEASES]:
        raise ForgetRefused(
            f"{job}: a run holds a lease ({', '.join(leases)}): try again once it "
            f"ended or expired (nats.lease_ttl)"
        )
    done = Forgotten()
    kv = await js.key_value(state_spec(config).bucket)
    for key in mine:
        if key.partition(".")[0] not in FORGOTTEN:
            continue
        try:
            await delete_at(kv, key, view.keys[key].revision)
        except CasConflict:
            done.kept.append(key)
            continue
        done.removed.append(key)
    return done
