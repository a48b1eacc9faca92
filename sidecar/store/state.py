"""The fleet's state bucket (docs/CONFIG.md) and one sidecar's in-memory view of it.

The bucket is a NATS KV bucket, ``nats.state_bucket`` (default
``<stream>_STATE``): history 1, file storage, replicas as the stream's, with
``limit_marker_ttl`` so that keys written with a TTL leave a ``MaxAge``
marker when they expire. It is created on start like the stream; an existing
bucket is used as it is (docs/CONFIG.md, `state_bucket`: adding a marker TTL in place once stopped
keys expiring), and one without TTL support turns off the features that need
it with one clear line.

Keys used here: ``paused.<job>`` (pause/resume) and ``instance.<id>``
(presence, TTL). ``View`` is fed by one watch of the whole bucket
(sidecar/store/watch.py, with its watchdog); every feature reads the view in
memory, so a claim never waits for NATS because of it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    BucketNotFoundError,
    KeyValueLimitMarkerTTLNotSupportedError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from sidecar.core.natspy import read_initial
from sidecar.core.wire import decode as decode  # re-exported
from sidecar.core.wire import paused_key
from sidecar.store.bucketcheck import StateSpec, facts_of
from sidecar.store.digests import BUCKET_PREFIX
from sidecar.store.keyfamilies import family_of
from sidecar.when.attempts import is_lease_key

if TYPE_CHECKING:
    from sidecar.config.load import Config

log = logging.getLogger(__name__)

# Presence: the key lives this long after its last renewal.
PRESENCE_TTL = 15.0
PRESENCE_RENEW = 5.0
MIN_SERVER_FOR_TTL = "2.11"


def state_spec(config: Config) -> StateSpec:
    n = config.nats
    return StateSpec(n.state_bucket, n.replicas or 1, max(60.0, n.duplicate_window))


@dataclass
class Bucket:
    """The opened bucket and whether it gives per-message TTLs."""

    kv: KeyValue
    spec: StateSpec
    ttl: bool
    ttl_problem: str | None = None


async def ensure_bucket(js: JetStreamContext, spec: StateSpec) -> Bucket:
    """Open the bucket, creating it when missing; never changes an existing one."""
    try:
        kv = await js.key_value(spec.bucket)
    except (BucketNotFoundError, NotFoundError):
        return await _create(js, spec)
    info = await js.stream_info(spec.stream)
    facts = facts_of(info)
    ttl = facts.msg_ttl and facts.marker_ttl is not None
    problem = None
    if not ttl:
        # Only what is missing is named: the marker TTL alone, or both.
        missing = [
            name
            for name, absent in (
                ("per-message TTLs (allow_msg_ttl)", not facts.msg_ttl),
                ("a marker TTL (subject_delete_marker_ttl)", facts.marker_ttl is None),
            )
            if absent
        ]
        problem = (
            f"state bucket {spec.bucket} was made without {' and '.join(missing)}: instance "
            "presence, run leases and retries are off, and jobs that need leases "
            "(overlap: skip, retry, on_lost: rerun) are not claimed; delete the bucket "
            f"(nats kv del {spec.bucket}) while no sidecar runs to let them create it right"
        )
    return Bucket(kv, spec, ttl, problem)


async def _create(js: JetStreamContext, spec: StateSpec) -> Bucket:
    config = KeyValueConfig(
        bucket=spec.bucket,
        history=1,
        storage=StorageType.FILE,
        replicas=spec.replicas,
        limit_marker_ttl=spec.marker_ttl,
    )
    try:
        kv = await js.create_key_value(config)
    except KeyValueLimitMarkerTTLNotSupportedError:
        kv = await js.create_key_value(
            KeyValueConfig(
                bucket=spec.bucket, history=1, storage=StorageType.FILE, replicas=spec.replicas
            )
        )
        return Bucket(
            kv,
            spec,
            False,
            f"this NATS server has no per-message TTLs (needs nats-server "
            f"{MIN_SERVER_FOR_TTL} or later): instance presence, run leases (overlap: skip "
            "runs as allow, no lost runs) and retries are off; pause works",
        )
    log.info("created state bucket %s (replicas %d)", spec.bucket, spec.replicas)
    return Bucket(kv, spec, True)


# ---------------------------------------------------------------------- the view


# The bytes of a ``job.<name>`` key whose job is parsed and running (``View.hold``):
# its runner holds what it needs of them; the view keeps the revision only. Told by
# identity (no value the watch delivers is this object).
HELD = b"(held by the job's runner)"


class Entry:
    """A key's value as the view holds it, and its revision.

    A ``job.<name>`` key (a job of the state bucket) keeps its bytes and is
    decoded when read: 100,000 decoded job values were about 860 B a job, their
    bytes about 200 (issue 49); they are read when a job changes or ``status``
    lists them, not per slot. Once its job is parsed and running, not even the
    bytes (``View.hold``): ``held`` is true, ``value`` is empty, and the job's
    running entry keeps what the listing shows of it (sidecar/admin/bucket_jobs.py)."""

    __slots__ = ("_value", "raw", "revision")

    def __init__(
        self, value: dict[str, Any] | None, revision: int, raw: bytes | None = None
    ) -> None:
        self._value = value
        self.revision = revision
        self.raw = raw

    @property
    def held(self) -> bool:
        """Whether the value's bytes were let go (``View.hold``)."""
        return self.raw is HELD

    @property
    def value(self) -> dict[str, Any]:
        if self._value is not None:
            return self._value
        return {} if self.raw is HELD else decode(self.raw)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Entry):
            return NotImplemented
        if self.held or other.held:
            # A revision is one message of the bucket's stream: the same revision of
            # a key is the same value.
            return self.revision == other.revision
        return (self.value, self.revision) == (other.value, other.revision)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if self.held:
            return f"Entry(held, {self.revision})"
        return f"Entry({self.value!r}, {self.revision})"


