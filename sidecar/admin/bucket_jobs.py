"""The state bucket's jobs taken up by a daemon: ``job.<name>`` keys run beside the file's.

``BucketJobs`` runs them in a daemon, made on the first ``job.`` key
(sidecar/admin/jobkeys.py): it follows the view (every change the watch
delivers, and every re-read by the watchdog, handed on by ``JobKeys``), judges
each key as sidecar/admin/jobcheck.py says (a job of the file's checks plus
the bucket's rules), puts the valid ones into the job set
(sidecar/config/jobset.py) and starts a job's loop when
its key appears, restarts it when the job's settings change and ends it when
the key goes (between two claims: a run in flight finishes). A job of the
file always wins over a key of the same name (said once per revision); a
key that is not a valid job is hostile input: counted
(``hostile_input_total{what="job"}``), said, and not run.

The keys are written by the one-shot commands ``anarchon-sidecar job ...``
(sidecar/ops/jobops.py) and the API, both through sidecar/admin/jobwrite.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.admin.jobcheck import (
    BUCKET,
    CANON_BYTES,
    FILE,
    PREFIX,
    BucketJob,
    beyond_cap_in_slices,
    job_key,
    judge,
    listing,
    shown_at,
)
from sidecar.config.fields import short
from sidecar.config.keys import JOB_NAME
from sidecar.config.model import Config, JobConfig
from sidecar.core.errors import ConfigError
from sidecar.core.slices import RUN, SLICE, Budget, chunks, sort
from sidecar.core.tasks import TaskSet
from sidecar.core.wire import instance_key
from sidecar.store.digests import BUCKET_SET, job_hash, set_hash
from sidecar.store.kv import put_with_ttl
from sidecar.store.state import PRESENCE_TTL, Removal, View

if TYPE_CHECKING:
    from sidecar.fleet.member import Fleet
    from sidecar.obs.metrics import Metrics
    from sidecar.run.job_loop import Jobs

log = logging.getLogger(__name__)

# Take-up waits this long (s) after a change for the others written with it. It
# yields the loop every SLICE (sidecar/core/slices.py): a burst of keys never makes a
# slot of the file's jobs late.
GATHER = 0.02


# The cap is scanned again at most this many times in one round when a job key
# changed while its scan yielded (``_place``).
PLACE_TRIES = 3

# job_hash is 12 hex digits: 48 bits, above the lowest bit of ``_Running.digest``.
HASH_BITS = 48


@dataclass(slots=True)
class _Running:
    """A job of the bucket this sidecar runs, and the revision of its key last judged
    (slots: one of these per job, 100,000 of them: issue 49). The parts of its
    ``BucketJob`` are kept here, not the object itself, and its definition's digest,
    its job hash and whether its value has an ``id`` are one number, not a bytes, a
    string and a bool (about 140 B a job). The view lets the key's bytes go
    (``View.hold``): ``by`` and ``at`` are what ``listing`` shows of them."""

    job: JobConfig
    id: str
    revision: int
    # BucketJob.canon (equal means the same job), job_hash (the presence's one
    # entry for the set is made of these: ``_tell``), BucketJob.id_stored.
    digest: int
    by: object  # BucketJob.by: interned
    at: object  # BucketJob.at: jobcheck.kept_at

    @classmethod
    def of(cls, spec: BucketJob, revision: int) -> _Running:
        running = cls(spec.job, spec.id, revision, 0, None, None)
        running.stamp(spec)
        return running

    def stamp(self, spec: BucketJob) -> None:
        """The parts of `spec` kept (the same job: its value may be a later write)."""
        canon = int.from_bytes(spec.canon, "big")
        digest = canon << HASH_BITS | int(job_hash(spec.job), 16)
        self.digest = digest << 1 | spec.id_stored
        self.id, self.by, self.at = spec.id, spec.by, spec.at

    @property
    def canon(self) -> bytes:
        return (self.digest >> (HASH_BITS + 1)).to_bytes(CANON_BYTES, "big")

    @property
    def hash(self) -> str:
        return f"{(self.digest >> 1) & ((1 << HASH_BITS) - 1):012x}"

    @property
    def spec(self) -> BucketJob:
        return BucketJob(self.job, self.id, self.canon, bool(self.digest & 1), self.by, self.at)

    def listed(self) -> dict[str, Any]:
        """What ``listing`` reads of the key's stored value (``id``, ``by``, ``at``)."""
        return {"id": self.id if self.digest & 1 else None, "by": self.by, "at": shown_at(self.at)}


