"""A command whose compare-and-set keeps losing ends in one clear line and exit 1.

``skip``, ``unskip``, ``backfill``, ``at``, ``at --cancel`` and ``job update``
each read a key of the state bucket and compare-and-set it. Another writer
that changes the key between every read and write made ``skip``, ``backfill``
and ``at`` end in a traceback (a RuntimeError from sidecar/ops/skipops.py and
sidecar/run/atqueue.py) and ``unskip`` exit with the bare key name. Now each
says the key kept changing and that nothing was changed (exit 1, docs/CLI.md).

The failpoint ``cas.before_write=sleep(0.15)`` widens the window between the
command's read and its write; a writer in another thread puts the key again
every 10 ms, so every try of the command conflicts.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nats
import yaml

from sidecar.core.clock import rfc3339
from tests.support import NatsServer, RecordingApp, base, cli_config, job, run_cli

BUCKET = "CRON_STATE"
WIDEN = {"ANARCHON_FAILPOINTS": "cas.before_write=sleep(0.15)"}


@contextmanager
def rewriting(url: str, key: str) -> Iterator[list[int]]:
    """Put `key`'s value again every 10 ms (another writer) until the block ends;
    yields the list of revisions written."""
    stop = threading.Event()
    written: list[int] = []

    async def write() -> None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value(BUCKET)
            value = (await kv.get(key)).value or b""
            while not stop.is_set():
                written.append(await kv.put(key, value))
                await asyncio.sleep(0.01)
        finally:
            await nc.close()

    thread = threading.Thread(target=lambda: asyncio.run(write()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while len(written) < 3:
            assert thread.is_alive() and time.monotonic() < deadline, "the writer did not start"
            time.sleep(0.01)
        yield written
    finally:
        stop.set()
        thread.join(10)


def noise(line: str) -> bool:
    return line.startswith("failpoints armed") or bool(re.match(r"\d{4}-\d\d-\d\d ", line))


async def _value(url: str, key: str) -> bytes:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(BUCKET)
        return (await kv.get(key)).value or b""
    finally:
        await nc.close()


def test_every_command_that_keeps_losing_its_compare_and_set_says_so_in_one_line(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    cfg = cli_config(tmp_path, base(nats_server, http_app, [job("a", schedule="*/10 * * * * *")]))
    now = time.time()
    pending_at = rfc3339(int(now) + 3600.5)
    bucket_job = {"name": "b", "schedule": "0 0 1 1 *", "max_late": "3s"}
    job_file = tmp_path / "b.yaml"
    job_file.write_text(yaml.safe_dump(bucket_job))
    # The keys the commands will change, made by the commands themselves.
    for setup in (
        ("at", "a", "-c", cfg, pending_at),
        ("skip", "a", "-c", cfg, "--count", "2"),
        ("backfill", "a", "-c", cfg, "--from", rfc3339(now - 60), "--to", rfc3339(now - 30)),
        ("job", "add", str(job_file), "-c", cfg),
    ):
        done = run_cli(*setup)
        assert done.returncode == 0, (setup, done.stderr)
    job_file.write_text(yaml.safe_dump({**bucket_job, "max_late": "4s"}))  # an update to make

    cases: list[tuple[str, tuple[str, ...]]] = [
        ("skip.a", ("skip", "a", "-c", cfg)),
        ("skip.a", ("unskip", "a", "-c", cfg)),
        (
            "backfill.a",
            ("backfill", "a", "-c", cfg, "--from", rfc3339(now - 30), "--to", rfc3339(now - 20)),
        ),
        ("at.a", ("at", "a", "-c", cfg, rfc3339(int(now) + 7200.5))),
        ("at.a", ("at", "a", "-c", cfg, "--cancel", pending_at)),
        ("job.b", ("job", "update", str(job_file), "-c", cfg)),
    ]
    for key, args in cases:
        before = asyncio.run(_value(nats_server.url, key))
        with rewriting(nats_server.url, key) as written:
            done = run_cli(*args, env=WIDEN)
            assert len(written) > 10, "the other writer stalled"
        # The command's own words (the failpoint's and the connection's log lines aside).
        said = [line for line in done.stderr.splitlines() if line.strip() and not noise(line)]
        assert done.returncode == 1, (args, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)
        assert len(said) == 1, (args, said)
        assert f"{key} kept changing" in said[0] and "nothing was changed" in said[0], said
        # Nothing was changed: the key holds the other writer's value.
        assert asyncio.run(_value(nats_server.url, key)) == before, args
