"""What the stream must be for a config, and whether it holds a job's claims: pure.

``raised_state`` shows what ``desired_update`` (sidecar/store/stream.py:
window, per-subject limit and replicas only go up; subjects gain
``<prefix>>``) would leave, for checks that change nothing. ``covers`` says
whether the stream as it really is holds a job's claims for as long as
another claim of the same slot can come (``jitter + max_late``): the daemon
claims a job only while it does. ``placement_problem`` compares its
placement with ``nats.placement``. No I/O here: the stream's
reads and writes are sidecar/store/stream.py's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from sidecar.config.fields import format_duration
from sidecar.store.stream import desired_update

if TYPE_CHECKING:
    from collections.abc import Iterable

    from nats.js.api import StreamConfig

    from sidecar.config.load import JobConfig
    from sidecar.store.stream import StreamSpec, StreamState


def raised_state(state: StreamState, current: StreamConfig, spec: StreamSpec) -> StreamState:
    """The state `ensure_stream` would leave: for checks that must not change anything."""
    update = desired_update(current, spec)
    if update is None:
        return state
    return replace(
        state,
        subjects=tuple(update.subjects or ()),
        duplicate_window=float(update.duplicate_window or 0),
        history_size=int(update.max_msgs_per_subject),
        replicas=int(update.num_replicas or 1),
    )


# ---------------------------------------------------------------------- coverage


def covers(state: StreamState, spec: StreamSpec, job: JobConfig) -> str | None:
    """Why the stream as it is cannot hold `job`'s claims; None when it can.

    A claim must be remembered for as long as another claim of its slot can
    come, ``jitter + max_late`` after the slot: the duplicate window must be
    longer than that, and the per-subject limit must keep every claim made in
    that time (JetStream rebuilds its duplicate memory after a restart only
    from stored messages). The stream must also capture our subjects.
    """
    if spec.subject not in state.subjects:
        return f"stream {state.name} does not capture {spec.subject}"
    need = job.jitter + job.max_late
    if state.duplicate_window <= need:
        cap = (
            f"; its max_age ({format_duration(state.max_age)}) keeps it there"
            if state.max_age and state.max_age <= need
            else ""
        )
        return (
            f"stream {state.name}'s duplicate window ({format_duration(state.duplicate_window)}) "
            f"is not longer than jitter + max_late ({format_duration(need)}){cap}"
        )
    if state.history_size > 0:
        need_ms = round(need * 1000)
        floor = job.schedule.interval_floor_ms()
        if state.history_size * floor <= need_ms:
            interval = job.schedule.min_interval_ms()
            if state.history_size * interval <= need_ms:
                return (
                    f"stream {state.name}'s history size ({state.history_size} per subject) "
                    f"does not keep the claims of jitter + max_late ({format_duration(need)}) "
                    f"at one slot every {format_duration(interval / 1000)}"
                )
    return None


def placement_problem(state: StreamState, spec: StreamSpec) -> str | None:
    """How the stream's placement differs from ``nats.placement``; None when it fits.

    The sidecar never moves an existing stream (a move copies all its data):
    it reports the difference, and an operator moves it (``nats stream edit``).
    """
    if not spec.placement_cluster and not spec.placement_tags:
        return None
    have = state.placement or {}
    problems = []
    if spec.placement_cluster and spec.placement_cluster not in (
        have.get("cluster"),
        state.cluster,
    ):
        problems.append(
            f"cluster {state.cluster or have.get('cluster') or '?'} "
            f"(nats.placement.cluster: {spec.placement_cluster})"
        )
    missing = [t for t in spec.placement_tags if t not in (have.get("tags") or [])]
    if missing:
        problems.append(f"placement tags {have.get('tags') or []} lack {missing}")
    if not problems:
        return None
    return f"stream {state.name} is placed in " + "; ".join(problems)


def coverage(
    state: StreamState, spec: StreamSpec, jobs: Iterable[JobConfig]
) -> dict[str, str | None]:
    """``covers`` for each job, by name."""
    return {job.name: covers(state, spec, job) for job in jobs}
