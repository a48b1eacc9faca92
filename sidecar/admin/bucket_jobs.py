"""Jobs added at run time: ``job.<name>`` keys of the state bucket, beside the file's.

A key ``job.<name>`` holds one job as JSON: the same mapping as an entry of
``jobs:`` plus ``id`` (the caller's external id: adding the same job with the
same id again changes nothing) and ``by``/``at`` (who wrote it, when). It is
parsed by the config's own parser (``parse_job``, ``check_windows``,
``check_fit``) with the file's ``target`` and ``defaults``, and three more
rules, because whoever can write the bucket is not whoever wrote the file
(SECURITY.md): the target is the file's (no ``request.url``), no ``ping``
(its URL would be anywhere), and no header the file's ``target.headers``
sets (the app's credentials stay the file's).

``BucketJobs`` runs them in a daemon, made on the first ``job.`` key
(sidecar/admin/jobkeys.py): it follows the view (every change the watch
delivers, and every re-read by the watchdog, handed on by ``JobKeys``), starts a job's loop when
its key appears, restarts it when the job's settings change and ends it when
the key goes (between two claims: a run in flight finishes). A job of the
file always wins over a key of the same name (said once per revision); a
key that is not a valid job is hostile input: counted
(``hostile_input_total{what="job"}``), said, and not run.

``add``, ``update``, ``remove`` and ``listing`` are the one-shot commands
``anarchon-sidecar job ...`` (and the API's).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from sidecar.config.bucketrules import check_headers, check_name_length, check_value_size
from sidecar.config.fields import short, shown_text, type_name
from sidecar.config.job_entry import (
    JOB_KEYS,
    check_fit,
    check_windows,
    parse_claim,
    parse_job,
)
from sidecar.config.keys import JOB_NAME, ConfigSection
from sidecar.config.model import Config, JobConfig, Secrets
from sidecar.core import failpoints
from sidecar.core.clock import rfc3339
from sidecar.core.errors import (
    BucketJobRefused,
    CasConflict,
    ConfigError,
    KeptChanging,
)
from sidecar.core.tasks import TaskSet
from sidecar.core.wire import instance_key
from sidecar.run.since import schedule_hash, since_key
from sidecar.run.since import value_object as since_object
from sidecar.store.kv import create_or_update, delete_at, put_json, put_with_ttl
from sidecar.store.state import (
    BUCKET_SET,
    PRESENCE_TTL,
    READ_TIMEOUT,
    Removal,
    View,
    config_hash,
    decode,
    ensure_bucket,
    job_hash,
    state_spec,
)

if TYPE_CHECKING:
    from sidecar.fleet.member import Fleet
    from sidecar.obs.metrics import Metrics
    from sidecar.run.job_loop import Jobs

log = logging.getLogger(__name__)

PREFIX = "job."
FILE, BUCKET = "file", "bucket"
# Keys of a stored job that are not the job's: the external id, who and when.
META_KEYS = ("id", "by", "at")
MAX_ID = 200
# `job add/update`'s FILE at most: a job is a few hundred bytes.
MAX_JOB_FILE = 64 << 10
# Take-up yields to the event loop after this long (s): a burst of keys never makes
# a slot of the file's jobs late.
SLICE = 0.005
# Take-up waits this long (s) after a change for the others written with it.
GATHER = 0.02
# ``since.<job>``'s why when `job add` bounds the new job's catch-up.
ADDED = "added"


def job_key(name: str) -> str:
    return f"{PREFIX}{name}"


@dataclass(frozen=True, slots=True)
class BucketJob:
    """A valid job of the state bucket: the parsed job, its external id, its definition."""

    job: JobConfig
    id: str
    # The stored mapping without by/at, as canonical JSON: equal means the same job.
    canon: bytes  # canonical(): a digest of the definition


def definition(value: Mapping[str, Any]) -> dict[str, Any]:
    """The stored mapping without ``by``/``at``: what makes two writes the same job."""
    return {k: v for k, v in value.items() if k not in ("by", "at")}


def canonical(value: Mapping[str, Any]) -> bytes:
    """A digest of the job's definition (its sorted JSON): equal for the same job.
    A digest, not the text: 100,000 jobs keep one each (issue 49)."""
    text = json.dumps(definition(value), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


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
    return BucketJob(job, ident, canonical({**data, "id": ident}))


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


# ---------------------------------------------------------------------- the daemon's part


@dataclass(slots=True)
class _Running:
    """A job of the bucket this sidecar runs, and the revision of its key last judged
    (slots: one of these per job, 100,000 of them: issue 49)."""

    spec: BucketJob
    revision: int
    hash: str  # job_hash: the presence's one entry for the set is made of these (``_tell``)


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
        # Names of the job keys beyond bucket_jobs.max_jobs, and the revision of each
        # counted as hostile (once); the keys to say in the take-up's one line.
        self._beyond: set[str] = set()
        self._over: dict[str, int] = {}
        self._over_said: list[str] = []
        self._changed_set = False
        # Jobs taken up in this round and not yet registered (``_flush``).
        self._batch: list[tuple[BucketJob, int]] = []
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
        return BUCKET, running.spec.id if running is not None else None

    def listing(self) -> list[dict[str, Any]]:
        """Every job key of the bucket with its state, as ``status --json`` lists them."""
        return listing(self.config, self.fleet.view, self.file_names)

    # ------------------------------------------------------------------ following the view

    def changed(self, key: str) -> None:
        if key == "":  # a full re-read: every job key, and every job running
            self._dirty.update(
                k[len(PREFIX) :] for k in self.fleet.view.keys if k.startswith(PREFIX)
            )
            self._dirty.update(self.running)
        elif key.startswith(PREFIX):
            self._dirty.add(key[len(PREFIX) :])
        else:
            return
        self._wake.set()

    def removed(self, removal: Removal) -> None:
        if removal.key.startswith(PREFIX):
            self._dirty.add(removal.key[len(PREFIX) :])
            self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            # A burst of keys (thousands written in a second) is taken up in a few
            # rounds, not one round per key: each round looks at every job key.
            await asyncio.sleep(GATHER)
            self._wake.clear()
            self._place()
            names, self._dirty = sorted(self._dirty), set()
            began = loop.time()
            for name in names:
                try:
                    await self._reconcile(name)
                except Exception:  # one job's trouble must not stop the others'
                    log.exception("job %s of the state bucket: taking up its change failed", name)
                if loop.time() - began > SLICE:
                    # Thousands of keys at once: the file's jobs' slots come first,
                    # and a scrape. The slice's jobs are taken up before yielding: at
                    # the round's end, 100,000 jobs' start held the loop for seconds
                    # (docs/PERFORMANCE.md, "100,000 jobs").
                    self._flush()
                    await asyncio.sleep(0)
                    began = loop.time()
            # Not kept while waiting for the next change: a list of every name (a
            # string each, 100,000 of them after the start: issue 49).
            names.clear()
            self._flush()
            self._say_over()
            if self._changed_set:
                self._changed_set = False
                self._tell()

    def _place(self) -> None:
        """Which ``job.`` keys are beyond ``bucket_jobs.max_jobs``: the latest written
        (by revision, the same in every sidecar's view); a key whose place changed
        is taken up again."""
        beyond = beyond_cap(self.fleet.view, self.config.bucket_jobs.max_jobs)
        self._dirty |= beyond ^ self._beyond
        self._beyond = beyond

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
            return current.spec, entry.revision
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
        if current is not None and spec is not None and current.spec.canon == spec.canon:
            current.revision = revision
            self._judged.pop(name, None)  # the running entry says it now
            return
        if current is not None:
            self._flush()  # _retire awaits: no job taken up is left half-registered
            await self._retire(name, current, replaced=spec is not None)
        if spec is not None and not self.jobs.stopping.is_set():
            self._adopt(spec, revision)

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
            self.jobs.start(job)
            self.running[job.name] = _Running(spec, revision, job_hash(job))
            self._judged.pop(job.name, None)  # the running entry says it now
            log.info(
                "job %s (id %s) taken up from the state bucket: %s",
                job.name,
                spec.id,
                job.schedule.identity,
            )
            self._changed_set = True

    async def _retire(self, name: str, current: _Running, replaced: bool) -> None:
        """End the job's loop between two claims; its runs in flight go on (``runs``)."""
        assert self.jobs is not None
        await self.jobs.retire(name)
        del self.running[name]
        if not replaced:
            self._unregister(name)
            # 0: "no next run", which the alert rules leave out (`> 0`).
            self.metrics.job_next_run_timestamp_seconds.labels(job=name).set(0)
            log.info(
                "job %s (id %s) left the state bucket: not run any more", name, current.spec.id
            )
            self._changed_set = True
        else:
            log.info("job %s (id %s) changed in the state bucket", name, current.spec.id)

    def _tell(self) -> None:
        """After a take-up changed the running set: the page's listeners, and the
        presence's one entry for the set (constant in size, sidecar/store/state.py)."""
        for listener in self.listeners:
            listener()
        if self.running:
            # Made from the running entries at each change, not kept as a second map.
            hashes = {name: running.hash for name, running in self.running.items()}
            self.fleet.presence[BUCKET_SET] = {
                "count": len(hashes),
                "hash": config_hash(hashes),
            }
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


# ---------------------------------------------------------------------- one-shot commands


def read_job_file(path: str) -> object:
    """`job add/update`'s FILE: one job as YAML or JSON (``-``: standard input), at
    most MAX_JOB_FILE bytes (``job add /dev/zero`` is refused, not read for ever)."""
    from sidecar.config.yamlfile import read_yaml

    return read_yaml(path, MAX_JOB_FILE, "job", stdin=True)


def prepare(
    config: Config,
    data: object,
    ident: str | None,
    by: str,
    file_names: tuple[str, ...] | frozenset[str] | None = None,
) -> tuple[BucketJob, dict[str, Any]]:
    """Check `data` as the daemon will (exit 2 naming the key), refuse a name the file
    has; the job and the value to store (with id, by, at)."""
    if isinstance(data, dict) and ident is not None:
        data = {**data, "id": ident}
    spec = parse_bucket_job(config, data, "job")
    assert isinstance(data, dict)
    if spec.job.name in (config.job_names if file_names is None else file_names):
        raise ConfigError(
            "job.name",
            f"the config file has a job {spec.job.name!r}: it wins over a job of the state "
            "bucket of the same name, which would never run",
        )
    value = {**data, "id": spec.id, "by": by, "at": rfc3339(time.time())}
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError("job", f"not representable as JSON: {exc}") from None
    check_value_size(config.bucket_jobs, value, "job")  # with by and at, as stored
    return spec, value


@dataclass(frozen=True)
class Written:
    """What `job add/update/remove` did: ``created``, ``updated``, ``unchanged``, ``removed``."""

    name: str
    id: str
    what: str
    revision: int = 0


@contextlib.asynccontextmanager
async def state_kv(config: Config, secrets: Secrets, create: bool) -> AsyncIterator[Any]:
    """The state bucket's KeyValue (created when missing if `create`; else None when
    missing), on a connection of its own."""
    from sidecar.store.connection import connected
    from sidecar.store.connection import one_shot_js as _js

    async with connected(config, secrets) as conn:
        js = _js(conn)
        if create:
            yield (await ensure_bucket(js, state_spec(config))).kv
            return
        try:
            kv = await js.key_value(state_spec(config).bucket)
        except (BucketNotFoundError, NotFoundError):
            kv = None
        yield kv


async def stored_job(kv: Any, key: str) -> tuple[dict[str, Any], int] | None:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    if entry.value is None or entry.operation is not None:
        return None
    return decode(entry.value), int(entry.revision)


async def add(config: Config, secrets: Secrets, spec: BucketJob, value: dict[str, Any]) -> Written:
    """`job add`: ``add_in`` on a connection of its own (the bucket made when missing)."""
    async with state_kv(config, secrets, create=True) as kv:
        return await add_in(kv, spec, value, config.bucket_jobs.max_jobs)


async def count_jobs(kv: Any) -> int:
    """How many ``job.<name>`` keys the bucket holds (their values not fetched)."""
    watcher = await kv.watch(f"{PREFIX}>", ignore_deletes=True, meta_only=True)
    count = 0
    try:
        while await watcher.updates(timeout=READ_TIMEOUT) is not None:
            count += 1
    finally:
        await watcher.stop()
    return count


async def create_job(kv: Any, spec: BucketJob, value: dict[str, Any]) -> int:
    """Create ``job.<name>`` (CasConflict when it was written meanwhile); its revision.

    First the catch-up bound (sidecar/run/since.py): a job that is new, or removed
    and added again, never catches up a slot from before now. `job add` and
    `job import` both create through here."""
    name = spec.job.name
    now_ms = round(time.time() * 1000)
    await put_json(kv, since_key(name), since_object(now_ms, ADDED, schedule_hash(spec.job)))
    if failpoints.ENABLED:
        await failpoints.hit("cas.before_write")
    return await create_or_update(kv, job_key(name), value, None)


async def add_in(kv: Any, spec: BucketJob, value: dict[str, Any], max_jobs: int) -> Written:
    """Store ``job.<name>`` when absent; the same job with the same id again: unchanged.
    A new job when the bucket already holds `max_jobs`: ConfigError naming the limit."""
    name = spec.job.name
    key = job_key(name)
    for _ in range(3):
        now = await stored_job(kv, key)
        if now is not None:
            stored, revision = now
            if str(stored.get("id", name)) != spec.id:
                raise BucketJobRefused(
                    f"{name}: the state bucket has this job with id "
                    f"{short(stored.get('id'))}, not {short(spec.id)}: not added"
                )
            if canonical(stored) == spec.canon:
                return Written(name, spec.id, "unchanged", revision)
            raise BucketJobRefused(
                f"{name}: the state bucket has this job (id {short(spec.id)}) with other "
                "settings: `job update` changes it"
            )
        held = await count_jobs(kv)
        if held >= max_jobs:
            raise ConfigError(
                "bucket_jobs.max_jobs",
                f"the state bucket holds {held} jobs, the most the config file allows "
                f"({max_jobs}): {name} not added (`job remove` one, or raise the limit)",
            )
        try:
            revision = await create_job(kv, spec, value)
        except CasConflict:
            continue  # written meanwhile: read again
        return Written(name, spec.id, "created", revision)
    raise KeptChanging(key, 3)


async def update(
    config: Config, secrets: Secrets, spec: BucketJob, value: dict[str, Any], id_given: bool
) -> Written:
    """`job update`: ``update_in`` on a connection of its own."""
    async with state_kv(config, secrets, create=False) as kv:
        return await update_in(kv, spec, value, id_given)


async def update_in(kv: Any, spec: BucketJob, value: dict[str, Any], id_given: bool) -> Written:
    """Replace ``job.<name>`` by compare-and-set; BucketJobRefused when absent, or held
    by another id when one was given."""
    name = spec.job.name
    key = job_key(name)
    if kv is None:
        raise BucketJobRefused(
            f"{name}: no such job in the state bucket (`job add` adds it)", missing=True
        )
    for _ in range(3):
        now = await stored_job(kv, key)
        if now is None:
            raise BucketJobRefused(
                f"{name}: no such job in the state bucket (`job add` adds it)", missing=True
            )
        stored, revision = now
        stored_id = str(stored.get("id", name))
        if id_given and stored_id != spec.id:
            raise BucketJobRefused(
                f"{name}: the state bucket has this job with id {short(stored_id)}, "
                f"not {short(spec.id)}: not updated"
            )
        if not id_given:  # the id stays the stored one
            value = {**value, "id": stored_id}
            spec = dataclasses.replace(spec, id=stored_id, canon=canonical(value))
        if canonical(stored) == spec.canon:
            return Written(name, spec.id, "unchanged", revision)
        if failpoints.ENABLED:
            await failpoints.hit("cas.before_write")
        try:
            revision = await create_or_update(kv, key, value, revision)
        except CasConflict:
            continue
        return Written(name, spec.id, "updated", revision)
    raise KeptChanging(key, 3)


async def remove(config: Config, secrets: Secrets, name: str, ident: str | None) -> Written:
    """`job remove`: ``remove_in`` on a connection of its own."""
    async with state_kv(config, secrets, create=False) as kv:
        return await remove_in(kv, name, ident)


async def remove_in(kv: Any, name: str, ident: str | None) -> Written:
    """Delete ``job.<name>`` (only if its id is `ident`, when given)."""
    key = job_key(name)
    now = await stored_job(kv, key) if kv is not None else None
    if now is None:
        raise BucketJobRefused(f"{name}: no such job in the state bucket", missing=True)
    stored, revision = now
    stored_id = str(stored.get("id", name))
    if ident is not None and stored_id != ident:
        raise BucketJobRefused(
            f"{name}: the state bucket has this job with id {short(stored_id)}, "
            f"not {short(ident)}: not removed"
        )
    try:
        await delete_at(kv, key, revision)
    except CasConflict:
        raise BucketJobRefused(f"{name}: changed meanwhile; not removed") from None
    return Written(name, stored_id, "removed", revision)


API_ACTIONS = ("add", "update", "remove")


async def api_action(
    config: Config,
    file_names: frozenset[str],
    kv: Any,
    name: str,
    action: str,
    body: bytes,
    who: str,
) -> tuple[int, dict[str, Any]]:
    """``POST /api/v1/bucket-jobs/<name>/{add,update,remove}`` (admin token): the body is
    the job as JSON (``id`` included) for add and update, ``{"id": ...}`` or nothing
    for remove; the same checks and answers as the commands'."""
    try:
        data = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        return 400, {"error": "the body must be a JSON object"}
    if not isinstance(data, dict):
        return 400, {"error": "the body must be a JSON object"}
    try:
        if action == "remove":
            ident = data.get("id")
            if ident is not None:
                try:
                    ident = external_id(ident, "id")
                except ConfigError as exc:
                    return 400, {"error": f"config error: {exc}", "key": exc.key}
            done = await remove_in(kv, name, ident)
        else:
            if data.get("name", name) != name:
                return 400, {"error": f"job.name: must be {name!r}, the job of the URL"}
            data = {**data, "name": name}
            try:
                spec, value = prepare(config, data, None, who, file_names)
            except ConfigError as exc:
                return 400, {"error": f"config error: {exc}", "key": exc.key}
            if action == "add":
                try:
                    done = await add_in(kv, spec, value, config.bucket_jobs.max_jobs)
                except ConfigError as exc:
                    return 400, {"error": f"config error: {exc}", "key": exc.key}
            else:
                done = await update_in(kv, spec, value, data.get("id") is not None)
    except BucketJobRefused as exc:
        return (404 if exc.missing else 409), {"error": str(exc)}
    log.info("fleet page: job %s of the state bucket: %s by %s", name, done.what, who)
    return 200, {"name": done.name, "id": done.id, "result": done.what}


def listing(
    config: Config, view: View, file_names: frozenset[str] | None = None
) -> list[dict[str, Any]]:
    """Every ``job.<name>`` key of `view`: name, id, state (``run``, ``shadowed`` by the
    file, ``invalid``, beyond the cap included) and why, as ``status`` and ``job list``
    show them."""
    out = []
    beyond = beyond_cap(view, config.bucket_jobs.max_jobs)
    for key in sorted(k for k in view.keys if k.startswith(PREFIX)):
        name = key[len(PREFIX) :]
        value = view.keys[key].value
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
        else:
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


async def read_job(
    config: Config, secrets: Secrets, name: str
) -> tuple[JobConfig | None, tuple[str, ...]]:
    """A job the config file does not name, as the fleet runs it from ``job.<name>``
    (for `pause`, `skip`, `at`, `run-now`, `backfill`): the job and no names; or
    None and the names of the bucket's jobs (for the closest name). ConfigError
    naming the key when it holds no valid job (the fleet does not run it either)."""
    async with state_kv(config, secrets, create=False) as kv:
        found = await stored_job(kv, job_key(name)) if kv is not None else None
    if found is not None:
        return judge(config, job_key(name), found[0]).job, ()
    if kv is None:
        return None, ()
    # Only on a mistake: every job key read, to name the closest.
    return None, tuple(item["name"] for item in await read_listing(config, secrets))


async def read_listing(config: Config, secrets: Secrets) -> list[dict[str, Any]]:
    """`job list`: every job key of the state bucket, judged as a sidecar judges it."""
    from sidecar.store.connection import connected
    from sidecar.store.connection import one_shot_js as _js
    from sidecar.store.state import read_view

    async with connected(config, secrets) as conn:
        view = await read_view(_js(conn), config)
    return listing(config, view) if view is not None else []
