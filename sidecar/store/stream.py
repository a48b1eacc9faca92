"""The JetStream stream: create it, raise it (``desired_update``), read it, lower it.

Create when missing: subjects ``<prefix>>``, the duplicate window, one history
size per subject (``max_msgs_per_subject``), replicas as configured or 1.
When it exists, the stream is shared with every other instance (and maybe
other schedulers), so it is only ever strengthened: the window, the
per-subject limit and the replicas are raised to what this config needs and
never lowered (lowering is ``lower_stream``, an explicit act of the CLI),
``<prefix>>`` is added to its subjects, and everything else is kept. The
window cannot pass the stream's ``max_age``, which is someone else's choice
and stays as it is.

Whether the stream holds a job's claims and what a raise would leave (the
pure rules: ``coverage``, ``covers``, ``raised_state``) are in
sidecar/store/streamfit.py.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from nats.js import JetStreamContext
from nats.js.api import Placement, StreamConfig, StreamInfo
from nats.js.errors import APIError, NotFoundError

from sidecar.config.fields import format_duration
from sidecar.core.errors import StreamConflict, StreamError, StreamNotFound, StreamNotRaised
from sidecar.core.natspy import api_prefix, connection_of
from sidecar.core.wire import (
    ERR_REPLICAS_NOT_SUPPORTED,
    ERR_STREAM_NAME_IN_USE,
    ERR_STREAM_NOT_FOUND,
    ERR_SUBJECTS_OVERLAP,
    TRANSIENT,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from nats.aio.client import Client as NATS

    from sidecar.config.load import Config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamSpec:
    """What the sidecar needs of the stream."""

    name: str
    prefix: str
    duplicate_window: float  # seconds
    history_size: int
    replicas: int | None
    placement_cluster: str | None = None
    placement_tags: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        return f"{self.prefix}>"


def _raised_history(current: int, wanted: int) -> int:
    """The larger per-subject limit; <= 0 means unlimited, which nothing raises."""
    if current <= 0:
        return current
    return max(current, wanted)


def desired_update(current: StreamConfig, spec: StreamSpec) -> StreamConfig | None:
    """The strengthened config for an existing stream, or None when it already fits.

    Window, per-subject limit and replicas only go up; the window stops at the
    stream's max_age (the server refuses more, err 10052).
    """
    subjects = list(current.subjects or [])
    if spec.subject not in subjects:
        subjects.append(spec.subject)
    current_window = float(current.duplicate_window or 0)
    window = max(current_window, spec.duplicate_window)
    max_age = float(current.max_age or 0)
    if max_age > 0:
        window = max(current_window, min(window, max_age))
    history = _raised_history(int(current.max_msgs_per_subject), spec.history_size)
    replicas = int(current.num_replicas or 1)
    if spec.replicas is not None:
        replicas = max(replicas, spec.replicas)
    same = (
        subjects == list(current.subjects or [])
        and abs(current_window - window) < 1e-9
        and int(current.max_msgs_per_subject) == history
        and replicas == int(current.num_replicas or 1)
    )
    if same:
        return None
    return replace(
        current,
        subjects=subjects,
        duplicate_window=window,
        max_msgs_per_subject=history,
        num_replicas=replicas,
    )


def stream_spec(config: Config) -> StreamSpec:
    """The stream a config asks for, with the effective history size."""
    n = config.nats
    place = n.placement
    return StreamSpec(
        n.stream,
        n.prefix,
        n.duplicate_window,
        config.effective_history_size,
        n.replicas,
        place.cluster if place else None,
        place.tags if place else (),
    )


@dataclass(frozen=True)
class StreamState:
    """Settings and state of the stream, as `stream` prints them."""

    name: str
    subjects: tuple[str, ...]
    duplicate_window: float
    history_size: int
    replicas: int
    messages: int
    bytes: int
    first_seq: int
    last_seq: int
    storage: str
    leader: str | None
    max_age: float = 0.0  # seconds; 0 is no limit
    created: float | None = None  # epoch seconds
    cluster: str | None = None  # the cluster the stream lives in
    placement: dict[str, Any] | None = None  # as configured on the stream
    domain: str | None = None  # the JetStream domain that answered (set by the caller)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "subjects": list(self.subjects),
            "duplicate_window_seconds": self.duplicate_window,
            "history_size": self.history_size,
            "replicas": self.replicas,
            "messages": self.messages,
            "bytes": self.bytes,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "storage": self.storage,
            "leader": self.leader,
            "max_age_seconds": self.max_age,
            "created": self.created,
            "domain": self.domain,
            "cluster": self.cluster,
            "placement": self.placement,
        }


def state_of(info: StreamInfo) -> StreamState:
    cfg, st = info.config, info.state
    # nats-py leaves the storage type as the server's string in parsed configs.
    storage = getattr(cfg.storage, "value", cfg.storage) or "file"
    return StreamState(
        name=cfg.name or "",
        subjects=tuple(cfg.subjects or ()),
        duplicate_window=float(cfg.duplicate_window or 0),
        history_size=int(cfg.max_msgs_per_subject),
        replicas=int(cfg.num_replicas or 1),
        messages=int(st.messages),
        bytes=int(st.bytes),
        first_seq=int(st.first_seq),
        last_seq=int(st.last_seq),
        storage=str(storage),
        leader=info.cluster.leader if info.cluster else None,
        max_age=float(cfg.max_age or 0),
        created=info.created.timestamp() if info.created else None,
        cluster=info.cluster.name if info.cluster else None,
        placement=(
            {"cluster": cfg.placement.cluster, "tags": list(cfg.placement.tags or [])}
            if cfg.placement
            else None
        ),
    )


def _translate(exc: Exception, action: str, spec: StreamSpec) -> StreamError:
    if isinstance(exc, APIError):
        if exc.err_code == ERR_STREAM_NOT_FOUND:
            return StreamNotFound(f"stream {spec.name} does not exist")
        if exc.err_code == ERR_REPLICAS_NOT_SUPPORTED or (
            exc.description and "replicas > 1" in exc.description
        ):
            return StreamError(
                f"cannot {action} stream {spec.name} with replicas={spec.replicas}: "
                f"this NATS server is not clustered ({exc.description}); "
                "set nats.replicas to 1 or remove it"
            )
        return StreamError(
            f"cannot {action} stream {spec.name}: {exc.description} (err_code {exc.err_code})"
        )
    return StreamError(f"cannot {action} stream {spec.name}: {type(exc).__name__} {exc}")


async def ensure_stream(
    js: JetStreamContext,
    spec: StreamSpec,
    on_raise: Callable[[StreamState | None], None] | None = None,
) -> StreamState:
    """Create the stream or strengthen an existing one; return its state.

    Raises StreamConflict when another stream captures our subjects,
    StreamError for what else JetStream refuses, and lets TRANSIENT errors
    (JetStream not ready yet) through for the caller's backoff. Never recurses:
    a create that loses a race with another instance's create reads and
    updates once, and a second race is the caller's retry. `on_raise` is
    called with the state before, when an existing stream had to be raised.
    """
    for _ in range(2):
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError as exc:
            if exc.err_code not in (ERR_STREAM_NOT_FOUND, None):
                raise _translate(exc, "read", spec) from exc
            created = await _create(js, spec)
            if created is not None:
                return created
            continue  # created by another instance meanwhile: read it again
        except TRANSIENT:
            raise
        except APIError as exc:
            raise _translate(exc, "read", spec) from exc
        return await _strengthen(js, spec, info, on_raise)
    raise StreamError(f"stream {spec.name} was created and removed while it was being set up")


async def _strengthen(
    js: JetStreamContext,
    spec: StreamSpec,
    info: StreamInfo,
    on_raise: Callable[[StreamState | None], None] | None,
) -> StreamState:
    update = desired_update(info.config, spec)
    if update is None:
        return state_of(info)
    if on_raise is not None:
        on_raise(state_of(info))
    cur = info.config
    log.warning(
        "raising stream %s to what this config needs: subjects=%s duplicate_window %s -> %s, "
        "history_size %s -> %s, replicas %s -> %s",
        spec.name,
        update.subjects,
        format_duration(float(cur.duplicate_window or 0)),
        format_duration(float(update.duplicate_window or 0)),
        cur.max_msgs_per_subject,
        update.max_msgs_per_subject,
        cur.num_replicas,
        update.num_replicas,
    )
    try:
        return state_of(await js.update_stream(update))
    except APIError as exc:
        if exc.err_code == ERR_SUBJECTS_OVERLAP:
            raise await _conflict(js, spec) from exc
        why = str(_translate(exc, "update", spec))
        raise StreamNotRaised(why, state_of(info)) from exc
    except TRANSIENT as exc:
        # The stream answered its info a moment ago: an update with no answer
        # is most often one this NATS user may not make (a denied request
        # gets none). The stream is judged as it is.
        why = f"cannot update stream {spec.name}: no answer ({type(exc).__name__})"
        raise StreamNotRaised(why, state_of(info)) from exc


async def _create(js: JetStreamContext, spec: StreamSpec) -> StreamState | None:
    """The created stream's state; None when another instance created it first."""
    config = StreamConfig(
        name=spec.name,
        subjects=[spec.subject],
        duplicate_window=spec.duplicate_window,
        max_msgs_per_subject=spec.history_size,
        num_replicas=spec.replicas or 1,
        placement=(
            Placement(cluster=spec.placement_cluster, tags=list(spec.placement_tags) or None)
            if spec.placement_cluster or spec.placement_tags
            else None
        ),
    )
    try:
        created = state_of(await js.add_stream(config))
    except TRANSIENT:
        raise
    except APIError as exc:
        if exc.err_code == ERR_STREAM_NAME_IN_USE:
            return None
        if exc.err_code == ERR_SUBJECTS_OVERLAP:
            raise await _conflict(js, spec) from exc
        raise _translate(exc, "create", spec) from exc
    log.info(
        "created stream %s: subjects=%s duplicate_window=%s history_size=%d replicas=%d",
        spec.name,
        list(created.subjects),
        format_duration(created.duplicate_window),
        created.history_size,
        created.replicas,
    )
    return created


