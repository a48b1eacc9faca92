"""The command line through real processes: check, config errors, env overrides, version."""

from __future__ import annotations

import itertools
import re
import shutil
import socket
import subprocess
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from sidecar import __version__
from tests.support import (
    NatsServer,
    Sidecar,
    free_port,
    port_open,
    run_cli,
    sidecar_env,
    write_config,
)

NEXT_RE = re.compile(
    r"  next: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (\S+)  \((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\)"
)


def job(name: str = "sync", **extra: Any) -> dict[str, Any]:
    return {"name": name, "schedule": "*/5 * * * *", **extra}


def config(**extra: Any) -> dict[str, Any]:
    return {
        "instance_id": "web-1",
        "nats": {"servers": "nats://127.0.0.1:4222"},
        "metrics": {"listen": "127.0.0.1:9464"},
        "jobs": [job()],
        **extra,
    }


def both(
    *args: str, env: dict[str, str] | None = None
) -> dict[str, subprocess.CompletedProcess[str]]:
    """`check ARGS` and `run ARGS`, side by side."""
    with ThreadPoolExecutor(2) as pool:
        done = {cmd: pool.submit(run_cli, cmd, *args, env=env) for cmd in ("check", "run")}
        return {cmd: future.result() for cmd, future in done.items()}


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a config error, without the program's prefix."""
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    prefix = "anarchon-sidecar: config error: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0].removeprefix(prefix)


# ------------------------------------------------------------------ check


def parse_jobs(stdout: str) -> dict[str, list[tuple[str, str, str]]]:
    """Each job's `next:` lines as (local time, zone abbreviation, UTC time)."""
    jobs: dict[str, list[tuple[str, str, str]]] = {}
    current = None
    for line in stdout.splitlines():
        head = re.fullmatch(r"(\S+): '(.*)' in (\S+)", line)
        if head:
            current = jobs.setdefault(head[1], [])
            continue
        nxt = NEXT_RE.fullmatch(line)
        if nxt:
            assert current is not None, line
            current.append((nxt[1], nxt[2], nxt[3]))
    return jobs


