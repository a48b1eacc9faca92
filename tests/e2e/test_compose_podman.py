"""The sidecar image and the compose stack of deploy/compose, run for real with podman.

`make e2e` runs this (root on Debian; deploy/e2e/install-deps.sh installs
podman, runc, debootstrap and podman-compose first); `make test` does not
collect it (pyproject's addopts ignore tests/e2e). Nothing is pulled:
deploy/e2e/build-images.sh builds a Debian base with debootstrap (cached per
machine), the sidecar image from deploy/Dockerfile, the example app, a NATS
image from the venv's static nats-server and a Prometheus image from Debian's
binary. podman-compose then brings up deploy/compose/compose.yaml with
tests/e2e/compose.override.yaml, which changes only what cannot exist here
(see its header), and the test:

1. checks the image: a non-root user, its size, `--version` and `check`
   inside it (and `check` failing on a bad config);
2. runs every service's compose healthcheck in its container (podman 4.3
   schedules healthchecks with systemd timers, and there is no systemd here,
   so the test runs them), and checks that each sidecar shares its app's
   network namespace;
3. lets the stack run (at least 20 s, until each app has been triggered):
   every slot runs exactly once across the three apps, each app only by its
   own sidecar (the claim's instance is the app's name; the sidecar reaches
   the app at 127.0.0.1), every trigger's signature is valid; Prometheus
   scrapes the three sidecars and has loaded the alert rules;
4. NATS refuses a client without credentials and refuses the sidecars' user
   (`anarchon`, restricted to deploy/nats/permissions.conf) a JetStream API
   subject outside it, and its log shows no permissions violation by the
   sidecars, then or at the end (after the reconnects and `history`);
5. `podman stop` of one sidecar: it exits 0 within the stop grace period and
   is not restarted, the other two carry on;
6. stops NATS over a slot and starts it again: the sidecars reconnect (no
   restart), runs resume, and no slot runs twice.

Every slot's runs are read from the apps' `/runs` and from the stream (with
nats-py through NATS's published loopback port), and cross-checked with
`anarchon-sidecar history --json` inside a sidecar when the image has it.
The test reads the stream as the sidecars' user, with the password of the
compose secret that sidecar.yaml's `nats.password_file` names.
Everything the run starts carries a per-run prefix and is removed at the end,
also when a test fails or the run is interrupted (SIGINT/SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
import pytest
import yaml
from nats.js.errors import NotFoundError

import sidecar
from sidecar.config.fields import parse_duration
from sidecar.config.load import Config, JobConfig, load_config
from tests import support
from tests.podman import PODMAN_ENV, podman

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
OVERRIDE_FILE = Path(__file__).with_name("compose.override.yaml")
BUILD_SCRIPT = ROOT / "deploy" / "e2e" / "build-images.sh"
CONFIG_IN_IMAGE = "/etc/anarchon/sidecar.yaml"

# podman for this test: runc, cgroupfs, file events, no default ulimits
# (deploy/e2e/containers.toml) on vfs storage, whoever calls it (podman-compose too).

MIN_STEADY = 20.0  # seconds the full stack runs before a sidecar is stopped
STEADY_DEADLINE = 240.0  # until each of the three apps has won a slot
SLOTS_AFTER_CHANGE = 2  # heartbeat slots that must run after each change
STALE_AFTER = 3 * 3600  # seconds; an earlier run's images older than this are leftovers


def say(message: str) -> None:
    print(f"e2e: {message}", flush=True)


# ---------------------------------------------------------------- what compose says


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


COMPOSE = _compose()
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
# sidecar service -> the app service whose network namespace it joins
SIDECAR_OF_APP = {
    str(svc["network_mode"]).split(":", 1)[1]: name
    for name, svc in SERVICES.items()
    if str(svc.get("network_mode", "")).startswith("service:")
}
APPS = sorted(SIDECAR_OF_APP)
SIDECARS = [SIDECAR_OF_APP[app] for app in APPS]
# What each app records as its name, and the instance id of its sidecar.
APP_NAME = {app: str(SERVICES[app]["environment"]["APP_NAME"]) for app in APPS}
INSTANCE = {
    app: str(SERVICES[SIDECAR_OF_APP[app]]["environment"]["ANARCHON_INSTANCE_ID"]) for app in APPS
}
SIDECAR_CONFIG_HOST = COMPOSE_DIR / next(
    v.split(":")[0] for v in SERVICES[SIDECARS[0]]["volumes"] if v.split(":")[1] == CONFIG_IN_IMAGE
)
CONFIG: Config = load_config(str(SIDECAR_CONFIG_HOST), {})
TARGET = urlsplit(CONFIG.target.url)
METRICS_PORT = CONFIG.metrics.port
HEARTBEAT = min(CONFIG.jobs, key=lambda j: j.schedule.min_interval_ms())


def _nats_login() -> dict[str, str]:
    """The sidecars' NATS user and password: the test reads the stream as they do.

    The password is the compose secret that sidecar.yaml's nats.password_file
    names (/run/secrets/<secret>), read from its file on this side.
    """
    if CONFIG.nats.user is None:
        return {}
    secret = Path(str(CONFIG.nats.password_file)).name
    raw = (COMPOSE_DIR / COMPOSE["secrets"][secret]["file"]).read_text()
    return {"user": CONFIG.nats.user, "password": raw.removesuffix("\n")}


NATS_LOGIN = _nats_login()
# A subject outside deploy/nats/permissions.conf that the test itself tries.
FORBIDDEN = "$JS.API.STREAM.NAMES"


def grace_seconds(service: str) -> float:
    return parse_duration(SERVICES[service].get("stop_grace_period", "10s"), "stop_grace_period")


# ---------------------------------------------------------------- small tools


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    """tests.support.wait_for with this file's argument order and a coarser poll."""
    return support.wait_for(condition, timeout, interval, what)


