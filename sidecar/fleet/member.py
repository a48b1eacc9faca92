"""One sidecar's part in the fleet: the state bucket's view, presence, pause.

``Fleet`` opens (or creates) the state bucket once NATS answers, keeps the
view in step (``watch.Watch``), keeps ``instance.<id>`` alive while the
sidecar runs and deletes it on a clean exit, and exports what the view says:
``job_paused``, ``fleet_instances`` and ``fleet_config_mismatch``. The job
loops ask ``blocked(job)`` before each claim; it answers from memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from sidecar import __version__
from sidecar.config.jobset import Change, JobSet
from sidecar.core.backoff import Backoff
from sidecar.core.clock import Clock, rfc3339
from sidecar.core.natspy import connection_of
from sidecar.core.tasks import TaskSet
from sidecar.core.wire import instance_key, paused_key, skip_key
from sidecar.fleet.freshness import Freshness
from sidecar.fleet.listeners import KeyListeners
from sidecar.fleet.orphans import Orphans
from sidecar.obs.ratelog import RateLimitedLog
from sidecar.store.bucketcheck import check_bucket, needs_leases
from sidecar.store.digests import BUCKET_PREFIX, HASH_KIND, job_hash, mismatched_jobs
from sidecar.store.kv import delete_at, put_with_ttl
from sidecar.store.state import (
    PRESENCE_RENEW,
    PRESENCE_TTL,
    Bucket,
    Removal,
    View,
    ensure_bucket,
    state_spec,
)
from sidecar.store.versions import version_problem
from sidecar.store.watch import Watch
from sidecar.when.pauses import PAUSED, SKIP, pause_active, pending, skip_slots, until_ms

if TYPE_CHECKING:
    from sidecar.config.load import Config
    from sidecar.obs.metrics import Metrics
    from sidecar.store.permissions import Denial

log = logging.getLogger(__name__)

# Between two tries to open the state bucket.
BUCKET_RETRY_START = 0.2
BUCKET_RETRY_CAP = 30.0
# The bucket's settings are checked this often, and at once after a reconnect or
# when the watch sees them change or the bucket disappear.
BUCKET_REFRESH = 30.0
# A slot judged at its instant (``blocked``/``skipped`` with a slot) by a view that
# cannot say what the bucket held then (re-read since, changed after): not claimed here.
UNKNOWN_PAST = "the state bucket's state at the slot's time is not known here"
# The view keeps pause/skip changes this much longer than a job's jitter + max_late.
TIMELINE_MARGIN = 30.0


class Fleet:
    """The state bucket as one running sidecar uses it."""

    def __init__(
        self,
        config: Config,
        metrics: Metrics,
        clock: Clock,
        *,
        jobs: JobSet,
        denied: Callable[[str], bool] | None = None,
        refused: Callable[..., Denial | None] | None = None,
    ) -> None:
        self.config = config
        # The sidecar's one job set (sidecar/config/jobset.py): the file's jobs, then
        # the state bucket's as they come and go.
        self.jobs = jobs
        self.metrics = metrics
        self.clock = clock
        self.spec = state_spec(config)
        self.view = View(
            on_change=self._changed, on_removed=self._removed, on_unknown=self._unknown
        )
        self.view.keep_seconds = TIMELINE_MARGIN + self.jobs.latest_claim
        # Who judges the leases of jobs that no live instance runs (sidecar/fleet/orphans.py).
        self.orphans = Orphans(self.view)
        # Told of every key the watch delivers (of the families each names, when it
        # names some: sidecar/fleet/listeners.py); after a full re-read, of each key
        # it changed and then "", which alone stands for the instance and job keys
        # (sidecar/store/watch.py).
        self.key_listeners = KeyListeners()
        self.removal_listeners: list[Callable[[Removal], None]] = []
        self.bucket: Bucket | None = None
        self.watch: Watch | None = None
        self.problem: str | None = "state bucket not read yet"
        # Why the bucket cannot hold leases (bucketcheck); None while it can.
        self.bucket_problem: str | None = None
        self._recheck = asyncio.Event()
        # Whether NATS refused a subject to this user lately (the daemon's Denials).
        self.denied = denied
        # The last refusal of a subject naming the bucket or its stream (Denials.about).
        self.refused = refused
        self._said = RateLimitedLog(log)
        self._unknown_seen: set[tuple[str, int]] = set()  # counted once each (re-reads)
        self._lease_jobs = frozenset(job.name for job in self.jobs.all if needs_leases(job))
        self._tasks = TaskSet("the fleet", say=False)
        self._mismatch: set[str] = set()
        self._counted = -1  # the view's presence_generation last counted
        self._pause_timers: dict[str, asyncio.TimerHandle] = {}
        self._started_at = rfc3339(clock.wall())
        self.jobs.subscribe(self._jobs_changed)
        self.presence = {
            "version": __version__,
            "started_at": self._started_at,
            "jobs": {job.name: job_hash(job) for job in config.jobs},
            "digest": HASH_KIND,  # the kind of those hashes (store/digests.py mismatched_jobs)
            "metrics": f"{config.metrics.host}:{config.metrics.port}",
        }
        if config.calendars:  # content hashes: a mismatch is named (store/digests.py)
            self.presence["calendars"] = {n: c.digest for n, c in config.calendars.items()}
        # Whether the view is whole up to an instant: the fate probe (issue 39).
        self.freshness = Freshness(
            self.view,
            clock,
            bucket=lambda: self.bucket,
            instance_id=config.instance_id,
            presence=self.presence,
            tasks=self._tasks,
            denied=denied,
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self, js: JetStreamContext) -> None:
        self._tasks.spawn(self._run(js))

    async def stop(self, connected: bool = True) -> None:
        """Stop watching and leave the fleet: the instance key is deleted (when
        `connected`; else its TTL removes it, and the exit does not wait for NATS)."""
        await self._tasks.cancel()
        self.freshness.stop()
        for timer in self._pause_timers.values():
            timer.cancel()
        if connected and self.bucket is not None and self.bucket.ttl:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    delete_at(self.bucket.kv, instance_key(self.config.instance_id)), 2.0
                )

    def reconnected(self) -> None:
        """After a reconnect the watch may have missed updates: re-read and re-check the bucket."""
        if self.watch is not None:
            self.watch.resync()
        self._recheck.set()

    @property
    def replaced(self) -> bool:
        """The bucket was deleted (or made again) and has not been read since."""
        return self.watch is not None and self.watch.replaced

    @property
    def leases_ok(self) -> bool:
        """Whether leases may be taken: the bucket is open, read and fit for them."""
        return (
            self.bucket is not None
            and self.bucket.ttl
            and self.bucket_problem is None
            and not self.replaced
        )

    def _jobs_changed(self, change: Change) -> None:
        """A job of the state bucket came, changed or left: which jobs need leases,
        and how long the view keeps a pause's timeline (the largest jitter and lateness)."""
        names = {job.name for job in change.put} | set(change.removed)
        leased = {job.name for job in change.put if needs_leases(job)}
        self._lease_jobs = (self._lease_jobs - names) | leased
        self.view.keep_seconds = TIMELINE_MARGIN + self.jobs.latest_claim

    def not_ready(self) -> str | None:
        """Why the state bucket keeps the sidecar from being ready; None when it does not."""
        if self.bucket_problem and self._lease_jobs:
            return self.bucket_problem
        return self.problem

    async def _run(self, js: JetStreamContext) -> None:
        backoff = Backoff(BUCKET_RETRY_START, BUCKET_RETRY_CAP)
        while self.bucket is None:
            try:
                self.bucket = await ensure_bucket(js, self.spec)
            except Exception as exc:  # not ready yet, or refused: say so, try again
                self._cannot_open(exc)
                await backoff.sleep()
        await self._check(js)
        if too_old := version_problem(str(connection_of(js).connected_server_version)):
            log.warning("%s", too_old)
        self.watch = Watch(self.bucket, self.view, self._recheck.set)
        await self._watch_advisories(js)
        self._tasks.spawn(self.watch.run())
        self._tasks.spawn(self._presence())
        while True:
            self._recheck.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._recheck.wait(), BUCKET_REFRESH)
            await asyncio.sleep(0.2)  # a burst of changes is one check
            await self._check(js)

    def _cannot_open(self, exc: Exception) -> None:
        """The reason for /readyz, said once: a refusal by NATS's permissions is said
        by its own line (sidecar/store/permissions.py), not again as this timeout; any
        other failure once a minute while it lasts."""
        refusal = self.refused(self.spec.bucket, self.spec.stream) if self.refused else None
        if refusal is not None:
            self.problem = (
                f"cannot open state bucket {self.spec.bucket}: NATS refused "
                f"{refusal.operation} to {refusal.subject!r} (a permissions violation; see "
                "deploy/nats/permissions.conf)"
            )
            return
        self.problem = f"cannot open state bucket {self.spec.bucket}: {exc!r}"
        self._said.warning(f"open:{type(exc).__name__}", "%s", self.problem)

    async def _watch_advisories(self, js: JetStreamContext) -> None:
        """The bucket's stream deleted, made or changed: re-read it at once, not at the
        watchdog's next look (a few seconds in which a lock in the new bucket would
        not see the runs of the old one). Best effort: the watchdog remains."""
        nc = connection_of(js)
        watch = self.watch
        if nc is None or watch is None:
            return

        async def on_advisory(msg: object) -> None:
            watch.resync()
            self._recheck.set()

        try:
            await nc.subscribe(f"$JS.EVENT.ADVISORY.STREAM.*.{self.spec.stream}", cb=on_advisory)
        except Exception as exc:
            log.debug("no state bucket advisories: %r", exc)

    async def _check(self, js: JetStreamContext) -> None:
        """Check the bucket's settings (bucketcheck); create it again when it is gone."""
        assert self.bucket is not None
        self.metrics.state_bucket_checks_total.inc()
        lease_ttl = self.config.nats.lease_ttl
        try:
            try:
                check = await check_bucket(js, self.spec, lease_ttl, fix=True)
            except NotFoundError:
                again = await ensure_bucket(js, self.spec)
                self.bucket.kv, self.bucket.ttl = again.kv, again.ttl
                self.metrics.state_bucket_fixed_total.inc()
                log.warning("state bucket %s was gone; created it again", self.spec.bucket)
                check = await check_bucket(js, self.spec, lease_ttl, fix=True)
        except Exception as exc:  # no answer: the last verdict stands, checked again soon
            log.debug("checking the state bucket: %r", exc)
            return
        if check.fixed:
            self.metrics.state_bucket_fixed_total.inc()
            log.warning(
                "state bucket %s: set %s (leases need it)", self.spec.bucket, ", ".join(check.fixed)
            )
        self.bucket.ttl = check.facts.msg_ttl and check.facts.marker_ttl is not None
        self._set_bucket_problem(check.problem)

    def _set_bucket_problem(self, problem: str | None) -> None:
        if problem != self.bucket_problem:
            if problem:
                jobs = sorted(self._lease_jobs)
                log.error("%s (jobs not claimed: %s)", problem, ", ".join(jobs[:10]) or "none")
            else:
                log.info("state bucket %s holds leases again", self.spec.bucket)
        self.bucket_problem = problem
        self.metrics.state_bucket_ok.set(0 if problem else 1)

    async def _presence(self) -> None:
        assert self.bucket is not None
        key = instance_key(self.config.instance_id)
        while True:
            if self.bucket.ttl:  # without TTLs a dead instance's key would stay for ever
                try:
                    await put_with_ttl(self.bucket, key, self.presence, PRESENCE_TTL)
                except Exception as exc:  # renewed at the next beat
                    log.debug("presence: %r", exc)
            await asyncio.sleep(PRESENCE_RENEW)

    # ------------------------------------------------------------------ reading

    def blocked(self, job: str, slot: int | None = None) -> tuple[str, str] | None:
        """(reason, why) when `job` must not be claimed; None when it may.

        With `slot` (epoch ms) the pause is the one the bucket held at the
        slot's instant, by the server's time (``View.at_instant``): every
        sidecar judges a slot alike, whenever its jitter ends. A pause stored
        after the instant never applies to the slot, one ended (deleted, or
        its ``until`` reached) at or before it never does.
        """
        if not self.view.synced:
            return "stream", self.problem or "state bucket not read yet"
        if job in self._lease_jobs:
            if self.bucket_problem:
                return "bucket", self.bucket_problem
            if self.replaced:
                return "bucket", f"state bucket {self.spec.bucket} was deleted; re-reading it"
        if slot is None:
            entry = self.view.paused(job)
            value = entry.value if entry is not None else None
            instant_ms = self.clock.wall_ms()
        else:
            known, value = self.view.at_instant(paused_key(job), slot / 1000)
            if not known:
                return "stream", UNKNOWN_PAST
            instant_ms = slot
        if value is not None and pause_active(value, instant_ms):
            v = value
            why = f"paused by {v.get('by', '?')} at {v.get('at', '?')}"
            if v.get("until"):
                why += f" until {v['until']}"
            if v.get("reason"):
                why += f": {v['reason']}"
            return PAUSED, why
        return None

    def left_bucket(self, job: str) -> bool:
        """Whether job `job` of the state bucket has no key there any more (`job remove`).
        Its walk ends at the next take-up round (sidecar/admin/bucket_jobs.py), which
        may first wait for a slot in hand; a slot judged meanwhile is not claimed."""
        if not self.view.synced or self.jobs.from_file(job):
            return False
        return BUCKET_PREFIX + job not in self.view.keys

    def skipped(self, job: str, slot: int) -> tuple[str, str] | None:
        """(``skip``, why) when the skip the bucket held at the slot's instant chose it;
        ("stream", why) when that is not known here; None otherwise."""
        known, v = self.view.at_instant(skip_key(job), slot / 1000)
        if not known:
            return "stream", UNKNOWN_PAST
        if v is None or slot not in skip_slots(v):
            return None
        self.metrics.job_skips_pending.labels(job=job).set(pending(v, slot))
        why = f"skip by {v.get('by', '?')} at {v.get('at', '?')}"
        return SKIP, why + (f": {v['reason']}" if v.get("reason") else "")

    async def caught_up(self, instant: float, deadline: float) -> bool:
        """Whether the view holds every change the bucket stored before `instant`
        (server time), waiting for it until `deadline` (sidecar/fleet/freshness.py)."""
        return await self.freshness.caught_up(instant, deadline)

    def _pause_changed(self, job: str, log_it: bool = True) -> None:
        """The pause gauges of `job` from the view; a timed pause ends by a timer."""
        m = self.metrics
        entry = self.view.paused(job)
        value = entry.value if entry else None
        now_ms = self.clock.wall_ms()
        active = pause_active(value, now_ms)
        end = until_ms(value) if value is not None else None
        m.job_paused.labels(job=job).set(1 if active else 0)
        m.job_paused_until_timestamp_seconds.labels(job=job).set(
            end / 1000 if active and end is not None else 0
        )
        if log_it:
            _log_pause(job, value if active else None)
        old = self._pause_timers.pop(job, None)
        if old is not None:
            old.cancel()
        if active and end is not None:
            # Ends by itself everywhere: each sidecar's own timer, no CLI needed.
            delay = (end - now_ms) / 1000 + 0.001
            self._pause_timers[job] = asyncio.get_running_loop().call_later(
                delay, self._pause_ended, job
            )

    def _pause_ended(self, job: str) -> None:
        self._pause_timers.pop(job, None)
        log.info("job %s: its pause ended (paused until its time)", job)
        self._pause_changed(job, log_it=False)

    def _removed(self, removal: Removal) -> None:
        if not self.view.synced:
            return
        for listener in self.removal_listeners:
            try:
                listener(removal)
            except Exception:  # one listener's bug must not stop the watch
                log.exception("state bucket: handling the removal of %s failed", removal.key)

    def _unknown(self, key: str, revision: int) -> None:
        """A key of no family (sidecar/store/keyfamilies.py): ignored, counted, said."""
        if (key, revision) in self._unknown_seen:
            return
        if len(self._unknown_seen) >= 1000:
            self._unknown_seen.clear()
        self._unknown_seen.add((key, revision))
        self.metrics.hostile_input_total.labels(what="unknown_key").inc()
        self._said.warning(
            "unknown key",
            "state bucket: key %r is of no family this sidecar knows; ignored. A newer "
            "release's key during a rolling update, or hostile input (whoever may write "
            "the state bucket wrote it)",
            key[:200],
        )

    def _changed(self, key: str) -> None:
        """After the watch delivered `key` ("" after a re-sync): gauges and log lines."""
        if not self.view.synced:
            return
        self.problem = None
        for listener in self.key_listeners.for_key(key):
            try:
                listener(key)
            except Exception:  # one listener's bug must not stop the watch
                log.exception("state bucket: handling %s failed", key)
        m = self.metrics
        if key.startswith("paused."):
            job = key[len("paused.") :]
            if job in self.jobs:
                self._pause_changed(job)
        if key.startswith("skip."):
            job = key[len("skip.") :]
            if job in self.jobs:
                entry = self.view.keys.get(key)
                value = entry.value if entry else None
                m.job_skips_pending.labels(job=job).set(pending(value, self.clock.wall_ms()))
        if key and not key.startswith("instance."):
            return  # leases and due attempts change often; instances did not
        if key and self.view.presence_generation == self._counted:
            return  # an instance renewed the same presence
        self._counted = self.view.presence_generation
        instances = self.view.instances()
        m.fleet_instances.set(len(instances))
        mismatch = mismatched_jobs(instances)
        m.fleet_config_mismatch.set(1 if mismatch else 0)
        if mismatch and mismatch != self._mismatch:
            log.warning(
                "live instances run these jobs with different settings: %s (see `status`)",
                ", ".join(sorted(mismatch)),
            )
        self._mismatch = mismatch


def _log_pause(job: str, value: dict[str, Any] | None) -> None:
    if value is None:
        log.info("job %s resumed", job)
    else:
        log.warning(
            "job %s paused by %s at %s%s%s: its slots are skipped",
            job,
            value.get("by", "?"),
            value.get("at", "?"),
            f" until {value['until']}" if value.get("until") else "",
            f" ({value['reason']})" if value.get("reason") else "",
        )