def _hash_of(running: _Running) -> str:
    return running.hash


class BucketJobs:
    """The state bucket's jobs as one sidecar runs them, beside the file's."""

    def __init__(
        self,
        *,
        config: Config,
        metrics: Metrics,
        fleet: Fleet,
        listeners: list[Callable[[], None]] | None = None,
    ) -> None:
        # The config as the file made it (the job set holds the bucket's jobs): a job
        # key is judged against it (the file's names, the stream's history size) in a
        # time that does not grow with the bucket's jobs.
        self.config = config
        self.metrics = metrics
        self.fleet = fleet
        self.file_names = frozenset(config.job_names)
        self.running: dict[str, _Running] = {}
        # Per name not running: the revision last judged (said once) and what it was
        # judged; a running job's is its ``running`` entry (not kept twice, issue 49).
        self._judged: dict[str, tuple[int, BucketJob | None]] = {}
        self._dirty: set[str] = set()
        # A full re-read asked every name to be taken up again (``changed("")``).
        self._everything = False
        # Names of the job keys beyond bucket_jobs.max_jobs, and the revision of each
        # counted as hostile (once); the keys to say in the take-up's one line.
        self._beyond: set[str] = set()
        self._over: dict[str, int] = {}
        self._over_said: list[str] = []
        # Counts the job keys' changes and removals and the full re-reads heard: a
        # scan of the cap that saw it move counted a key where it no longer is.
        self._heard = 0
        self._changed_set = False
        # Jobs taken up in this round and not yet registered (``_flush``).
        self._batch: list[tuple[BucketJob, int]] = []
        # Per job put again with new settings in this round: the slot its old walk
        # waited for, where the new walk goes on from (``Jobs.start``'s `resume`).
        self._resume: dict[str, int] = {}
        # Per job whose walk ``_retire`` waits for: whether its key left the bucket
        # (judged gone, or removed during the wait). Added again meanwhile, it is a
        # new job: it does not go on from the removed walk's slot.
        self._leaving: dict[str, bool] = {}
        # Per job whose walk handles a slot while it is ended: the task awaiting that
        # slot (its claim may take up to max_late), not the round: the other jobs'
        # changes are taken up meanwhile. The round finishes it once it is done.
        self._ending: dict[str, asyncio.Task[int | None]] = {}
        self._wake = asyncio.Event()
        # The worker taking up changes and the presence put at once (``stop``).
        self.tasks = TaskSet("bucket jobs", say=False)
        self._worker: asyncio.Task[None] | None = None
        self._presence: asyncio.Task[None] | None = None
        self._presence_due = False
        self.jobs: Jobs | None = None
        # Called with the running job set after each change (the page's objects):
        # JobKeys's list, which the page may have joined before this was made.
        self.listeners = listeners if listeners is not None else []

    def start(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self._worker = self.tasks.spawn(self._run())

    async def stop(self) -> None:
        """Stop taking up changes; the loops end with the daemon's (``loops``)."""
        await self.tasks.cancel()
        self._worker = self._presence = None

    def origin(self, name: str) -> tuple[str, str | None]:
        """(``file``, None) or (``bucket``, its external id): where job `name` comes from."""
        if name in self.file_names:
            return FILE, None
        running = self.running.get(name)
        return BUCKET, running.id if running is not None else None

    def listing(self) -> list[dict[str, Any]]:
        """Every job key of the bucket with its state, as ``status --json`` lists them.

        The keys whose bytes the view let go (``View.hold``) are listed from their
        running entries, which keep what the listing shows of the stored value."""
        view = self.fleet.view
        held: dict[str, dict[str, Any]] = {}
        for name, running in self.running.items():
            key = job_key(name)
            entry = view.keys.get(key)
            if entry is not None and entry.held:
                held[key] = running.listed()
        return listing(self.config, view, self.file_names, held)

    # ------------------------------------------------------------------ following the view

    def changed(self, key: str) -> None:
        if key == "" or key.startswith(PREFIX):
            self._heard += 1
        if key == "":  # a full re-read: every job key, and every job running
            # Named by the round, in slices (``_reread``): here, in the watch's call,
            # 100,000 names held the loop 60 ms in one piece.
            self._everything = True
        elif key.startswith(PREFIX):
            self._dirty.add(key[len(PREFIX) :])
        else:
            return
        self._wake.set()

    def removed(self, removal: Removal) -> None:
        if removal.key.startswith(PREFIX):
            self._heard += 1
            name = removal.key[len(PREFIX) :]
            self._dirty.add(name)
            if name in self._leaving:
                self._leaving[name] = True
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            # A burst of keys (thousands written in a second) is taken up in a few
            # rounds, not one round per key: each round looks at every job key.
            await asyncio.sleep(GATHER)
            self._wake.clear()
            # Every step of the round over every key or job (the cap, the order, the
            # presence's hash) yields the loop as the judging does: in one piece,
            # each held it for 50 to 150 ms with 100,000 jobs, several times that on
            # a loaded machine, and a scrape waited (docs/PERFORMANCE.md, "One
            # scrape at 100,000 jobs").
            budget = Budget(SLICE)
            if self._everything:
                await self._reread(budget)
            # The round's names are those changed before the cap's scan: a key written
            # while the scan yields is not counted in it (the latest written, maybe
            # beyond the cap), so it waits for the next round's place.
            dirty, self._dirty = self._dirty, set()
            dirty |= await self._place(budget)
            names = await sort(dirty, budget)
            dirty.clear()
            for name in names:
                try:
                    await self._reconcile(name)
                except Exception:  # one job's trouble must not stop the others'
                    log.exception("job %s of the state bucket: taking up its change failed", name)
                if budget.spent:
                    # Thousands of keys at once: the file's jobs' slots come first,
                    # and a scrape. The slice's jobs are taken up before yielding: at
                    # the round's end, 100,000 jobs' start held the loop for seconds
                    # (docs/PERFORMANCE.md, "100,000 jobs").
                    self._flush()
                    await budget.yield_now()
            # Not kept while waiting for the next change: a list of every name (a
            # string each, 100,000 of them after the start: issue 49).
            names.clear()
            self._flush()
            self._say_over()
            if self._changed_set:
                self._changed_set = False
                await self._tell(budget)

    async def _reread(self, budget: Budget) -> None:
        """After a full re-read of the view: every job key and every job running is
        taken up again, their names gathered a chunk at a time."""
        self._everything = False
        for keys in chunks(list(self.fleet.view.keys), RUN):
            self._dirty.update(k[len(PREFIX) :] for k in keys if k.startswith(PREFIX))
            await budget.pause()
        for names in chunks(list(self.running), RUN):
            self._dirty.update(names)
            await budget.pause()

    async def _place(self, budget: Budget) -> set[str]:
        """Which ``job.`` keys are beyond ``bucket_jobs.max_jobs``: the latest written
        (by revision, the same in every sidecar's view); the names whose place
        changed, to be taken up again."""
        for _ in range(PLACE_TRIES):
            heard = self._heard
            beyond = await beyond_cap_in_slices(
                self.fleet.view, self.config.bucket_jobs.max_jobs, budget
            )
            # A key removed or written again while the scan yielded was counted where
            # it no longer is: one too many, and the round's latest key would be
            # refused as hostile. A re-read meanwhile (a new mapping, keys the scan
            # never saw): one too few. Scanned again, a few times at most (a stream of
            # writes must not hold the round); below the cap nothing changed.
            if heard == self._heard or not (beyond or self._everything):
                break
        moved = beyond ^ self._beyond
        self._beyond = beyond
        return moved

    def _wanted(self, name: str) -> tuple[BucketJob | None, int]:
        """What the view says job `name` of the bucket should be now, and its revision."""
        view: View = self.fleet.view
        key = job_key(name)
        entry = view.keys.get(key) if view.synced else None
        if entry is None:
            self._judged.pop(name, None)
            self._over.pop(name, None)
            return None, 0
        if name in self._beyond:  # not judged: thousands of them cost nothing
            if self._over.get(name) != entry.revision:
                self._over[name] = entry.revision
                self.metrics.hostile_input_total.labels(what="job").inc()
                self._over_said.append(key)
            return None, entry.revision
        self._over.pop(name, None)
        current = self.running.get(name)
        if current is not None and current.revision == entry.revision:
            return current.spec, entry.revision  # its value may be held (View.hold)
        judged = self._judged.get(name)
        if judged is not None and judged[0] == entry.revision:
            return judged[1], entry.revision
        spec: BucketJob | None = None
        if not JOB_NAME.fullmatch(name):
            self._hostile(key, f"{short(name)} is not a job name")
        elif name in self.file_names:
            log.warning(
                "state bucket: %s is ignored: the config file has a job %s, and the "
                "file's job wins (`status` says so)",
                key,
                name,
            )
        else:
            try:
                spec = judge(self.config, key, entry.value)
            except ConfigError as exc:
                self._hostile(key, str(exc))
        self._judged[name] = (entry.revision, spec)
        return spec, entry.revision

    def _say_over(self) -> None:
        """The keys found beyond the cap in one take-up, said in one line."""
        if not self._over_said:
            return
        keys, self._over_said = self._over_said, []
        log.warning(
            "state bucket: %d job keys beyond bucket_jobs.max_jobs (%d) refused, not run "
            "(the latest written; first: %s); `anarchon-sidecar job add` refuses them",
            len(keys),
            self.config.bucket_jobs.max_jobs,
            short(keys[0]),
        )

    def _hostile(self, key: str, why: str) -> None:
        self.metrics.hostile_input_total.labels(what="job").inc()
        log.warning(
            "state bucket: %s refused, not run: %s (whoever may write the bucket wrote it; "
            "`anarchon-sidecar job add` checks a job before writing it)",
            key,
            why,
        )

    async def _reconcile(self, name: str) -> None:
        if self.jobs is None:
            return
        spec, revision = self._wanted(name)
        current = self.running.get(name)
        ending = self._ending.get(name)
        if ending is not None:
            if not ending.done():
                return  # taken up again when its slot in hand is handled (``_end_walk``)
            del self._ending[name]
            assert current is not None
            spec, revision = self._retired(name, current, ending.result())
        elif current is not None and spec is not None and current.canon == spec.canon:
            if current.revision != revision:  # the same job written again: by, at, id
                current.stamp(spec)
            current.revision = revision
            self._judged.pop(name, None)  # the running entry says it now
            self.fleet.view.hold(job_key(name), revision)
            return
        elif current is not None and self.jobs.handles(name):
            # Its end waits for the slot in hand: in a task of its own, not in the
            # round (every other job's add, update and removal waited for it).
            self._leaving[name] = spec is None
            self._ending[name] = self.tasks.spawn(self._end_walk(name))
            return
        elif current is not None:
            self._flush()  # _retire awaits: no job taken up is left half-registered
            spec, revision = await self._retire(name, current, gone=spec is None)
        if spec is not None and not self.jobs.stopping.is_set():
            self._adopt(spec, revision)
        else:
            self._resume.pop(name, None)

    def _adopt(self, spec: BucketJob, revision: int) -> None:
        """Take the job up with the next batch (``_flush``, before anything awaits)."""
        self._batch.append((spec, revision))

    def _flush(self) -> None:
        """Register the batch's jobs at once, then start each one's walk."""
        assert self.jobs is not None
        batch, self._batch = self._batch, []
        self._register([spec.job for spec, _ in batch])
        for spec, revision in batch:
            job = spec.job
            self.jobs.start(job, self._resume.pop(job.name, None))
            self.running[job.name] = _Running.of(spec, revision)
            self._judged.pop(job.name, None)  # the running entry says it now
            # Parsed and running: the view need not keep the key's bytes.
            self.fleet.view.hold(job_key(job.name), revision)
            log.info(
                "job %s (id %s) taken up from the state bucket: %s",
                job.name,
                spec.id,
                job.schedule.identity,
            )
            self._changed_set = True

    async def _retire(
        self, name: str, current: _Running, gone: bool
    ) -> tuple[BucketJob | None, int]:
        """End the job's loop between two claims; its runs in flight go on (``runs``).
        What the view says the job is now, and its revision: judged again once the slot
        in hand is handled, for the key may have been removed or written again
        meanwhile (the job judged before, put back on a walk, ran a slot after
        `job remove` answered). `gone`: the key was judged removed."""
        assert self.jobs is not None
        self._leaving[name] = gone
        try:
            resume = await self.jobs.retire(name)
        except BaseException:
            self._leaving.pop(name, None)
            raise
        return self._retired(name, current, resume)

    async def _end_walk(self, name: str) -> int | None:
        """End job `name`'s walk once its slot in hand is handled; then the round
        takes the job up again (``_retired``)."""
        assert self.jobs is not None
        try:
            return await self.jobs.retire(name)
        finally:
            self._dirty.add(name)
            self._wake.set()

    def _retired(
        self, name: str, current: _Running, resume: int | None
    ) -> tuple[BucketJob | None, int]:
        """The job's walk has ended (``resume``: the slot it waited for): let it go,
        or say what it is now, judged again."""
        left = self._leaving.pop(name, True)
        del self.running[name]
        spec, revision = self._wanted(name)
        # Removed, then added again during the wait: a new job, walked from its add
        # (a slot between the removal and the add would run at once).
        if spec is not None and resume is not None and not left:
            # A slot whose time came while its jitter had not is handled by the
            # new walk, not dropped (sidecar/run/timetable.py ``start``).
            self._resume[name] = resume
        if spec is None:
            self._unregister(name)
            # 0: "no next run", which the alert rules leave out (`> 0`); a job
            # without a series gets none for it (sidecar/obs/next_run.py).
            self.metrics.job_next_run_timestamp_seconds.note(name, 0)
            log.info("job %s (id %s) left the state bucket: not run any more", name, current.id)
            self._changed_set = True
        else:
            log.info("job %s (id %s) changed in the state bucket", name, current.id)
        return spec, revision

    async def _tell(self, budget: Budget) -> None:
        """After a take-up changed the running set: the page's listeners, and the
        presence's one entry for the set (constant in size, sidecar/store/digests.py).

        The set's hash is made in slices (``set_hash``): only this task changes
        ``running``, so the set hashed is the round's, whatever the watch delivers
        meanwhile (the next round's)."""
        for listener in self.listeners:
            listener()
        if self.running:
            # Made from the running entries at each change, not kept as a second map.
            digest = await set_hash(self.running, budget, _hash_of)
            self.fleet.presence[BUCKET_SET] = {"count": len(self.running), "hash": digest}
        else:
            self.fleet.presence.pop(BUCKET_SET, None)
        self._publish_presence()

    def _publish_presence(self) -> None:
        """Put this instance's presence (its jobs' hashes) at once, not at the next
        renewal (5 s): the fleet would see "settings differ" meanwhile."""
        self._presence_due = True
        if self._presence is None:
            self._presence = self.tasks.spawn(self._put_presence())

    async def _put_presence(self) -> None:
        try:
            while self._presence_due:
                self._presence_due = False
                bucket = self.fleet.bucket
                if bucket is None or not bucket.ttl:
                    return
                key = instance_key(self.config.instance_id)
                try:
                    await put_with_ttl(bucket, key, self.fleet.presence, PRESENCE_TTL)
                except Exception as exc:  # renewed at the next beat anyway
                    log.debug("presence: %r", exc)
        finally:
            self._presence = None

    # ------------------------------------------------------------------ the job set

    def _register(self, batch: list[JobConfig]) -> None:
        """Make the jobs of `batch` this sidecar's jobs: one ``put`` into the job set
        (sidecar/config/jobset.py) for the batch (a slice of a take-up round); the parts
        that keep something derived from the jobs are told by the set."""
        self.fleet.jobs.put(batch)

    def _unregister(self, name: str) -> None:
        # Lost runs of a removed job are still judged (no longer in "ours": as for
        # a job removed from the file, sidecar/fleet/orphans.py).
        self.fleet.jobs.remove((name,))