def http_get(port: int, path: str, timeout: float = 3.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Phases:
    """Wall-clock time of each phase, printed as they end and as a table at the end."""

    def __init__(self) -> None:
        self.done: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        say(f"--- {name}")
        try:
            yield
        finally:
            took = time.monotonic() - start
            self.done.append((name, took))
            say(f"--- {name}: {took:.1f} s")

    def table(self) -> str:
        width = max((len(n) for n, _ in self.done), default=0)
        lines = [f"  {n.ljust(width)}  {t:7.1f} s" for n, t in self.done]
        total = sum(t for _, t in self.done)
        return "\n".join([*lines, f"  {'total'.ljust(width)}  {total:7.1f} s"])


PHASES = Phases()


# ---------------------------------------------------------------- reading runs


@dataclass
class Window:
    """A stretch of the run in which every slot must run once, by one of `apps`."""

    name: str
    start: float
    end: float
    apps: frozenset[str]


@dataclass
class Stack:
    prefix: str
    images: dict[str, str]
    containers: dict[str, str]  # service -> container name
    ports: dict[tuple[str, int], int] = field(default_factory=dict)
    windows: list[Window] = field(default_factory=list)

    def port(self, service: str, container_port: int) -> int:
        key = (service, container_port)
        if key not in self.ports:
            out = podman("port", self.containers[service], f"{container_port}/tcp").stdout
            self.ports[key] = int(out.strip().splitlines()[0].rsplit(":", 1)[1])
        return self.ports[key]

    def app_runs(self, apps: list[str] | None = None) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = []
        for app in apps or APPS:
            status, body = http_get(self.port(app, TARGET.port or 80), "/runs")
            assert status == 200, f"{app} /runs answered {status}"
            runs.extend(json.loads(body))
        return runs

    def ready(self, app: str) -> bool:
        status, _ = http_get(self.port(app, METRICS_PORT), "/readyz")
        return status == 200

    def metric(self, app: str, name: str) -> float:
        _, body = http_get(self.port(app, METRICS_PORT), "/metrics")
        total = 0.0
        for line in body.decode().splitlines():
            if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stream(self) -> list[tuple[str, dict[str, str], Any]]:
        return asyncio.run(read_stream(f"nats://127.0.0.1:{self.port('nats', 4222)}"))

    def violations(self) -> list[str]:
        """Permission violations in NATS's log, but those of the test's own FORBIDDEN."""
        logs = podman("logs", self.containers["nats"], check=False)
        return [
            line
            for line in (logs.stdout + logs.stderr).splitlines()
            if "violation" in line.lower() and FORBIDDEN not in line
        ]

    def state(self, service: str) -> dict[str, Any]:
        out = podman("inspect", "--format", "json", self.containers[service]).stdout
        data: dict[str, Any] = json.loads(out)[0]
        return data


async def read_stream(url: str) -> list[tuple[str, dict[str, str], Any]]:
    """Every message of the sidecars' stream: (subject, headers, JSON body)."""
    nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False, **NATS_LOGIN)
    try:
        js = nc.jetstream()
        info = await js.stream_info(CONFIG.nats.stream)
        msgs = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(CONFIG.nats.stream, seq)
            except NotFoundError:
                continue
            msgs.append((msg.subject, dict(msg.headers or {}), json.loads(msg.data or b"null")))
        return msgs
    finally:
        await nc.close()