# How a key went away: an explicit delete, or its TTL ran out (a MaxAge
# marker, which nats-py reports as a purge). None: not known (it vanished
# between two re-syncs and its marker is gone).
DELETED = "DEL"
EXPIRED = "PURGE"
# The bucket was deleted (and made again) under the watch: its keys vanished
# without a marker. A lease gone so is judged after lease_ttl (LostRuns).
BUCKET_REPLACED = "REPLACED"
# A lease whose end a full re-read did not see (sidecar/store/watch.py): taken
# again by another run meanwhile. Whether its run ended with a result or not
# (an expiry, or a release), the lost-run judges look.
UNSEEN = "UNSEEN"


@dataclass(frozen=True)
class Removal:
    """A key that left the view: its last value, how it went and when (epoch s)."""

    key: str
    entry: Entry
    how: str | None
    at: float | None


# Keys whose past values decide a slot (pause, skip): the view keeps a short
# timeline of their changes, by the server's time (``View.at_instant``).
TIMELINE_PREFIXES = ("paused.", "skip.")
# A timeline keeps at most this many changes of one key.
TIMELINE_MAX = 64


@dataclass
class View:
    """The bucket's live keys, as one watch delivered them."""

    keys: dict[str, Entry] = field(default_factory=dict)
    last_revision: int = 0
    # The newest server timestamp (epoch s) of anything the watch delivered: every
    # change stored before it has been delivered too (the stream's order).
    last_time: float = 0.0
    # Per ``paused.``/``skip.`` key: (server time, value or None when deleted), oldest
    # first, for the last ``keep_seconds`` (and the last change before that).
    timelines: dict[str, list[tuple[float, dict[str, Any] | None]]] = field(default_factory=dict)
    keep_seconds: float = 120.0
    synced: bool = False
    # Whether a watch is following the bucket now: False from the moment one stops
    # or fails (a re-read after a reconnect or a stall) until the next full read is
    # in. The view is then whole only up to ``last_time``; a slot after it waits for
    # the read (sidecar/fleet/freshness.py ``view_at``).
    following: bool = False
    # Called with the key after every change the watch delivers.
    on_change: Callable[[str], None] | None = None
    # Called with every key that left the view, with its last value.
    on_removed: Callable[[Removal], None] | None = None
    # Called with (key, revision) for a value of a key no family claims
    # (sidecar/store/keyfamilies.py): it is not kept, and nothing else hears of it.
    on_unknown: Callable[[str, int], None] | None = None
    # Called whenever ``last_revision`` moves: every entry the watch delivers,
    # even one that changes no key (a delete of a key the view did not hold),
    # and every re-sync (sidecar/store/watch.py).
    on_delivered: Callable[[], None] | None = None
    # The markers (how, when) the watch delivered, by key: a re-sync tells
    # from them whether a key that vanished expired or was deleted.
    # Kept only by the fresh view of a re-sync (the live one would grow).
    markers: dict[str, tuple[str | None, float | None]] = field(default_factory=dict)
    keep_markers: bool = False
    # The revision of the last marker of each ``lock.*`` key (one per job):
    # taking the lock again expects it, one request instead of three.
    lock_markers: dict[str, int] = field(default_factory=dict)
    # One ``jobs`` mapping per distinct setting, shared by the instances (_shared_jobs).
    _jobs_seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Changes when an instance appears, leaves or changes its presence, and on a
    # full re-read (watch.py); not when it renews the same presence (every 5 s
    # each): what is counted from the instances is counted again only then.
    presence_generation: int = 0
    # ``instances()`` as of a presence_generation (``presences``).
    _presences: tuple[int, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: (-1, {}), repr=False
    )
    # hash() of each instance key's last value: a renewal is not decoded again.
    # (64 bits: a change colliding with the old bytes is not a practical risk,
    # and whoever can write the bucket can write any presence anyway.)
    _presence_hash: dict[str, int] = field(default_factory=dict)
    # Timeline keys known absent before their first change (created while watched).
    _absent_before: dict[str, bool] = field(default_factory=dict)

    def paused(self, job: str) -> Entry | None:
        return self.keys.get(paused_key(job))

    def at_instant(self, key: str, instant: float) -> tuple[bool, dict[str, Any] | None]:
        """(known, value) of `key` as the bucket held it at server time `instant`.

        A change stored at or after `instant` does not apply; one stored before
        does. Not known when the timeline starts after `instant` with a change
        (what was there before it is forgotten): the caller decides then.
        """
        timeline = self.timelines.get(key)
        if not timeline:
            entry = self.keys.get(key)  # never changed while watched (or no time known)
            return True, entry.value if entry is not None else None
        value: dict[str, Any] | None = None
        known = timeline[0][0] < instant or self._absent_before.get(key, False)
        for at, v in timeline:
            if at >= instant:
                break
            value = v
        return known, value

    def reread(self, key: str, timeline: list[tuple[float, dict[str, Any] | None]]) -> None:
        """A timeline key as a re-read of the bucket shows it (sidecar/store/watch.py).

        Unchanged while the watch was away (the re-read's change is the last one
        known, or older): the timeline goes on as it was. Changed: it may have
        changed more than once (the bucket keeps one value a key), so the
        timeline starts again at the re-read's change and the instants before it
        are not known here (``at_instant``); such a slot is left to the sidecars
        whose view knows it.
        """
        known = self.timelines.get(key)
        if not timeline or (known and timeline[-1][0] <= known[-1][0]):
            return
        self.timelines[key] = list(timeline)
        self._absent_before.pop(key, None)

    def _note(self, key: str, at: float, value: dict[str, Any] | None) -> None:
        """One change of a timeline key, at server time `at` (watch order)."""
        timeline = self.timelines.setdefault(key, [])
        if timeline and at < timeline[-1][0]:
            return  # older than what is known (a re-read): already in the timeline
        if timeline and timeline[-1] == (at, value):
            return
        timeline.append((at, value))
        horizon = at - self.keep_seconds
        drop = 0
        while drop + 1 < len(timeline) and timeline[drop + 1][0] <= horizon:
            drop += 1
        drop = max(drop, len(timeline) - TIMELINE_MAX)
        if drop:
            del timeline[:drop]
            self._absent_before.pop(key, None)

    def hold(self, key: str, revision: int) -> None:
        """The job of ``job.<name>`` key `key` at `revision` is parsed and running: its
        bytes are let go (about 170 B a job at 100,000 jobs, issue 49). A later value
        of the key comes with its bytes again, and a re-read brings them all back
        until their jobs are judged again."""
        entry = self.keys.get(key)
        if entry is not None and entry.revision == revision and entry.raw is not None:
            entry.raw = HELD

    def instances(self) -> dict[str, dict[str, Any]]:
        return {
            key[len("instance.") :]: entry.value
            for key, entry in self.keys.items()
            if key.startswith("instance.")
        }

    def presences(self) -> dict[str, dict[str, Any]]:
        """``instances()`` read again only when they changed (``presence_generation``):
        for what asks per slot or per lease (each read walks every key; a burst of
        10,000 jobs with claim candidates read it 10,000 times). Not to be changed."""
        generation, instances = self._presences
        if generation != self.presence_generation:
            instances = self.instances()
            self._presences = (self.presence_generation, instances)
        return instances

    def leases(self) -> dict[str, Entry]:
        """The live ``run.*`` and ``lock.*`` keys: runs holding a lease now."""
        return {k: e for k, e in self.keys.items() if is_lease_key(k)}

    def apply(
        self,
        key: str,
        value: bytes | None,
        revision: int,
        deleted: bool,
        how: str | None = None,
        at: float | None = None,
    ) -> None:
        self.last_revision = max(self.last_revision, revision)
        if self.on_delivered is not None:
            self.on_delivered()
        if family_of(key) is None:  # ignored: no part of the sidecar acts on it
            if not deleted and self.on_unknown is not None:
                self.on_unknown(key, revision)
            return
        if at is not None:
            self.last_time = max(self.last_time, at)
            if key.startswith(TIMELINE_PREFIXES):
                if key not in self.timelines and key not in self.keys and self.synced:
                    self._absent_before[key] = True  # made while watched: nothing before
                self._note(key, at, None if deleted else decode(value))
        if key.startswith("lock."):
            if deleted:
                self.lock_markers[key] = revision
            else:
                self.lock_markers.pop(key, None)
        if deleted:
            if self.keep_markers:
                self.markers[key] = (how, at)
            old = self.keys.pop(key, None)
            if old is None:
                return
            if self._presence_hash.pop(key, None) is not None:
                self.presence_generation += 1
            if self.on_removed is not None:
                self.on_removed(Removal(key, old, how, at))
        elif key.startswith("instance."):
            self._apply_presence(key, value or b"", revision)
        elif key.startswith(BUCKET_PREFIX):
            self.keys[key] = Entry(None, revision, bytes(value or b""))
        else:
            self.keys[key] = Entry(decode(value), revision)
        if self.on_change is not None:
            self.on_change(key)

    def _apply_presence(self, key: str, value: bytes, revision: int) -> None:
        """An instance key: a renewal of the same presence keeps the decoded one.

        A hundred replicas renew every 5 s: each sidecar would otherwise decode
        twenty presences a second, each as long as its list of jobs (about 5 ms
        with 10,000 jobs), and count the fleet again after each.
        """
        digest = hash(value)
        old = self.keys.get(key)
        if old is not None and self._presence_hash.get(key) == digest:
            self.keys[key] = Entry(old.value, revision)
            return
        self.keys[key] = Entry(self._shared_jobs(decode(value)), revision)
        self._presence_hash[key] = digest
        self.presence_generation += 1

    def _shared_jobs(self, data: dict[str, Any]) -> dict[str, Any]:
        """Instances with the same job settings share one ``jobs`` mapping.

        A hundred replicas of a thousand jobs would otherwise keep a hundred
        copies of the same thousand hashes (about 15 MiB), and comparing them
        would walk every copy.
        """
        jobs = data.get("jobs")
        if isinstance(jobs, dict):
            canon = json.dumps(jobs, sort_keys=True)
            data["jobs"] = self._jobs_seen.setdefault(canon, jobs)
            if len(self._jobs_seen) > 64:  # bounded: forget all but the ones in use
                used = {id(e.value.get("jobs")) for e in self.keys.values()}
                self._jobs_seen = {k: v for k, v in self._jobs_seen.items() if id(v) in used}
                self._jobs_seen[canon] = data["jobs"]
        return data

    def apply_entry(self, entry: Any) -> None:
        """Apply a nats-py ``KeyValue.Entry`` as a watch delivered it."""
        created = getattr(entry, "created", None)
        at = created.timestamp() if isinstance(created, datetime) else None
        how = entry.operation
        if how is None and not entry.value and is_lease_key(str(entry.key)):
            # A lease is never written empty: a client that reports the
            # server's MaxAge marker as a put (nats-io/nats.py#966) gives this.
            how = EXPIRED
        self.apply(entry.key, entry.value, int(entry.revision or 0), how is not None, how, at)


def bucket_job_names(view: View) -> set[str]:
    """The names of the view's ``job.<name>`` keys: the jobs of the state bucket an
    instance with a ``bucket_jobs`` entry in its presence runs."""
    return {k[len(BUCKET_PREFIX) :] for k in view.keys if k.startswith(BUCKET_PREFIX)}


# A one-shot read of the whole bucket (status, job list) waits this long per entry.
READ_TIMEOUT = 10.0


async def read_view(
    js: JetStreamContext, config: Config, seen: dict[str, float] | None = None
) -> View | None:
    """Every live key of the state bucket; None when the bucket does not exist yet.

    `seen` gets when each ``instance.<id>`` key was last written (epoch s).
    """
    try:
        kv = await js.key_value(state_spec(config).bucket)
    except (BucketNotFoundError, NotFoundError):
        return None
    view = View()

    def take(entry: KeyValue.Entry) -> None:
        view.apply_entry(entry)
        created = getattr(entry, "created", None)
        if seen is not None and str(entry.key).startswith("instance.") and created:
            seen[str(entry.key)[len("instance.") :]] = created.timestamp()

    watcher = await kv.watchall()
    try:
        await read_initial(watcher, take, READ_TIMEOUT)
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    view.synced = True
    return view