async def create_if_missing(js: JetStreamContext, spec: StreamSpec) -> StreamState:
    """The stream as it is; created when missing, never changed when it exists."""
    for _ in range(2):
        try:
            return await read_stream(js, spec)
        except StreamNotFound:
            created = await _create(js, spec)
            if created is not None:
                return created
    return await read_stream(js, spec)


async def overlapping_streams(nc: NATS, api_prefix: str, subject: str) -> dict[str, list[str]]:
    """Streams (other than none) whose subjects overlap `subject`, with their subjects.

    ``STREAM.NAMES`` with a subject filter answers with every stream whose
    subjects collide with it; each one's subjects come from its info.
    """
    reply = await nc.request(
        f"{api_prefix}.STREAM.NAMES", json.dumps({"subject": subject}).encode(), timeout=5.0
    )
    names = json.loads(reply.data).get("streams") or []
    found: dict[str, list[str]] = {}
    for name in names[:10]:
        info = await nc.request(f"{api_prefix}.STREAM.INFO.{name}", b"", timeout=5.0)
        config = json.loads(info.data).get("config") or {}
        found[str(name)] = [str(s) for s in config.get("subjects") or []]
    return found


def conflict_error(spec: StreamSpec, others: dict[str, list[str]]) -> StreamConflict:
    """The final error for an overlap, naming the other stream(s) when known."""
    others = {name: subs for name, subs in others.items() if name != spec.name}
    named = "; ".join(f"{name} ({', '.join(subs)})" for name, subs in others.items())
    return StreamConflict(
        f"stream {spec.name} cannot capture {spec.subject}: its subjects overlap "
        f"{'stream ' + named if named else 'another stream'}. "
        "Remove the overlapping subjects from that stream, or give this fleet a prefix "
        "of its own (nats.prefix)",
        others,
    )


