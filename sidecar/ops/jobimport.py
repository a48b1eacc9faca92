"""`job import FILE`: many jobs of the state bucket in one command (a tenant migration).

FILE holds a list of jobs, each as `job add` takes it (``jobs:`` of YAML, or a
JSON list, or ``{"jobs": [...]}``). Every job is checked first, as a sidecar
checks it: one bad job exits 2 naming ``jobs[i].<key>`` and nothing is
written. Then each is written by compare-and-set, idempotent by id
(docs/CLI.md "job import"):

- absent: created (within ``bucket_jobs.max_jobs``, counted once per import);
- present with this id and these settings: unchanged;
- present with this id and other settings: updated (the file is the truth);
- present with another id: refused (another tenant's job of that name).

One answer per job, in the file's order. Writes go ``CONCURRENCY`` at a time:
10,000 jobs are not 10,000 awaited round trips one after another.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.admin.jobcheck import BucketJob, canonical, job_key
from sidecar.admin.jobwrite import count_jobs, create_job, prepare, stored_job
from sidecar.config.fields import read_capped, short
from sidecar.config.model import Config, Secrets
from sidecar.config.yamlfile import load as load_yaml
from sidecar.core.errors import CasConflict, ConfigError
from sidecar.ops.jobops import state_kv
from sidecar.store.kv import create_or_update

# An import file at most: 100,000 jobs of a few hundred bytes each.
MAX_IMPORT_FILE = 128 << 20
# Jobs written at once; each is two or three round trips to NATS.
CONCURRENCY = 64
# Problems listed when the file has bad jobs (the rest counted).
MAX_PROBLEMS = 20
CREATED, UPDATED, UNCHANGED, REFUSED = "created", "updated", "unchanged", "refused"


@dataclass(frozen=True)
class Outcome:
    """What happened to one job of the file."""

    name: str
    id: str
    what: str  # created, updated, unchanged, refused
    why: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "id": self.id, "result": self.what, "why": self.why}


def read_import_file(path: str) -> list[object]:
    """FILE's jobs, unchecked: JSON (fast for 100,000 jobs) or YAML; ConfigError
    (``import``) when it is neither, or holds no list of jobs."""
    where = "standard input" if path == "-" else path
    try:
        raw = read_capped(path, MAX_IMPORT_FILE, "import", True)
    except FileNotFoundError:
        raise ConfigError("import", f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError("import", f"{where}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("import", f"{where}: not UTF-8 text (byte {exc.start})") from None
    data: object
    if text.lstrip()[:1] in ("[", "{"):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = _yaml(text, where)  # JSON-like YAML (flow style): YAML says where
    else:
        data = _yaml(text, where)
    if isinstance(data, dict) and set(data) == {"jobs"}:
        data = data["jobs"]
    if not isinstance(data, list):
        raise ConfigError("import", f"{where}: a list of jobs (or jobs: [...]), one per entry")
    return data


def _yaml(text: str, where: str) -> object:
    try:
        return load_yaml(text)
    except Exception as exc:  # the YAML's own error, with its line
        raise ConfigError("import", f"{where}: not JSON or YAML ({short(str(exc))})") from None


def prepare_all(
    config: Config, items: Sequence[object], by: str
) -> tuple[list[tuple[BucketJob, dict[str, Any]]], list[str]]:
    """Each job checked as `job add` checks it; the prepared jobs, and the problems
    (``jobs[i].<key>: why``, at most MAX_PROBLEMS and a count) when any."""
    file_names = frozenset(config.job_names)
    prepared: list[tuple[BucketJob, dict[str, Any]]] = []
    problems: list[str] = []
    bad = 0
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        try:
            spec, value = prepare(config, item, None, by, file_names)
        except ConfigError as exc:
            bad += 1
            if len(problems) < MAX_PROBLEMS:
                where = exc.key.removeprefix("job").removeprefix(".")
                problems.append(f"jobs[{i}]{'.' + where if where else ''}: {exc.message}")
            continue
        name = spec.job.name
        if name in seen:
            bad += 1
            if len(problems) < MAX_PROBLEMS:
                problems.append(f"jobs[{i}].name: {name!r} again (first at jobs[{seen[name]}])")
            continue
        seen[name] = i
        prepared.append((spec, value))
    if bad > len(problems):
        problems.append(f"... and {bad - len(problems)} more")
    return prepared, problems


async def import_jobs(
    config: Config, secrets: Secrets, jobs: Sequence[tuple[BucketJob, dict[str, Any]]]
) -> list[Outcome]:
    """Write `jobs` (prepared), at most CONCURRENCY at once; one Outcome per job."""
    async with state_kv(config, secrets, create=True) as kv:
        room = config.bucket_jobs.max_jobs - await count_jobs(kv)
        gate = asyncio.Semaphore(CONCURRENCY)
        lock = asyncio.Lock()  # the room left, shared by the writers

        async def one(spec: BucketJob, value: dict[str, Any]) -> Outcome:
            async with gate:
                for _ in range(3):
                    try:
                        return await _write(kv, spec, value, take_room)
                    except CasConflict:
                        continue  # written meanwhile: read again
                return Outcome(spec.job.name, spec.id, REFUSED, "it kept changing meanwhile")

        async def take_room() -> bool:
            nonlocal room
            async with lock:
                if room <= 0:
                    return False
                room -= 1
                return True

        return list(await asyncio.gather(*(one(spec, value) for spec, value in jobs)))


async def _write(
    kv: Any, spec: BucketJob, value: dict[str, Any], take_room: Callable[[], Awaitable[bool]]
) -> Outcome:
    name = spec.job.name
    key = job_key(name)
    now = await stored_job(kv, key)
    if now is None:
        if not await take_room():
            return Outcome(
                name, spec.id, REFUSED, "bucket_jobs.max_jobs reached (raise it in the config)"
            )
        await create_job(kv, spec, value)
        return Outcome(name, spec.id, CREATED)
    stored, revision = now
    stored_id = str(stored.get("id", name))
    if stored_id != spec.id:
        return Outcome(
            name, spec.id, REFUSED, f"the state bucket has this job with id {short(stored_id)}"
        )
    if canonical(stored) == spec.canon:
        return Outcome(name, spec.id, UNCHANGED)
    await create_or_update(kv, key, value, revision)
    return Outcome(name, spec.id, UPDATED)
