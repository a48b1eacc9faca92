"""Hostile input: garbage and oversized messages on the job subjects, fuzzed configs,
a thousand jobs.

Sidecars keep running through garbage on their claims and results subjects
(a slot whose msg id garbage took first is lost by everyone, never run), and
the read commands (`history`, `last-run`, `stream`) still answer. Config files
of any content give a valid config or exit 2 naming a key, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.config.load import load_config
from sidecar.core.errors import ConfigError
from tests.reliability.conftest import Figures
from tests.reliability.helpers import (
    config,
    every_second,
    metric_sum,
    next_second_ms,
    runs_by_slot,
    tally,
    wait_all_ran,
)
from tests.support import (
    ROOT,
    NatsServer,
    RecordingApp,
    run_cli,
    sidecar_env,
    sidecars,
    wait_for,
    write_config,
)

JOBS = {"tick": "Pacific/Kiritimati", "tock": "Etc/GMT+12"}
DEEP = b"[" * 100_000


def garbage(job: str) -> list[bytes]:
    """Bodies that are not claims or results, or are but with out-of-range values."""
    forged = {
        "job": job,
        "token": "forged",
        "slot": 1,
        "instance": "evil\n\x1b[31m",
        "scheduled_at": "9999-12-31T23:59:59Z",
        "claimed_at": "0001-01-01T00:00:00Z",
        "manual": "yes",
    }
    return [
        b"",
        b"\x00\xff\xfe not json",
        b"{",
        b"[]",
        b"null",
        b"42",
        b'"a string"',
        DEEP,
        json.dumps({"job": job, "token": 5, "slot": "x"}).encode(),
        json.dumps({"job": job, "token": "t", "slot": True, "instance": "i"}).encode(),
        json.dumps({**forged, "slot": 10**30}).encode(),
        json.dumps(forged).encode(),
        json.dumps(
            {"job": job, "token": "forged", "status": "succeeded", "duration_ms": 1e308}
        ).encode(),
        json.dumps(
            {"job": job, "token": "x" * 100_000, "status": "failed", "error": "y" * 100_000}
        ).encode(),
    ]


async def _publish_hostile(url: str, squat: dict[int, bytes]) -> dict[str, int]:
    """Publish the garbage; `squat` maps future slots of `tick` to bodies stored under their id."""
    nc = await nats.connect(url)
    sent = {"garbage": 0, "oversized": 0, "squatted": 0}
    try:
        js = nc.jetstream()
        for job in JOBS:
            for kind in ("claims", "results"):
                subject = f"cron.{job}.{kind}"
                for body in garbage(job):
                    await js.publish(subject, body, headers={"Nats-Msg-Id": f"g:{sent['garbage']}"})
                    sent["garbage"] += 1
                # Exactly the server's max payload, no headers.
                await js.publish(subject, os.urandom(nc.max_payload))
                sent["oversized"] += 1
        for slot, body in squat.items():
            ack = await js.publish(
                "cron.tick.claims", body, headers={"Nats-Msg-Id": f"tick:{slot}"}
            )
            assert not ack.duplicate, "squatted too late: the slot was already claimed"
            sent["squatted"] += 1
    finally:
        await nc.close()
    return sent


def _over_max_payload(port: int) -> bytes:
    """A raw client announcing a message beyond max_payload; the server cuts it off."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.recv(65536)  # INFO
        s.sendall(b'CONNECT {"verbose":false}\r\nPUB cron.tick.claims 99999999\r\n')
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_garbage_and_oversized_messages_while_sidecars_run(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    names = list(JOBS)
    jobs = [every_second(name, timezone=tz) for name, tz in JOBS.items()]
    cfg = config([nats_server.url], http_app, jobs)
    with sidecars(tmp_path, [(f"s{i}", cfg, {}) for i in range(3)]) as running:
        start = next_second_ms() + 1000
        assert wait_all_ran(http_app, names, start, start + 1000, timeout=15)
        squat_from = next_second_ms() + 3000
        squat = {
            squat_from: b"\x00garbage",
            squat_from + 1000: DEEP,
            squat_from + 2000: b'{"token":[1]}',
        }
        started = time.monotonic()
        sent = asyncio.run(_publish_hostile(nats_server.url, squat))
        publish_s = time.monotonic() - started
        cut_off = _over_max_payload(nats_server.port)
        after = max(next_second_ms(), max(squat) + 1000)
        assert wait_all_ran(http_app, names, after, after + 3000, timeout=20)
        alive = [p.proc is not None and p.proc.poll() is None and p.ready() for p in running]
        errors = metric_sum(running, "anarchon_claim_errors_total")
        lost_claims = metric_sum(running, "anarchon_claims_lost_total", {"job": "tick"})
        logs = [p.log() for p in running]
        cfg_path = running[0].config_path
        reads = {
            "history": run_cli("history", "tick", "-c", str(cfg_path), "--limit", "1000"),
            "history --json": run_cli(
                "history", "tick", "-c", str(cfg_path), "--json", "--limit", "1000"
            ),
            "history tock": run_cli("history", "tock", "-c", str(cfg_path)),
            "last-run": run_cli("last-run", "tick", "-c", str(cfg_path), "--json"),
            "stream": run_cli("stream", "-c", str(cfg_path), "--json"),
        }
        codes = [p.terminate() for p in running]
    ran = runs_by_slot(http_app, "tick")
    window = tally(http_app, names, start, after + 3000)
    squat_runs = sum(ran[s] for s in squat)
    history_rows = [json.loads(line) for line in reads["history --json"].stdout.splitlines()]
    figures.report(
        "hostile-messages",
        garbage=sent["garbage"],
        oversized=sent["oversized"],
        oversized_bytes=1024 * 1024,
        squatted_slots=sent["squatted"],
        squatted_runs=squat_runs,
        sidecars_alive=sum(alive),
        claim_errors=int(errors),
        doubles=len(window.doubles),
        history_exit={k: r.returncode for k, r in reads.items()},
        publish_s=round(publish_s, 1),
    )
    assert all(alive) and codes == [0, 0, 0]
    assert b"Maximum Payload" in cut_off, cut_off
    # Garbage that took a slot's msg id first makes it lost for everyone: never run, never twice.
    assert squat_runs == 0
    assert lost_claims >= len(squat) * len(running)
    assert errors == 0, [line for log in logs for line in log.splitlines() if "claim" in line]
    assert not any("Traceback" in log for log in logs)
    assert not window.doubles
    assert set(window.missing) <= {("tick", s) for s in squat}, window.missing
    for what, res in reads.items():
        assert res.returncode == 0 and "Traceback" not in res.stderr, (what, res.stderr[-2000:])
    assert "skipped" in reads["history"].stderr  # the malformed messages are counted
    # Control characters stored by anyone reach the terminal escaped, never raw.
    assert "\x1b" not in reads["history"].stdout and "evil\\n\\x1b[31m" in reads["history"].stdout
    fields = {
        "job",
        "slot",
        "token",
        "instance",
        "manual",
        "status",
        "scheduled_at",
        "claimed_at",
        "started_at",
        "finished_at",
        "duration_ms",
        "http_status",
        "error",
    }
    assert history_rows and all(fields <= row.keys() for row in history_rows)
    real = [row for row in history_rows if row["token"] != "forged"]
    assert all(row["status"] in ("succeeded", "running") for row in real)
    assert json.loads(reads["stream"].stdout)["messages"] > sent["garbage"]


# --------------------------------------------------------------------------- config files

VALID = """\
instance_id: web-1
nats:
  servers: [nats://127.0.0.1:4222]
  stream: CRON
  prefix: cron.
  duplicate_window: 5m
  history_size: 1000
  replicas: 3
metrics:
  listen: 127.0.0.1:9464
target:
  url: http://127.0.0.1:8080
  timeout: 30s
  headers: {X-A: b}
jobs:
  - name: sync
    schedule: "*/5 * * * *"
    timezone: Europe/Berlin
    jitter: 2s
    max_late: 60s
    history_size: 10
    request: {method: POST, path: /jobs/sync, headers: {}, body: "", timeout: 30s}
"""
BITS = st.sampled_from(
    [
        ":",
        "- ",
        "[",
        "]",
        "{",
        "}",
        "&a ",
        "*a",
        "!!str ",
        "!!binary ",
        "!!python/none",
        "\t",
        "\n",
        "  ",
        "'",
        '"',
        "#",
        "|",
        ">",
        "~",
        "null",
        "0x1F",
        "1e400",
        "-1",
        "2s",
        "5m",
        "0",
        "* * * * *",
        "\x00",
        "\ufeff",
        "\u00e9",
        "\udcff",
        "history_ttl: 1h\n",
        "? ",
        "%YAML 1.1\n",
        "---\n",
        "...\n",
        "<<: *a\n",
        "nats://u:p@h:1",
        "unix:///x.sock",
        "Mars/Olympus",
    ]
)
MUTATED_TEXT = st.builds(
    lambda pos, cut, bits: VALID[:pos] + "".join(bits) + VALID[pos + cut :],
    st.integers(0, len(VALID)),
    st.integers(0, 40),
    st.lists(BITS | st.text(max_size=6), max_size=6),
)
FILES = (
    MUTATED_TEXT.map(lambda t: t.encode("utf-8", "surrogateescape"))
    | st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogateescape"))
    | st.binary(max_size=300)
)


def _billion_laughs() -> bytes:
    lines = ["jobs:", "  - name: a", "    schedule: '* * * * *'", "    request:", "      headers:"]
    lines.append("        x: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]")
    previous = "a"
    for name in "bcdefghi":
        lines.append(f"        {name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
        previous = name
    return "\n".join(lines).encode() + b"\n"


HOSTILE_FILES = {
    "billion-laughs": _billion_laughs(),
    "deep-nesting": b"jobs: " + b"[" * 50_000 + b"]" * 50_000,
    "binary": os.urandom(4096),
    "utf16": VALID.encode("utf-16"),
    "python-tag": b"jobs: !!python/object/apply:os.system ['echo owned']\n",
    "self-reference": (
        b"jobs:\n - &j {name: a, schedule: '* * * * *', request: {headers: {x: *j}}}\n"
    ),
    "empty": b"",
    "only-comments": b"# nothing\n" * 100_000,
    "huge-value": b"instance_id: " + b"x" * 5_000_000 + b"\njobs: []\n",
}


def _check_answer(res: subprocess.CompletedProcess[str]) -> None:
    """`check` either accepts the file or refuses it in one line naming a key; never a traceback."""
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.returncode in (0, 2), (res.returncode, res.stderr[-3000:])
    if res.returncode == 0:
        assert res.stdout.startswith("config OK"), res.stdout[:500]
    else:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, lines[:5]
        prefix = "anarchon-sidecar: config error: "
        assert lines[0].startswith(prefix), lines[0][:500]
        key, sep, _ = lines[0].removeprefix(prefix).partition(": ")
        assert sep and key.strip(), lines[0][:500]


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "check", "-c", str(path)],
        capture_output=True,
        text=True,
        errors="replace",
        env=sidecar_env(),
        timeout=60,
        cwd=ROOT,
    )