async def _conflict(js: JetStreamContext, spec: StreamSpec) -> StreamConflict:
    try:
        others = await overlapping_streams(connection_of(js), api_prefix(js), spec.subject)
    except Exception as exc:  # the names are a courtesy; the error stands without them
        log.debug("listing the overlapping streams failed: %r", exc)
        others = {}
    return conflict_error(spec, others)


async def answering_domain(js: JetStreamContext) -> str | None:
    """The JetStream domain behind `js` (None: no domain, or no answer)."""
    try:
        return (await js.account_info()).domain or None
    except Exception:  # shown as none: it only labels what was read
        return None


async def read_stream(js: JetStreamContext, spec: StreamSpec) -> StreamState:
    """The stream's settings and state; StreamNotFound when it does not exist."""
    try:
        return state_of(await js.stream_info(spec.name))
    except TRANSIENT:
        raise
    except APIError as exc:
        raise _translate(exc, "read", spec) from exc


# ---------------------------------------------------------------------- lowering


@dataclass(frozen=True)
class Lowering:
    """What lowering the stream to a spec changes and deletes."""

    state: StreamState
    duplicate_window: float
    history_size: int
    deletes: dict[str, int]  # subject -> messages over the new per-subject limit

    @property
    def changes(self) -> bool:
        return (
            abs(self.duplicate_window - self.state.duplicate_window) > 1e-9
            or self.history_size != self.state.history_size
        )

    @property
    def deleted(self) -> int:
        return sum(self.deletes.values())


async def plan_lowering(js: JetStreamContext, spec: StreamSpec) -> Lowering:
    """What `lower_stream` would do: reads only."""
    try:
        info = await js.stream_info(spec.name, subjects_filter=">")
    except TRANSIENT:
        raise
    except APIError as exc:
        raise _translate(exc, "read", spec) from exc
    counts = info.state.subjects or {}
    deletes = {
        subject: count - spec.history_size
        for subject, count in sorted(counts.items())
        if count > spec.history_size
    }
    return Lowering(state_of(info), spec.duplicate_window, spec.history_size, deletes)


async def lower_stream(js: JetStreamContext, spec: StreamSpec) -> StreamState:
    """Set the window and per-subject limit to the spec's, even when lower."""
    try:
        info = await js.stream_info(spec.name)
        update = replace(
            info.config,
            duplicate_window=spec.duplicate_window,
            max_msgs_per_subject=spec.history_size,
        )
        return state_of(await js.update_stream(update))
    except TRANSIENT:
        raise
    except APIError as exc:
        raise _translate(exc, "update", spec) from exc
