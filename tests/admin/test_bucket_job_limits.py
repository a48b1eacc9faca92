"""Jobs of the state bucket, bounded (issue 48, finding 5).

Three real sidecar processes on a real nats-server: a job of the bucket
cannot set a header that routes, overrides the method or frames the request
(`job add` exits 2 naming it; a key written by hand with one is hostile and
never run); the fleet runs at most ``bucket_jobs.max_jobs`` of them, named
and sized within ``max_name_length`` and ``max_value_bytes`` (`job add`
exits 2 naming the limit, a key beyond it is counted and not run); a
sidecar's presence does not grow with them; and a burst of thousands of
``job.`` keys never makes a slot of a file's job late.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from sidecar.admin.jobcheck import parse_bucket_job
from sidecar.config.load import ConfigError, parse_config
from tests.admin.test_bucket_jobs import TOKEN, YEARLY, job_file, post, put_key, taken_up
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    base,
    cli_config,
    job,
    run_cli,
    sidecars,
    slots,
    wait_for,
)

BUCKET = "CRON_STATE"
# What the red team sent: each went out unchanged before.
HEADERS = {
    "Host": "internal-admin.svc.cluster.local:9999",
    "Forwarded": "for=10.0.0.1;host=internal-admin",
    "X-Forwarded-Host": "internal-admin",
    "Proxy-Authorization": "Basic Zm9vOmJhcg==",
    "X-HTTP-Method-Override": "DELETE",
    "Transfer-Encoding": "chunked",
    "Connection": "upgrade",
    "Content-Length": "0",
}


def hostile(p: Sidecar) -> float:
    return p.metric("anarchon_hostile_input_total", {"what": "job"}) or 0


def test_routing_and_framing_headers_are_refused_to_a_bucket_job(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [YEARLY])
    cfg = cli_config(tmp_path, config)
    for name, value in HEADERS.items():
        data = {**job("hosty"), "request": {"headers": {name: value}}}
        added = run_cli("job", "add", job_file(tmp_path, "hosty", data), "-c", cfg)
        assert added.returncode == 2, (name, added.stdout, added.stderr)
        assert f"config error: job.request.headers.{name}: " in added.stderr, added.stderr
        assert "Traceback" not in added.stderr
    # Any case: header names are case-insensitive on the wire.
    data = {**job("hosty"), "request": {"headers": {"hOsT": "elsewhere"}}}
    assert run_cli("job", "add", job_file(tmp_path, "h", data), "-c", cfg).returncode == 2
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        # Written past the command: hostile, said once, never run. A harmless header
        # beside it runs, which shows the window in which the other would have.
        for name, value in HEADERS.items():
            key = f"job.h-{name.lower()}"
            bad = {**job(f"h-{name.lower()}"), "request": {"headers": {name: value}}}
            put_key(nats_server.url, BUCKET, key, json.dumps(bad).encode())
        good = {**job("fine"), "request": {"headers": {"X-Tenant": "42"}}}
        put_key(nats_server.url, BUCKET, "job.fine", json.dumps(good).encode())
        wait_for(
            lambda: all(hostile(p) == len(HEADERS) for p in procs),
            10,
            what="every header key counted hostile on all three",
        )
        wait_for(lambda: len(slots(http_app, "/jobs/fine")) >= 3, 15, what="runs of fine")
        assert http_app.requests_for("/jobs/fine")[0].headers["X-Tenant"] == "42"
        for name in HEADERS:
            assert slots(http_app, f"/jobs/h-{name.lower()}") == [], name
        for p in procs:
            said = p.log().count("state bucket: job.h-host refused, not run")
            assert said == 1, p.log()[-3000:]
        sent = [r for r in http_app.requests if "internal-admin" in str(r.headers)]
        assert sent == []


def test_the_number_name_and_size_of_bucket_jobs_are_capped(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [YEARLY])
    config["bucket_jobs"] = {"max_jobs": 2, "max_name_length": 20, "max_value_bytes": 1024}
    tokens = tmp_path / "tokens"
    tokens.write_text(f"ops:{TOKEN}\n")
    config["admin"] = {"token_file": str(tokens)}
    cfg = cli_config(tmp_path, config)
    long_name = run_cli("job", "add", job_file(tmp_path, "n", job("n" * 21)), "-c", cfg)
    assert long_name.returncode == 2, long_name.stderr
    assert "job.name: at most 20 characters" in long_name.stderr
    assert "bucket_jobs.max_name_length" in long_name.stderr
    huge = {**job("big"), "request": {"body": "x" * 1100}}
    big = run_cli("job", "add", job_file(tmp_path, "b", huge), "-c", cfg)
    assert big.returncode == 2 and "bucket_jobs.max_value_bytes" in big.stderr, big.stderr
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        for name in ("a1", "a2"):
            done = run_cli("job", "add", job_file(tmp_path, name, job(name)), "-c", cfg)
            assert done.returncode == 0, done.stderr
        third = run_cli("job", "add", job_file(tmp_path, "a3", job("a3")), "-c", cfg)
        assert third.returncode == 2, third.stderr
        assert "config error: bucket_jobs.max_jobs: the state bucket holds 2 jobs" in (third.stderr)
        # The API: the same limit, named.
        code, answer = post(procs[0], "/api/v1/bucket-jobs/a3/add", job("a3"))
        assert (code, answer.get("key")) == (400, "bucket_jobs.max_jobs"), answer
        headers = {"request": {"headers": {"X-Forwarded-Host": "elsewhere"}}}
        code, answer = post(procs[0], "/api/v1/bucket-jobs/a3/add", {**job("a3"), **headers})
        assert answer.get("key") == "job.request.headers.X-Forwarded-Host", answer
        # The same job again is not a new one: unchanged, not refused.
        again = run_cli("job", "add", job_file(tmp_path, "a1", job("a1")), "-c", cfg)
        assert again.returncode == 0 and "unchanged" in again.stdout, again.stderr
        wait_for(lambda: all(taken_up(p, "a2") for p in procs), 5, what="a1, a2 taken up")
        # Past the command: counted, not taken up (the latest written is beyond).
        put_key(nats_server.url, BUCKET, "job.a3", json.dumps(job("a3")).encode())
        put_key(nats_server.url, BUCKET, "job.a4", json.dumps(job("a4")).encode())
        wait_for(lambda: all(hostile(p) == 2 for p in procs), 5, what="a3, a4 counted")
        wait_for(lambda: len(slots(http_app, "/jobs/a2")) >= 3, 10, what="runs of a2")
        assert slots(http_app, "/jobs/a3") == slots(http_app, "/jobs/a4") == []
        assert not any(taken_up(p, "a3") for p in procs)
        for p in procs:
            assert "job keys beyond bucket_jobs.max_jobs (2) refused" in p.log()
        listed = run_cli("job", "list", "-c", cfg, "--json")
        items = [json.loads(line) for line in listed.stdout.splitlines()]
        states = {item["name"]: item["state"] for item in items}
        assert states == {"a1": "run", "a2": "run", "a3": "invalid", "a4": "invalid"}
        # A place freed: the earliest written beyond the cap is taken up.
        assert run_cli("job", "remove", "a1", "-c", cfg).returncode == 0
        wait_for(lambda: all(taken_up(p, "a3") for p in procs), 5, what="a3 taken up")
        assert not any(taken_up(p, "a4") for p in procs)


def test_the_limits_are_read_from_the_file_and_checked() -> None:
    data: dict[str, Any] = {
        "target": {"url": "http://127.0.0.1:8080"},
        "jobs": [YEARLY],
        "bucket_jobs": {"max_jobs": -1},
    }
    with pytest.raises(ConfigError, match=r"bucket_jobs\.max_jobs: must be between 0 and"):
        parse_config(data, {})
    data["bucket_jobs"] = {"max_name_length": 10}
    config = parse_config(data, {})
    assert config.bucket_jobs.max_jobs == 1000  # the default
    with pytest.raises(ConfigError, match=r"job\.name: at most 10 characters"):
        parse_bucket_job(config, job("eleven-char"), "job")
    data["bucket_jobs"] = {"maximum": 3}
    with pytest.raises(ConfigError, match=r"bucket_jobs\.maximum"):
        parse_config(data, {})


# ---------------------------------------------------------------------- a burst


async def _put_many(url: str, values: dict[str, bytes]) -> float:
    """Every key written as fast as JetStream acks them; the seconds it took."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(BUCKET)
        began = time.monotonic()
        items = list(values.items())
        for at in range(0, len(items), 200):
            await asyncio.gather(*(kv.put(k, v) for k, v in items[at : at + 200]))
        return time.monotonic() - began
    finally:
        await nc.close()


