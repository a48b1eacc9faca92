"""``job add/update/remove/list``: a job of the state bucket on a connection of its own.

Each command connects once, reads or writes through sidecar/admin/jobwrite.py
(the acts the API shares) and closes; ``read_job`` is how ``pause``, ``skip``,
``at``, ``run-now`` and ``backfill`` find a job the config file does not name.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from nats.js.errors import BucketNotFoundError, NotFoundError

from sidecar.admin.jobcheck import BucketJob, job_key, judge, listing
from sidecar.admin.jobwrite import Written, add_in, remove_in, stored_job, update_in
from sidecar.config.model import Config, JobConfig, Secrets
from sidecar.store.state import ensure_bucket, state_spec

# `job add/update`'s FILE at most: a job is a few hundred bytes.
MAX_JOB_FILE = 64 << 10


def read_job_file(path: str) -> object:
    """`job add/update`'s FILE: one job as YAML or JSON (``-``: standard input), at
    most MAX_JOB_FILE bytes (``job add /dev/zero`` is refused, not read for ever)."""
    from sidecar.config.yamlfile import read_yaml

    return read_yaml(path, MAX_JOB_FILE, "job", stdin=True)


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


async def add(config: Config, secrets: Secrets, spec: BucketJob, value: dict[str, Any]) -> Written:
    """`job add`: ``add_in`` on a connection of its own (the bucket made when missing)."""
    async with state_kv(config, secrets, create=True) as kv:
        return await add_in(kv, spec, value, config.bucket_jobs.max_jobs)


async def update(
    config: Config, secrets: Secrets, spec: BucketJob, value: dict[str, Any], id_given: bool
) -> Written:
    """`job update`: ``update_in`` on a connection of its own."""
    async with state_kv(config, secrets, create=False) as kv:
        return await update_in(kv, spec, value, id_given)


async def remove(config: Config, secrets: Secrets, name: str, ident: str | None) -> Written:
    """`job remove`: ``remove_in`` on a connection of its own."""
    async with state_kv(config, secrets, create=False) as kv:
        return await remove_in(kv, name, ident)


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