async def try_forbidden(url: str) -> list[str]:
    """The errors NATS sends the sidecars' user for asking FORBIDDEN."""
    errors: list[str] = []
    told = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))
        told.set()

    nc = await nats.connect(
        url, connect_timeout=5, allow_reconnect=False, error_cb=on_error, **NATS_LOGIN
    )
    try:
        with contextlib.suppress(Exception):
            await nc.request(FORBIDDEN, b"", timeout=2)
        await nc.flush(timeout=5)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(told.wait(), 5)
    finally:
        await nc.close()
    return errors


def slots_between(job: JobConfig, start: float, end: float) -> list[int]:
    """The job's slots (epoch ms) in [start, end] (epoch seconds)."""
    slots, after = [], int(start * 1000) - 1
    while (slot := job.schedule.next_slot(after)) <= end * 1000:
        slots.append(slot)
        after = slot
    return slots


def heartbeat_slots_after(runs: list[dict[str, Any]], after: float) -> set[int]:
    return {
        int(r["slot"]) for r in runs if r["job"] == HEARTBEAT.name and int(r["slot"]) > after * 1000
    }


def audit(stack: Stack, now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Check every slot so far from the stream and the apps; return (claims, app runs)."""
    msgs = stack.stream()
    runs = stack.app_runs()
    prefix = CONFIG.nats.prefix
    claims = [d for s, _, d in msgs if s.startswith(prefix) and s.endswith(".claims")]
    results = {d["token"]: d for s, _, d in msgs if s.startswith(prefix) and s.endswith(".results")}
    for subject, headers, data in msgs:
        if subject.endswith(".claims") and not data.get("manual"):
            assert headers.get("Nats-Msg-Id") == f"{data['job']}:{data['slot']}", (subject, headers)
    scheduled = [c for c in claims if not c.get("manual")]
    by_token = {c["token"]: c for c in claims}
    twice = [k for k, n in Counter((c["job"], c["slot"]) for c in scheduled).items() if n > 1]
    assert not twice, f"slots claimed twice in the stream: {twice}"

    ran = Counter((r["job"], int(r["slot"])) for r in runs)
    twice = [k for k, n in ran.items() if n > 1]
    assert not twice, f"slots run more than once across the apps: {twice}\n{runs}"
    for r in runs:
        # Each trigger came from the app's own sidecar: the claim that won the
        # slot is by the instance that shares this app's network namespace.
        claim = by_token.get(r["run_id"])
        assert claim is not None, f"{r['app']} got a trigger with no claim in the stream: {r}"
        assert (claim["job"], claim["slot"]) == (r["job"], int(r["slot"])), (claim, r)
        app = next(a for a in APPS if APP_NAME[a] == r["app"])
        assert claim["instance"] == INSTANCE[app], f"{r['app']} triggered by {claim['instance']}"
        assert r["signature"] == "valid", r
    tokens = Counter(r["run_id"] for r in runs)
    for c in scheduled:
        job = CONFIG.job(c["job"])
        if c["slot"] / 1000 + job.jitter + 3 > now:
            continue  # may still be on its way to the app
        assert tokens[c["token"]] == 1, f"claim without exactly one trigger: {c}"
        result = results.get(c["token"])
        assert result is not None and result["status"] == "succeeded", (c, result)
        assert result["instance"] == c["instance"], (c, result)

    # No slot missed while the sidecars were up, and only the expected apps ran them.
    by_slot = {(r["job"], int(r["slot"])): r["app"] for r in runs}
    for window in stack.windows:
        for job in CONFIG.jobs:
            end = min(window.end, now) - job.jitter - 2
            for slot in slots_between(job, window.start, end):
                app = by_slot.get((job.name, slot))
                assert app is not None, f"{window.name}: {job.name} slot {slot} did not run"
                assert app in window.apps, f"{window.name}: slot {slot} ran on {app}"
    return claims, runs


# ---------------------------------------------------------------- the stack


def podman_compose() -> str:
    found = shutil.which("podman-compose", path=str(Path(sys.executable).parent))
    found = found or shutil.which("podman-compose")
    if not found:
        pytest.fail("podman-compose is missing: run deploy/e2e/install-deps.sh (make e2e does)")
    return found


def compose(prefix: str, images: dict[str, str], *args: str, timeout: float = 300) -> str:
    cmd = [
        podman_compose(),
        "--project-name",
        prefix,
        "--in-pod",
        "false",
        "-f",
        str(COMPOSE_FILE),
        "-f",
        str(OVERRIDE_FILE),
        *args,
    ]
    proc = subprocess.run(
        cmd,
        cwd=COMPOSE_DIR,
        env={**os.environ, **PODMAN_ENV, **images},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"podman-compose {' '.join(args)} exited {proc.returncode}:\n{output}")
    return output


def build_images(prefix: str, workdir: Path) -> dict[str, str]:
    env_file, log = workdir / "images.env", workdir / "build.log"
    with log.open("w") as out:
        proc = subprocess.run(
            ["bash", str(BUILD_SCRIPT), prefix, str(env_file)],
            env={**os.environ, **PODMAN_ENV, "PYTHON": sys.executable},
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    lines = log.read_text().splitlines()
    for line in lines:
        if line.startswith("build-images:"):
            say(line)
    if proc.returncode != 0:
        raise AssertionError("build-images.sh failed:\n" + "\n".join(lines[-60:]))
    return dict(line.split("=", 1) for line in env_file.read_text().split())


def remove_everything(prefix: str, images: dict[str, str]) -> None:
    """Whatever the run created, also when podman-compose down did not get to it."""
    if images:
        with contextlib.suppress(Exception):
            compose(prefix, images, "down", "--volumes", "--timeout", "45", timeout=180)
    label = f"io.podman.compose.project={prefix}"
    ids = podman("ps", "-aq", "--filter", f"label={label}", check=False).stdout.split()
    if ids:
        podman("rm", "--force", "--time", "5", *ids, check=False)
    for kind in ("volume", "network"):
        names = podman(kind, "ls", "--format", "{{.Name}}", check=False).stdout.split()
        mine = [n for n in names if n.startswith(f"{prefix}_")]
        if mine:
            podman(kind, "rm", "--force", *mine, check=False)
    ids = podman("images", "-q", "--filter", f"label=anarchon-e2e={prefix}", check=False).stdout
    if ids.split():
        podman("rmi", "--force", *sorted(set(ids.split())), check=False)
    left = [
        podman("ps", "-aq", "--filter", f"label={label}", check=False).stdout.split(),
        podman(
            "images", "-q", "--filter", f"label=anarchon-e2e={prefix}", check=False
        ).stdout.split(),
    ]
    say(f"removed the run's containers, volumes, network and images (left: {left})")


def sweep_stale() -> None:
    """Remove what runs killed outright (SIGKILL, a machine stop) left behind.

    Each run's images carry `anarchon-e2e=PREFIX` and are made at its start;
    no run lasts STALE_AFTER, so older ones belong to runs that are gone.
    """
    out = podman("images", "--filter", "label=anarchon-e2e", "--format", "json", check=False)
    now = time.time()
    stale = {
        image["Labels"]["anarchon-e2e"]
        for image in json.loads(out.stdout or "[]")
        if now - image["Created"] > STALE_AFTER
    }
    for prefix in sorted(stale):
        say(f"removing the leftovers of an earlier run, {prefix}")
        remove_everything(prefix, {})


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    if os.geteuid() != 0 or not shutil.which("podman"):
        pytest.fail("the e2e test needs root and podman: run it with `make e2e`")
    prefix = f"anarchon-e2e-{secrets.token_hex(4)}"
    say(f"run prefix {prefix}")
    sweep_stale()
    old_term = signal.signal(signal.SIGTERM, _interrupt)  # clean up on SIGTERM too
    images: dict[str, str] = {}
    workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    try:
        with PHASES("build images (build-images.sh)"):
            images = build_images(prefix, workdir)
        for name, image in images.items():
            size = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout)
            say(f"image {image} ({name}): {size / 1e6:.1f} MB")
        with PHASES("compose up (podman-compose)"):
            up = compose(prefix, images, "up", "--detach", "--no-build")
            (workdir / "compose-up.log").write_text(up)
            for line in up.splitlines():
                if "WARNING" in line:
                    say(f"podman-compose: {line}")
            out = podman(
                "ps", "-a", "--filter", f"label=io.podman.compose.project={prefix}",
                "--format", "json",
            ).stdout  # fmt: skip
            containers = {
                c["Labels"]["com.docker.compose.service"]: c["Names"][0] for c in json.loads(out)
            }
            stack = Stack(prefix, images, containers)
            expected = set(SERVICES) - {"grafana"}
            assert set(containers) == expected, f"started {sorted(containers)}"
        yield stack
    finally:
        with PHASES("clean up"):
            if request.session.testsfailed and images:
                for name in podman(
                    "ps", "-a", "--format", "{{.Names}}", check=False
                ).stdout.split():
                    if name.startswith(prefix):
                        logs = podman("logs", "--tail", "40", name, check=False)
                        say(f"logs of {name}:\n{logs.stdout}{logs.stderr}")
            remove_everything(prefix, images)
            shutil.rmtree(workdir, ignore_errors=True)
        signal.signal(signal.SIGTERM, old_term)
        say("phases:\n" + PHASES.table())


# ---------------------------------------------------------------- the tests


def test_image_runs_as_non_root_and_its_commands_work(stack: Stack, tmp_path: Path) -> None:
    with PHASES("image checks"):
        image = stack.images["SIDECAR_IMAGE"]
        user = podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
        assert user and user.split(":")[0] not in ("", "0", "root"), f"image user {user!r}"
        sidecar2 = stack.containers[SIDECARS[1]]
        wait_for(
            lambda: (
                podman("inspect", "--format", "{{.State.Running}}", sidecar2).stdout.strip()
                == "true"
            ),
            60,
            f"{sidecar2} running",
        )
        ident = podman("exec", sidecar2, "id").stdout.strip()
        assert ident.startswith(f"uid={user.split(':')[0]}("), ident
        say(f"image user {user}; inside {sidecar2}: {ident}")

        version = podman("run", "--rm", "--network", "none", image, "--version").stdout
        assert version.strip() == f"anarchon-sidecar, version {sidecar.__version__}", version
        check = podman("exec", sidecar2, "anarchon-sidecar", "check", "-c", CONFIG_IN_IMAGE)
        for job in CONFIG.jobs:
            assert job.name in check.stdout, check.stdout
        say(f"in the image: {version.strip()}; check:\n{check.stdout.rstrip()}")

        # check must be able to fail: a jitter that is longer than the duplicate window.
        bad = yaml.safe_load(SIDECAR_CONFIG_HOST.read_text())
        bad["jobs"][0]["jitter"] = "1h"
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
        (tmp_path / "bad.yaml").chmod(0o644)
        proc = podman(
            "run", "--rm", "--network", "none",
            "-v", f"{tmp_path / 'bad.yaml'}:{CONFIG_IN_IMAGE}:ro",
            image, "check", "-c", CONFIG_IN_IMAGE,
            check=False,
        )  # fmt: skip
        assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
        assert "jobs[0].jitter" in proc.stdout + proc.stderr, proc.stderr


def test_healthchecks_pass_and_sidecars_share_their_apps_network(stack: Stack) -> None:
    with PHASES("healthchecks, network namespaces"):
        for app in APPS:
            sidecar_ = SIDECAR_OF_APP[app]
            mode = stack.state(sidecar_)["HostConfig"]["NetworkMode"]
            app_id = stack.state(app)["Id"]
            assert mode == f"container:{app_id}", f"{sidecar_} network mode {mode}"
        assert TARGET.hostname == "127.0.0.1", CONFIG.target.url
        # The compose healthchecks, run in the real containers until they pass.
        for service, svc in SERVICES.items():
            if service not in stack.containers or not svc.get("healthcheck", {}).get("test"):
                continue
            if service == "nats":
                continue  # the override disables it: no wget in a FROM-scratch image
            name = stack.containers[service]
            wait_for(
                lambda name=name: podman("healthcheck", "run", name, check=False).returncode == 0,
                60,
                f"the healthcheck of {name}",
                interval=1,
            )
        say(f"healthchecks pass; each of {SIDECARS} is in its app's network namespace")


def test_every_slot_runs_once_across_three_apps(stack: Stack) -> None:
    with PHASES("three sidecars: every slot once"):
        wait_for(lambda: all(stack.ready(app) for app in APPS), 90, "all sidecars /readyz 200")
        start = time.time()
        stack.windows.append(
            Window("three sidecars", start, float("inf"), frozenset(APP_NAME.values()))
        )
        prometheus = stack.port("prometheus", 9090)

        def prometheus_ok() -> bool:
            _, body = http_get(prometheus, "/api/v1/targets")
            targets = json.loads(body)["data"]["activeTargets"]
            up = {t["labels"]["instance"] for t in targets if t["health"] == "up"}
            _, body = http_get(prometheus, "/api/v1/rules")
            groups = json.loads(body)["data"]["groups"]
            return up == {f"{app}:{METRICS_PORT}" for app in APPS} and bool(groups)

        def steady() -> bool:
            runs = stack.app_runs()
            by_app = Counter(r["app"] for r in runs)
            return (
                time.time() - start >= MIN_STEADY
                and all(by_app[APP_NAME[app]] > 0 for app in APPS)
                and len(heartbeat_slots_after(runs, start)) >= SLOTS_AFTER_CHANGE
                and prometheus_ok()
            )

        wait_for(steady, STEADY_DEADLINE, "every app triggered, Prometheus scraping", interval=1)
        claims, runs = audit(stack, time.time())
        by_app = Counter(r["app"] for r in runs)
        say(
            f"{len(runs)} runs in {time.time() - start:.0f} s, each slot once: {dict(by_app)}; "
            f"{len(claims)} claims in the stream; Prometheus scrapes the 3 sidecars"
        )


def test_nats_admits_only_the_restricted_sidecar_user(stack: Stack) -> None:
    """The sidecars ran as a user with exactly deploy/nats/permissions.conf."""
    with PHASES("NATS users and permissions"):
        assert NATS_LOGIN, "the compose sidecar.yaml connects without a user"
        port = stack.port("nats", 4222)
        refused = support.anonymous_connect("127.0.0.1", port)
        assert refused == "-ERR 'Authorization Violation'", refused
        errors = asyncio.run(try_forbidden(f"nats://127.0.0.1:{port}"))
        denied = f'permissions violation for publish to "{FORBIDDEN.lower()}"'
        assert any(denied in e.lower() for e in errors), errors
        # Everything the sidecars did so far (claims, results, presence, the
        # stream and bucket set up) was allowed.
        assert not stack.violations(), stack.violations()
        say(
            f"NATS refuses a client without credentials ({refused}); user "
            f"{NATS_LOGIN['user']} is refused {FORBIDDEN} ({errors[0]}); "
            "no violation by the sidecars"
        )


def test_stopped_sidecar_drains_and_the_others_carry_on(stack: Stack) -> None:
    with PHASES("stop one sidecar"):
        first_app, stopped = APPS[0], SIDECAR_OF_APP[APPS[0]]
        others = APPS[1:]
        grace = grace_seconds(stopped)
        stack.windows[-1].end = time.time()
        began = time.monotonic()
        podman("stop", "--time", f"{grace:g}", stack.containers[stopped], timeout=grace + 30)
        took = time.monotonic() - began
        stopped_at = time.time()
        state = stack.state(stopped)["State"]
        say(f"podman stop {stack.containers[stopped]}: {took:.1f} s, exit {state['ExitCode']}")
        assert state["ExitCode"] == 0 and took < grace, (state, took)
        stack.windows.append(
            Window("two sidecars", stopped_at, float("inf"), frozenset(APP_NAME[a] for a in others))
        )
        wait_for(
            lambda: (
                len(heartbeat_slots_after(stack.app_runs(others), stopped_at)) >= SLOTS_AFTER_CHANGE
            ),
            60,
            f"{SLOTS_AFTER_CHANGE} slots run by the other two",
            interval=1,
        )
        state = stack.state(stopped)["State"]
        assert state["Status"] == "exited", f"{stopped} restarted after podman stop: {state}"
        late = [r for r in stack.app_runs([first_app]) if int(r["slot"]) > stopped_at * 1000]
        assert not late, f"{first_app} triggered after its sidecar stopped: {late}"
        _, runs = audit(stack, time.time())
        say(f"the other two carry on: {len(runs)} runs, each slot once")


def test_nats_restart_sidecars_reconnect_and_no_slot_runs_twice(stack: Stack) -> None:
    with PHASES("NATS stop and start"):
        running = APPS[1:]
        restarts = {a: stack.state(SIDECAR_OF_APP[a])["RestartCount"] for a in running}
        reconnects = {a: stack.metric(a, "anarchon_nats_reconnects_total") for a in running}
        stack.windows[-1].end = time.time()
        podman("stop", "--time", "10", stack.containers["nats"], timeout=40)
        down_at = time.time()
        wait_for(
            lambda: not any(stack.ready(a) for a in running),
            30,
            "sidecars /readyz 503",
            interval=0.5,
        )
        # Keep NATS down over one heartbeat slot (and its max_late).
        missed = HEARTBEAT.schedule.next_slot(int(down_at * 1000)) / 1000
        wait_for(
            lambda: time.time() > missed + HEARTBEAT.jitter + 1,
            missed - time.time() + 15,
            "a slot to pass while NATS is down",
        )
        podman("start", stack.containers["nats"])
        stack.ports.pop(("nats", 4222), None)
        say(f"NATS was down {time.time() - down_at:.1f} s (over slot {int(missed * 1000)})")
        wait_for(lambda: all(stack.ready(a) for a in running), 60, "sidecars /readyz 200 again")
        back = time.time()
        stack.windows.append(
            Window(
                "after NATS restart", back, float("inf"), frozenset(APP_NAME[a] for a in running)
            )
        )
        wait_for(
            lambda: len(heartbeat_slots_after(stack.app_runs(running), back)) >= SLOTS_AFTER_CHANGE,
            60,
            f"{SLOTS_AFTER_CHANGE} slots run after the reconnect",
            interval=1,
        )
        for app in running:
            assert stack.state(SIDECAR_OF_APP[app])["RestartCount"] == restarts[app], (
                f"{SIDECAR_OF_APP[app]} was restarted instead of reconnecting"
            )
            assert stack.metric(app, "anarchon_nats_reconnects_total") > reconnects[app]
        claims, runs = audit(stack, time.time())
        say(f"reconnected and resumed: {len(runs)} runs in all, no slot twice")

    with PHASES("history cross-check"):
        name = stack.containers[SIDECAR_OF_APP[running[0]]]
        has_history = podman("exec", name, "anarchon-sidecar", "history", "--help", check=False)
        if has_history.returncode != 0:
            say("this image has no `anarchon-sidecar history`: cross-check skipped")
            return
        out = podman(
            "exec", name, "anarchon-sidecar", "history", HEARTBEAT.name,
            "-c", CONFIG_IN_IMAGE, "--json", "--limit", "100000",
        ).stdout  # fmt: skip
        history = [json.loads(line) for line in out.splitlines() if line.strip()]
        from_history = {(h["slot"], h["instance"]) for h in history if not h["manual"]}
        from_stream = {
            (c["slot"], c["instance"])
            for c in claims
            if c["job"] == HEARTBEAT.name and not c.get("manual")
        }
        assert from_history == from_stream
        from_apps = {(int(r["slot"]), r["app"]) for r in runs if r["job"] == HEARTBEAT.name}
        assert from_apps <= from_history
        assert all(
            h["status"] == "succeeded" for h in history if (h["slot"], h["instance"]) in from_apps
        )
        say(f"`anarchon-sidecar history --json` in {name} agrees: {len(history)} runs")
        # The CLI and the reconnects too ran within the user's permissions.
        assert not stack.violations(), stack.violations()