async def _presences(url: str, names: list[str]) -> dict[str, bytes]:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(BUCKET)
        return {name: (await kv.get(f"instance.{name}")).value or b"" for name in names}
    finally:
        await nc.close()


def presences(url: str, names: list[str]) -> dict[str, bytes]:
    return asyncio.run(_presences(url, names))


def bucket_jobs_in(presence: bytes) -> int:
    """How many jobs of the bucket a presence says its instance runs (one entry for
    the set, or, before, one per job beside the file's one)."""
    value = json.loads(presence)
    entry = value.get("bucket_jobs")
    return int(entry["count"]) if entry else len(value.get("jobs") or {}) - 1


def said_beyond(p: Sidecar) -> int:
    """How many keys the sidecar said were beyond ``bucket_jobs.max_jobs``."""
    return sum(int(n) for n in re.findall(r"state bucket: (\d+) job keys beyond", p.log()))


def rss_kib(p: Sidecar) -> int:
    assert p.proc is not None
    for line in Path(f"/proc/{p.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# No slot late (max_late 1 s) while three sidecars take in 3,000 keys: a margin about
# timing, alone in make test's second pass (the other worker's load counts against it).
@pytest.mark.serial
def test_a_burst_of_bucket_jobs_keeps_presence_small_and_no_file_slot_late(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """1,000 valid jobs (the default cap) with 60-character names, then 2,000 more
    with 150-character names (beyond both caps), written as fast as NATS takes
    them while a job of the file runs every 2 s on three sidecars."""
    tick = job("tick", schedule="*/2 * * * * *", jitter="100ms", max_late="1s")
    config = base(nats_server, http_app, [tick])
    names = [f"s{i}" for i in range(3)]
    with sidecars(tmp_path, [(n, config, {}) for n in names]) as procs:
        wait_for(lambda: len(slots(http_app, "/jobs/tick")) >= 1, 10, what="a first tick")
        since = time.time()
        rss_before = [rss_kib(p) for p in procs]
        size_before = max(len(v) for v in presences(nats_server.url, names).values())
        valid = {
            f"job.{'v' * 56}{i:04d}": json.dumps(
                {"name": f"{'v' * 56}{i:04d}", **YEARLY_TIMING}
            ).encode()
            for i in range(1000)
        }
        took = asyncio.run(_put_many(nats_server.url, valid))
        print(f"1,000 job keys written in {took:.2f}s")

        def all_taken_up() -> bool:
            got = presences(nats_server.url, names).values()
            return all(bucket_jobs_in(v) == 1000 for v in got)

        wait_for(all_taken_up, 60, what="1,000 jobs taken up by all three")
        size_valid = max(len(v) for v in presences(nats_server.url, names).values())
        rss_valid = [rss_kib(p) for p in procs]
        beyond = {
            f"job.{'w' * 146}{i:04d}": json.dumps(
                {"name": f"{'w' * 146}{i:04d}", **YEARLY_TIMING}
            ).encode()
            for i in range(2000)
        }
        took = asyncio.run(_put_many(nats_server.url, beyond))
        print(f"2,000 more job keys written in {took:.2f}s")
        # Read from the log, not /metrics: a scrape of 1,000 jobs' series costs RSS too.
        wait_for(
            lambda: all(said_beyond(p) == 2000 for p in procs),
            60,
            what="2,000 keys beyond the cap said on all three",
        )
        size_after = max(len(v) for v in presences(nats_server.url, names).values())
        rss_after = [rss_kib(p) for p in procs]
        assert [hostile(p) for p in procs] == [2000, 2000, 2000]
        # A few more slots of the file's job after the burst, and at least 8 s of
        # slots in all (the burst may be taken up within a slot or two).
        end = max(time.time() + 4, since + 8)
        wait_for(lambda: time.time() > end, 12, what="4 s more")
        print(
            f"presence bytes: {size_before} -> {size_valid} (1,000 jobs) -> {size_after} "
            f"(+2,000 beyond the cap); RSS KiB {rss_before} -> {rss_valid} -> {rss_after}"
        )
        assert size_valid < size_before + 200 and size_after == size_valid
        late = [
            p.metric("anarchon_claims_skipped_total", {"job": "tick", "reason": "late"}) or 0
            for p in procs
        ]
        assert late == [0, 0, 0], late
        # Every slot of the file's job in the window ran, once.
        ran = sorted(s for s in slots(http_app, "/jobs/tick") if s / 1000 > since)
        first = math.ceil(since / 2 + 0.001) * 2000  # the first slot after since
        due = list(range(first, int((end - 2) * 1000), 2000))
        assert due and all(s in ran for s in due), (due, ran)
        assert len(ran) == len(set(ran))


# The bucket's jobs of the burst never come due while the test runs.
YEARLY_TIMING = {"schedule": "0 0 1 1 *"}
