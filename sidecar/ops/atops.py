"""``anarchon-sidecar at``: one-off runs queued, cancelled and listed over a connection
of its own.

``at.<job>`` is changed through sidecar/run/atqueue.py, as the page's and the
API's acts change it (sidecar/admin/atacts.py, which also holds the words both
say); each act is written to ``actions.<job>`` with ``via`` ``cli``.
"""

from __future__ import annotations

from sidecar.admin.atacts import action_entry, audit, cancelled_detail, queued_detail
from sidecar.config.load import Config, JobConfig, Secrets
from sidecar.run.atqueue import Queued, cancel, listing, queue
from sidecar.when.atkey import AtRun


async def cli_queue(
    config: Config, secrets: Secrets, job: JobConfig, slot: int, by: str, reason: str
) -> Queued:
    from sidecar.store.connection import connected
    from sidecar.store.connection import one_shot_js as _js
    from sidecar.store.state import ensure_bucket, state_spec

    async with connected(config, secrets) as conn:
        bucket = await ensure_bucket(_js(conn), state_spec(config))
        done = await queue(bucket.kv, job, slot, by, reason)
        if done.new:
            entry = action_entry("at", by, "", "cli", config.instance_id, queued_detail(done.run))
            await audit(bucket.kv, job.name, entry)
        return done


async def cli_cancel(
    config: Config, secrets: Secrets, job: str, slots: set[int] | None, by: str
) -> tuple[list[AtRun], list[AtRun]]:
    """(those cancelled, those too late: a sidecar started claiming them)."""
    from sidecar.store.connection import connected
    from sidecar.store.connection import one_shot_js as _js
    from sidecar.store.state import ensure_bucket, state_spec

    async with connected(config, secrets) as conn:
        bucket = await ensure_bucket(_js(conn), state_spec(config))
        gone, late = await cancel(bucket.kv, job, slots)
        if gone:
            detail = cancelled_detail(gone)
            entry = action_entry("cancel-at", by, "", "cli", config.instance_id, detail)
            await audit(bucket.kv, job, entry)
        return gone, late


async def cli_list(config: Config, secrets: Secrets, job: str) -> list[AtRun]:
    from sidecar.store.connection import connected
    from sidecar.store.connection import one_shot_js as _js
    from sidecar.store.state import ensure_bucket, state_spec

    async with connected(config, secrets) as conn:
        bucket = await ensure_bucket(_js(conn), state_spec(config))
        return await listing(bucket.kv, job)