def test_check_prints_every_job_with_three_next_runs(tmp_path: Path) -> None:
    cfg = config(
        jobs=[
            job("morning", schedule="30 6 * * *", timezone="Europe/Berlin"),
            job("weekly", schedule="0 12 * * 1", timezone="America/New_York"),
            job("tick", schedule="*/10 * * * * *", jitter="1s", max_late="5s"),
        ]
    )
    path = write_config(tmp_path / "c.yaml", cfg)
    started = datetime.now(UTC).replace(microsecond=0)
    res = run_cli("check", "-c", str(path))
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    assert "config OK: instance web-1, 3 job(s), stream CRON" in res.stdout
    jobs = parse_jobs(res.stdout)
    assert set(jobs) == {"morning", "weekly", "tick"}
    zones = {"morning": "Europe/Berlin", "weekly": "America/New_York", "tick": "UTC"}
    runs: dict[str, list[datetime]] = {}
    for name, lines in jobs.items():
        assert len(lines) == 3, (name, lines)
        tz = ZoneInfo(zones[name])
        runs[name] = []
        for local, abbr, utc in lines:
            at = datetime.strptime(utc, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            # the local column is the same instant in the job's zone
            assert at.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S") == local
            assert at.astimezone(tz).tzname() == abbr
            runs[name].append(at)
        assert runs[name] == sorted(runs[name]) and len(set(runs[name])) == 3
        assert runs[name][0] > started - timedelta(seconds=1)
    berlin = [at.astimezone(ZoneInfo("Europe/Berlin")) for at in runs["morning"]]
    assert all((at.hour, at.minute) == (6, 30) for at in berlin)
    assert [b.date() - a.date() for a, b in itertools.pairwise(berlin)] == [timedelta(days=1)] * 2
    assert runs["morning"][0] - started <= timedelta(days=1)
    new_york = [at.astimezone(ZoneInfo("America/New_York")) for at in runs["weekly"]]
    assert all((at.weekday(), at.hour, at.minute) == (0, 12, 0) for at in new_york)
    ticks = runs["tick"]
    assert [b - a for a, b in itertools.pairwise(ticks)] == [timedelta(seconds=10)] * 2
    assert all(at.second % 10 == 0 for at in ticks)


def test_check_connects_to_nothing(tmp_path: Path) -> None:
    # nothing listens there: check still passes; with --no-files the secret files
    # need not exist either (a CI without them)
    port = free_port()
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    cfg = config(
        nats={"servers": f"nats://127.0.0.1:{port}", "user": "u", "password_file": str(secret)},
        target={"signing_secret_file": str(secret)},
    )
    res = run_cli("check", "-c", str(write_config(tmp_path / "c.yaml", cfg)))
    assert res.returncode == 0, res.stderr
    assert f"on nats://127.0.0.1:{port}" in res.stdout
    secret.unlink()
    res = run_cli("check", "--no-files", "-c", str(tmp_path / "c.yaml"))
    assert res.returncode == 0, res.stderr


# ------------------------------------------------------------------ config errors

CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("job name", config(jobs=[job("bad.name")]), "jobs[0].name", "letters, digits"),
    (
        "jitter + max_late",
        config(
            nats={"duplicate_window": "2m"},
            jobs=[job(), job("late", jitter="2s", max_late="118s")],
        ),
        "jobs[1].jitter",
        "must be shorter than nats.duplicate_window (2m)",
    ),
    ("history_ttl", config(nats={"history_ttl": "1h"}), "nats.history_ttl", "by count only"),
    (
        "job history_ttl",
        config(jobs=[job(history_ttl="1d")]),
        "jobs[0].history_ttl",
        "by count only",
    ),
    ("cron", config(jobs=[job(schedule="61 * * * *")]), "jobs[0].schedule", ""),
    ("cron fields", config(jobs=[job(schedule="* * *")]), "jobs[0].schedule", ""),
    ("timezone", config(jobs=[job(timezone="Mars/Olympus")]), "jobs[0].timezone", ""),
    ("duplicate", config(jobs=[job(), job("b"), job()]), "jobs[2].name", "duplicate"),
    ("remote", config(target={"url": "http://10.1.2.3:8080"}), "target.url", "allow_remote"),
    (
        "remote job url",
        config(jobs=[job(request={"url": "http://app.example.com"})]),
        "jobs[0].request.url",
        "allow_remote",
    ),
    ("unknown key", config(nats={"servres": "nats://x:4222"}), "nats.servres", "unknown key"),
    ("unknown top key", config(metrics_listen=":9464"), "metrics_listen", "unknown key"),
    (
        "history rule",
        config(
            nats={"history_size": 10},
            jobs=[job(schedule="* * * * * *", jitter="0s", max_late="30s")],
        ),
        "nats.history_size",
        "raise history_size",
    ),
    (
        "job history rule",
        config(
            nats={"history_size": 5},
            jobs=[job(schedule="* * * * * *", jitter="0s", max_late="30s", history_size=20)],
        ),
        "jobs[0].history_size",
        "raise history_size",
    ),
]


