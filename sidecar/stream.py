"""The JetStream stream: create or update it as the reference says, and read its state.

Create when missing: subjects ``<prefix>>``, the duplicate window, one history
size per subject (``max_msgs_per_subject``), replicas as configured or 1.
Update when it exists with other settings: window and per-subject limit are
set, ``<prefix>>`` is added to its subjects, replicas change only when
configured; everything else the stream has is kept.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import StreamConfig, StreamInfo
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError, ServiceUnavailableError

from sidecar.errors import StreamError, StreamNotFound

if TYPE_CHECKING:
    from sidecar.config import Config

log = logging.getLogger(__name__)

ERR_STREAM_NOT_FOUND = 10059
# A standalone server refuses replicas > 1 with "replicas > 1 not supported in non-clustered mode".
ERR_REPLICAS_NOT_SUPPORTED = 10074
# Answers that mean "JetStream is not ready yet" (cluster electing, meta leader
# unknown): worth retrying rather than failing.
RETRYABLE = (NatsTimeoutError, NoRespondersError, NoStreamResponseError, ServiceUnavailableError)


@dataclass(frozen=True)
class StreamSpec:
    """What the sidecar needs of the stream."""

    name: str
    prefix: str
    duplicate_window: float  # seconds
    history_size: int
    replicas: int | None

    @property
    def subject(self) -> str:
        return f"{self.prefix}>"


def stream_spec(config: Config) -> StreamSpec:
    """The stream a config asks for, with the effective history size."""
    n = config.nats
    return StreamSpec(
        n.stream, n.prefix, n.duplicate_window, config.effective_history_size, n.replicas
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


def desired_update(current: StreamConfig, spec: StreamSpec) -> StreamConfig | None:
    """The updated config for an existing stream, or None when it already fits."""
    subjects = list(current.subjects or [])
    if spec.subject not in subjects:
        subjects.append(spec.subject)
    wanted = replace(
        current,
        subjects=subjects,
        duplicate_window=spec.duplicate_window,
        max_msgs_per_subject=spec.history_size,
        num_replicas=spec.replicas if spec.replicas is not None else current.num_replicas,
    )
    same = (
        subjects == list(current.subjects or [])
        and abs(float(current.duplicate_window or 0) - spec.duplicate_window) < 1e-9
        and current.max_msgs_per_subject == spec.history_size
        and wanted.num_replicas == current.num_replicas
    )
    return None if same else wanted


async def ensure_stream(js: JetStreamContext, spec: StreamSpec) -> StreamState:
    """Create the stream or bring an existing one in line; return its state.

    Raises StreamError for what JetStream refuses, and lets RETRYABLE errors
    (JetStream not ready yet) through for the caller's backoff.
    """
    try:
        info = await js.stream_info(spec.name)
    except NotFoundError as exc:
        if exc.err_code not in (ERR_STREAM_NOT_FOUND, None):
            raise _translate(exc, "read", spec) from exc
        return await _create(js, spec)
    except RETRYABLE:
        raise
    except APIError as exc:
        raise _translate(exc, "read", spec) from exc
    update = desired_update(info.config, spec)
    if update is None:
        return state_of(info)
    log.info(
        "updating stream %s: subjects=%s duplicate_window=%ss history_size=%s replicas=%s",
        spec.name,
        update.subjects,
        spec.duplicate_window,
        spec.history_size,
        update.num_replicas,
    )
    try:
        return state_of(await js.update_stream(update))
    except RETRYABLE:
        raise
    except APIError as exc:
        raise _translate(exc, "update", spec) from exc


async def _create(js: JetStreamContext, spec: StreamSpec) -> StreamState:
    config = StreamConfig(
        name=spec.name,
        subjects=[spec.subject],
        duplicate_window=spec.duplicate_window,
        max_msgs_per_subject=spec.history_size,
        num_replicas=spec.replicas or 1,
    )
    log.info(
        "creating stream %s: subjects=%s duplicate_window=%ss history_size=%s replicas=%s",
        spec.name,
        config.subjects,
        spec.duplicate_window,
        spec.history_size,
        config.num_replicas,
    )
    try:
        return state_of(await js.add_stream(config))
    except RETRYABLE:
        raise
    except APIError as exc:
        # Another sidecar created it at the same moment: take the update path.
        if exc.err_code in (10058, 10065):
            await asyncio.sleep(0.05)
            return await ensure_stream(js, spec)
        raise _translate(exc, "create", spec) from exc


async def read_stream(js: JetStreamContext, spec: StreamSpec) -> StreamState:
    """The stream's settings and state; StreamNotFound when it does not exist."""
    try:
        return state_of(await js.stream_info(spec.name))
    except RETRYABLE:
        raise
    except APIError as exc:
        raise _translate(exc, "read", spec) from exc