_fuzz_count = {"load_config": 0, "check": 0, "valid": 0}


@settings(
    max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=FILES)
def test_fuzzed_config_files_load_or_name_a_key(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(content)
    _fuzz_count["load_config"] += 1
    try:
        load_config(str(path), {})
    except ConfigError as exc:
        assert exc.key and "\n" not in str(exc), repr(exc)
    else:
        _fuzz_count["valid"] += 1


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=MUTATED_TEXT)
def test_fuzzed_config_files_through_the_check_cli(tmp_path: Path, content: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    _fuzz_count["check"] += 1
    _check_answer(_check(path))


def test_hostile_config_files_through_the_check_cli(tmp_path: Path, figures: Figures) -> None:
    answers: dict[str, int] = {}
    slowest = 0.0
    for name, content in HOSTILE_FILES.items():
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(content)
        started = time.monotonic()
        res = _check(path)
        slowest = max(slowest, time.monotonic() - started)
        _check_answer(res)
        answers[name] = res.returncode
    res = _check(tmp_path / "absent.yaml")
    _check_answer(res)
    answers["missing"] = res.returncode
    # A directory is refused by the option itself (click's usage error), still exit 2.
    res = _check(tmp_path)
    assert "Traceback" not in res.stderr and "'--config'" in res.stderr, res.stderr
    answers["directory"] = res.returncode
    figures.report(
        "config-fuzz",
        load_config_files=_fuzz_count["load_config"],
        check_cli_files=_fuzz_count["check"] + len(answers),
        accepted=_fuzz_count["valid"],
        hostile_files_refused=sum(code == 2 for code in answers.values()),
        hostile_files=len(answers),
        slowest_check_s=round(slowest, 2),
    )
    assert all(code == 2 for code in answers.values()), answers
    assert _fuzz_count["load_config"] == 0 or _fuzz_count["load_config"] >= 100


# --------------------------------------------------------------------------- many jobs

N_JOBS = 1000
N_FAST = 5


def test_a_thousand_jobs_check_and_run(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    # Due in 11 to 12 hours whenever the test runs: no next-run series yet (a job due
    # within the hour has one: sidecar/obs/next_run.py). At 03:00 Berlin, a CI run in
    # the hour before it failed.
    far = (time.gmtime().tm_hour + 12) % 24
    jobs: list[dict[str, Any]] = [
        {"name": f"daily-{i:04d}", "schedule": f"0 {far} * * *", "timezone": "UTC"}
        for i in range(N_JOBS - N_FAST)
    ]
    fast = [f"fast-{i}" for i in range(N_FAST)]
    jobs += [every_second(name) for name in fast]
    cfg = config([nats_server.url], http_app, jobs)
    path = write_config(tmp_path / "many.yaml", {**cfg, "metrics": {"listen": "127.0.0.1:0"}})
    started = time.monotonic()
    res = run_cli("check", "-c", str(path))
    check_s = time.monotonic() - started
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"{N_JOBS} job(s)" in res.stdout
    assert res.stdout.count("  next: ") == 3 * N_JOBS

    started = time.monotonic()
    with sidecars(tmp_path, [("many", cfg, {})]) as (proc,):
        ready_s = time.monotonic() - started
        start = next_second_ms() + 1000
        assert wait_all_ran(http_app, fast, start, start + 2000, timeout=15)
        scraped = time.monotonic()
        status, text = proc.get("/metrics")
        scrape_s = time.monotonic() - scraped
        assert proc.proc is not None
        rss_kib = int(
            next(
                line.split()[1]
                for line in Path(f"/proc/{proc.proc.pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:")
            )
        )
        read_at = time.time()
        next_runs = wait_for(
            lambda: proc.metric("anarchon_job_next_run_timestamp_seconds", {"job": fast[-1]}),
            5,
            what="the last fast job's next run",
        )
        stopping = time.monotonic()
        code = proc.terminate()
        stop_s = time.monotonic() - stopping
    figures.report(
        "thousand-jobs",
        jobs=N_JOBS,
        check_s=round(check_s, 2),
        ready_s=round(ready_s, 2),
        metrics_kib=len(text) // 1024,
        scrape_s=round(scrape_s, 2),
        rss_mib=rss_kib // 1024,
        stop_s=round(stop_s, 2),
    )
    # Issue 49: a job waiting for its day has no series yet; the fast ones do.
    assert status == 200 and 'job="daily-0994"' not in text and f'job="{fast[-1]}"' in text
    # A slot at or after the read, give or take the slot just due (every second).
    assert next_runs > read_at - 1 and next_runs >= (start + 3000) / 1000, next_runs
    assert code == 0
    assert tally(http_app, fast, start, start + 2000).runs == 3 * N_FAST


# --------------------------------------------------------------------------- state bucket keys

FUZZ_SEED = 48
YEARLY = "0 0 1 1 *"  # never fires during the test: any call of its jobs was forged
# Checked in sidecar/run/overlap.py by issue 48's findings 2 and 4a (another branch
# of the same issue): until then a forged buffer.<job> runs (the red team's 2).
OVERLAP_FAMILIES = ("buffer.", "stop.")


async def _forge_keys(url: str, writes: list[tuple[str, bytes, str | None]]) -> int:
    """Every write as a raw publish on the bucket's subject (a client of the account)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for key, body, ttl in writes:
            headers = {"Nats-TTL": ttl} if ttl else None
            await js.publish(f"$KV.CRON_STATE.{key}", body, headers=headers)
    finally:
        await nc.close()
    return len(writes)


@pytest.mark.parametrize("overlap", [False, True])
def test_fuzzed_keys_of_every_family_trigger_nothing_the_config_and_stream_would_not(
    tmp_path: Path,
    nats_server: NatsServer,
    http_app: RecordingApp,
    figures: Figures,
    overlap: bool,
) -> None:
    """Issue 48: forged keys of every family of sidecar/store/keyfamilies.py, the red
    team's among them, against three sidecars: the app sees only the slots of the
    schedule, once each, and every family with a check counts what it refused."""
    from sidecar.store.keyfamilies import BY_PREFIX
    from sidecar.when.atkey import instants_of
    from tests.reliability.keyfuzz import forged

    families = tuple(p for p in BY_PREFIX if overlap or p not in OVERLAP_FAMILIES)

    jobs = [
        # Its concurrency key is its name: the forged conc.tick.0 holds its one slot.
        every_second("tick", overlap="skip", concurrency={"key": "tick", "limit": 1}),
        every_second("yearly", schedule=YEARLY, overlap="buffer_one", retry={"max": 2}),
        every_second("capped", schedule=YEARLY, overlap="replace", max_runs=3, max_late="10s"),
    ]
    cfg = config([nats_server.url], http_app, jobs, lease_ttl="2s")
    with sidecars(tmp_path, [(f"s{i}", cfg, {}) for i in range(3)]) as running:
        wait_for(lambda: len(http_app.requests_for("/jobs/tick")) >= 2, 20, what="tick runs")
        now_ms = int(time.time() * 1000)
        loaded = load_config(str(running[0].config_path), {})
        on_schedule = {}
        for job in loaded.jobs:
            instant = job.schedule.next_slot(now_ms + 2000)
            assert instants_of(job.schedule)(instant)
            on_schedule[job.name] = instant
        writes = forged([j["name"] for j in jobs], on_schedule, now_ms, FUZZ_SEED, "tick", families)
        sent = asyncio.run(_forge_keys(nats_server.url, writes))
        refused = ("due_key", "backfill_key", "at_key", "job", "lock_key", "conc_key")
        refused += ("unknown_key",)
        refused += ("buffer_key",) if overlap else ()
        wait_for(
            lambda: all(
                metric_sum(running, "anarchon_hostile_input_total", {"what": w}) for w in refused
            ),
            20,
            what="every family with a check counting what it refused",
        )
        # What a forged key would have triggered comes within a lease and a window.
        settle = time.time() + 8
        wait_for(lambda: time.time() > settle, 10, what="the forged keys' effects")
        wait_for(lambda: len(http_app.requests_for("/jobs/tick")) >= 2, 10, what="tick alive")
        counts = {
            w: metric_sum(running, "anarchon_hostile_input_total", {"what": w})
            for w in (*refused, "value")
        }
        alive = [p.proc is not None and p.proc.poll() is None for p in running]
        logs = [p.log() for p in running]
    forged_calls = http_app.requests_for("/jobs/yearly") + http_app.requests_for("/jobs/capped")
    ticks = http_app.requests_for("/jobs/tick")
    figures.report("hostile-keys", writes=sent, families=len(families), **counts)
    assert all(alive)
    assert not forged_calls, [(r.path, dict(r.headers)) for r in forged_calls]
    # tick: slots of its schedule (whole seconds), once each, attempt 1, as scheduled.
    assert all(int(r.headers["X-Anarchon-Slot"]) % 1000 == 0 for r in ticks)
    assert all(r.headers["X-Anarchon-Trigger"] == "scheduled" for r in ticks)
    assert all(r.headers["X-Anarchon-Attempt"] == "1" for r in ticks)
    assert not [s for s, n in runs_by_slot(http_app, "tick").items() if n > 1]
    assert not any("Traceback" in log for log in logs)