@pytest.mark.parametrize(
    ("data", "key", "says"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_config_errors_exit_2_naming_the_key(
    tmp_path: Path, data: dict[str, Any], key: str, says: str
) -> None:
    path = write_config(tmp_path / "c.yaml", data)
    for cmd, res in both("-c", str(path)).items():
        assert res.returncode == 2, (cmd, res.stdout, res.stderr)
        assert res.stdout == "", cmd
        line = one_error_line(res)
        assert line.startswith(f"{key}: "), (cmd, line)
        assert says in line, (cmd, line)


def test_a_valid_variant_of_each_rule_passes(tmp_path: Path) -> None:
    """The error cases above differ from a valid config only in what they break."""
    cfg = config(
        nats={"duplicate_window": "2m", "history_size": 40},
        target={"url": "http://10.1.2.3:8080", "allow_remote": True},
        jobs=[
            job("ok_name-1", timezone="Pacific/Apia"),
            job("late", jitter="2s", max_late="117s"),
            job("every_second", schedule="* * * * * *", jitter="0s", max_late="30s"),
        ],
    )
    res = run_cli("check", "-c", str(write_config(tmp_path / "c.yaml", cfg)))
    assert res.returncode == 0, res.stderr


def test_no_config_at_all(tmp_path: Path) -> None:
    for cmd, res in both().items():
        assert res.returncode == 2, cmd
        assert one_error_line(res).startswith("no config file: pass -c FILE"), cmd


# ------------------------------------------------------------------ env


def test_env_overrides_are_seen_by_check(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yaml", config())
    env = {
        "ANARCHON_CONFIG": str(path),
        "ANARCHON_NATS_SERVERS": "nats://a.example:4222, tls://b.example:4223",
        "ANARCHON_INSTANCE_ID": "from-env",
    }
    res = run_cli("check", env=env)
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith("config OK: instance from-env, 1 job(s)")
    assert first.endswith("on nats://a.example:4222, tls://b.example:4223")
    # -c wins over ANARCHON_CONFIG
    other = write_config(tmp_path / "other.yaml", config(instance_id="other"))
    res = run_cli("check", "-c", str(other), env={"ANARCHON_CONFIG": str(path)})
    assert res.returncode == 0 and "instance other," in res.stdout


@pytest.mark.parametrize(
    ("variable", "value", "key"),
    [
        ("ANARCHON_METRICS_LISTEN", "nope", "metrics.listen"),
        ("ANARCHON_NATS_SERVERS", "http://x:4222", "nats.servers"),
        ("ANARCHON_INSTANCE_ID", "a\x01b", "instance_id"),
    ],
)
def test_bad_env_overrides_name_key_and_variable(
    tmp_path: Path, variable: str, value: str, key: str
) -> None:
    path = write_config(tmp_path / "c.yaml", config())
    res = run_cli("check", "-c", str(path), env={variable: value})
    assert res.returncode == 2, res.stdout
    line = one_error_line(res)
    assert line.startswith(f"{key}") and line.endswith(f"(set by {variable})"), line


def test_metrics_listen_from_env_is_where_run_serves(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    configured, from_env = free_port(), free_port()
    cfg = config(
        nats={"servers": nats_server.url},
        metrics={"listen": f"127.0.0.1:{configured}"},
    )
    proc = Sidecar(tmp_path, "envport", cfg, {"ANARCHON_METRICS_LISTEN": f"127.0.0.1:{from_env}"})
    proc.metrics_port = from_env
    proc.start()
    try:
        proc.wait_ready()
        assert proc.get("/healthz")[0] == 200
        assert not port_open(configured)
    finally:
        code = proc.terminate()
        proc.kill()
    assert code == 0, proc.log()


# ------------------------------------------------------------------ run: secrets, port


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"target": {"signing_secret_file": "MISSING"}}, "target.signing_secret_file"),
        (
            {"nats": {"servers": "nats://127.0.0.1:4222", "user": "u", "password_file": "MISSING"}},
            "nats.password_file",
        ),
        (
            {"nats": {"servers": "nats://127.0.0.1:4222", "token_file": "MISSING"}},
            "nats.token_file",
        ),
    ],
)
def test_check_and_run_refuse_a_missing_secret_file_alike(
    tmp_path: Path, section: dict[str, dict[str, str]], key: str
) -> None:
    missing = str(tmp_path / "no-such-secret")
    data = config(**section)
    for part in data.values():
        if isinstance(part, dict):
            for name, value in part.items():
                if value == "MISSING":
                    part[name] = missing
    for cmd, res in both("-c", str(write_config(tmp_path / "c.yaml", data))).items():
        assert (cmd, res.returncode, res.stdout) == (cmd, 2, ""), res.stderr
        assert one_error_line(res) == f"{key}: file {missing} does not exist", cmd


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "admin.token_file: cannot read {path}: No such file or directory"),
        ("short\n", "admin.token_file: line 1: a token needs at least 16 characters"),
        ("# none\n", "admin.token_file: the file holds no token"),
    ],
    ids=["missing", "short token", "empty"],
)
def test_check_and_run_refuse_an_unusable_admin_token_file_alike(
    tmp_path: Path, content: str | None, says: str
) -> None:
    tokens = tmp_path / "tokens"
    if content is not None:
        tokens.write_text(content)
    path = write_config(tmp_path / "c.yaml", config(admin={"token_file": str(tokens)}))
    for cmd, res in both("-c", str(path)).items():
        assert (cmd, res.returncode, res.stdout) == (cmd, 2, ""), res.stderr
        assert one_error_line(res) == says.format(path=tokens), cmd


def test_run_with_the_metrics_port_in_use_exits_4_naming_the_port(tmp_path: Path) -> None:
    """A busy port is this host's problem, not the config's: its own exit code."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # nothing answers at the NATS address either: the port is checked first
        cfg = config(
            nats={"servers": f"nats://127.0.0.1:{free_port()}"},
            metrics={"listen": f"127.0.0.1:{port}"},
        )
        started = time.monotonic()
        res = run_cli("run", "-c", str(write_config(tmp_path / "c.yaml", cfg)))
    assert res.returncode == 4, res.stderr
    assert "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last == (
        f"anarchon-sidecar: cannot listen on 127.0.0.1:{port} (metrics.listen): address already"
        " in use: another process on this host listens there (a second sidecar with the same"
        " metrics.listen?)"
    ), last
    assert time.monotonic() - started < 10


# ------------------------------------------------------------------ credentials


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ("file", "nats.servers[0]"),
        ("env", "nats.servers[0]"),
        ("target", "target.url"),
        ("request", "jobs[0].request.url"),
    ],
)
def test_a_malformed_url_is_echoed_without_its_credentials(
    tmp_path: Path, where: str, key: str
) -> None:
    bad = "admin:Sup3rS3cret@127.0.0.1:99999"
    data = config()
    env: dict[str, str] = {}
    if where == "file":
        data["nats"] = {"servers": [f"nats://{bad}"]}
    elif where == "env":
        env["ANARCHON_NATS_SERVERS"] = f"nats://{bad}"
    elif where == "target":
        data["target"] = {"url": f"http://{bad}"}
    else:
        data["jobs"] = [job(request={"url": f"http://{bad}"})]
    path = write_config(tmp_path / "c.yaml", data)
    results = both("-c", str(path), env=env)
    results["stream"] = run_cli("stream", "-c", str(path), env=env)
    for cmd, res in results.items():
        assert res.returncode == 2, (cmd, res.stderr)
        line = one_error_line(res)
        assert line.startswith(f"{key}: "), (cmd, line)
        assert "admin:***@127.0.0.1:99999" in line, (cmd, line)
        assert "Sup3rS3cret" not in res.stderr + res.stdout, cmd


# ------------------------------------------------------------------ version


def test_version() -> None:
    script = shutil.which("anarchon-sidecar", path=sysconfig.get_path("scripts"))
    assert script, "the console script is installed with the package"
    console = subprocess.run(
        [script, "--version"], capture_output=True, text=True, env=sidecar_env(), timeout=60
    )
    module = run_cli("--version")
    for res in (console, module):
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == f"anarchon-sidecar, version {__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", __version__)


def test_help_lists_the_commands() -> None:
    res = run_cli("--help")
    assert res.returncode == 0
    for command in ("run", "check"):
        assert re.search(rf"^\s+{command}\s", res.stdout, re.M), res.stdout
