"""The Ansible role on real hosts: Debian 12 containers booted with systemd as PID 1.

`make hosts` runs this (root on Debian, podman; `make test` does not collect
it: pyproject's addopts ignore tests/hosts). Ansible reaches the hosts with
the `containers.podman.podman` connection (`podman exec`, no ssh), as it
would reach VMs. The sequence is Molecule's: create, converge, idempotence,
verify, destroy; the tests run in this file's order on one pair of hosts
(module-scoped), each leaving the hosts converged for the next.

- create: one root filesystem from debootstrap (`systemd`, `python3`,
  `python3-venv`, nothing else; the tarball is cached per machine like the
  e2e base), imported once per run, two hosts booted from it in parallel
  with `--network host`, so they reach the nats-server and the recording
  app that run on this machine's loopback, as app hosts reach theirs. The
  server's only user is the sidecars' (`anarchon`), restricted to
  deploy/nats/permissions.conf as the role's README asks; its log shows no
  permissions violation at the end.
- converge: `ansible-playbook` with the role, the venv method, from a
  wheelhouse built on this machine (the project's wheel and its
  dependencies'): the hosts reach no package index. The Debian mirror of the
  machine's apt sources is reachable, so the role installs its own
  prerequisites with apt.
- verify: the issue's checks (tests below), against real systemd units.
- destroy: every container and image of the run is removed in the fixture's
  `finally`, also when a test fails or the run is interrupted.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import sidecar
from tests.podman import PODMAN_ENV, podman
from tests.support import ROOT, NatsServer, RecordingApp, free_port, read_stream
from tests.support import wait_for as _wait_for

pytestmark = pytest.mark.hosts

ROLE_DIR = ROOT / "ansible" / "roles"
SUITE = "bookworm"
PACKAGES = "systemd,systemd-sysv,dbus,python3,python3-venv,ca-certificates"
SERVICE = "anarchon-sidecar"
CONFIG = "/etc/anarchon/sidecar.yaml"
SECRETS_DIR = "/etc/anarchon/secrets"
UNIT = f"/etc/systemd/system/{SERVICE}.service"
VENV = "/opt/anarchon-sidecar/venv"
RESTART_SEC = 5  # the role's default anarchon_sidecar_restart_sec
STOP_TIMEOUT = 40  # the role's default anarchon_sidecar_stop_timeout
# The sidecars' NATS user, restricted to deploy/nats/permissions.conf as the
# role's README says, and its password: never to be seen.
NATS_USER = "anarchon"
PASSWORD = "nats-password-" + secrets.token_hex(8)
SIGNING = "signing-secret-" + secrets.token_hex(8)
CONFIG_TASK = "Write the config, checked by anarchon-sidecar check"
HANDLER = "Restart anarchon-sidecar"
STALE_AFTER = 3 * 3600  # an earlier run's image older than this is a leftover

TICK = {"name": "tick", "schedule": "* * * * * *", "jitter": "0s", "request": {"path": "/tick"}}

PLAYBOOK = """\
- name: Converge anarchon_sidecar on the test hosts
  hosts: all
  gather_facts: false
  roles:
    - role: anarchon_sidecar
"""


def say(message: str) -> None:
    print(f"hosts: {message}", flush=True)


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    return _wait_for(condition, timeout, interval, what)


# ---------------------------------------------------------------- the image


def mirror() -> str:
    """The first Debian mirror of this machine's apt sources (as build-images.sh)."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.list")]:
        if path.exists():
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) > 2 and parts[0] == "deb" and "security" not in parts[1]:
                    return parts[1]
    raise AssertionError("no Debian mirror in the apt sources")


def host_rootfs(suite: str = SUITE, packages: str = PACKAGES) -> Path:
    """The hosts' root filesystem as a tarball, made with debootstrap once per machine."""
    cache = Path(
        os.environ.get("E2E_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "anarchon-e2e"
    )
    cache.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(f"{suite}|{packages}|systemd-1".encode()).hexdigest()[:12]
    tarball = cache / f"debian-systemd-{suite}-{key}.tar"
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one debootstrap at a time per machine
        if tarball.exists() and tarball.stat().st_size > 0:
            say(f"host root filesystem from the cache ({tarball.name})")
            return tarball
        work = Path(tempfile.mkdtemp(prefix="anarchon-hosts-rootfs-"))
        try:
            rootfs, url = work / "rootfs", mirror()
            say(f"debootstrap {suite} with {packages} (not cached yet)")
            proc = subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={packages}",
                    suite,
                    str(rootfs),
                    url,
                ],
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            # What a slim image leaves out; apt's lists too (the role updates them).
            for sub in ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
                shutil.rmtree(rootfs / sub, ignore_errors=True)
            (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
            (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True)
            tmp = tarball.with_suffix(".tmp")
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tmp), "."], check=True)
            tmp.rename(tarball)
            return tarball
        finally:
            shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- the wheels


def build_wheelhouse(out: Path, version: str | None = None) -> Path:
    """The project's wheel and its dependencies' wheels (Python 3.11, the hosts').

    With `version`, the project is built from a copy whose version is changed:
    a newer release to upgrade to.
    """
    src = out.parent / f"src-{out.name}"
    shutil.copytree(ROOT / "sidecar", src / "sidecar", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    if version:
        init = src / "sidecar" / "__init__.py"
        text = init.read_text()
        assert f'__version__ = "{sidecar.__version__}"' in text
        init.write_text(text.replace(sidecar.__version__, version, 1))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-cache-dir",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shutil.rmtree(src)
    return out


# ---------------------------------------------------------------- hosts and plays


@dataclass
class Host:
    name: str
    metrics_port: int

    def sh(self, command: str, check: bool = True, timeout: float = 60) -> str:
        proc = podman("exec", self.name, "sh", "-c", command, check=False, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{self.name}: {command} exited {proc.returncode}:\n{proc.stderr}")
        return proc.stdout.strip()

    def show(self, prop: str) -> str:
        return self.sh(f"systemctl show -p {prop} --value {SERVICE}")

    def main_pid(self) -> int:
        return int(self.show("MainPID"))

    def active(self) -> bool:
        return self.sh(f"systemctl is-active {SERVICE}", check=False) == "active"

    def http_get(self, path: str) -> tuple[int, str]:
        """An HTTP GET of the sidecar's admin server, from inside the host."""
        script = (
            "import sys, urllib.request, urllib.error\n"
            "try:\n"
            f"    r = urllib.request.urlopen('http://127.0.0.1:{self.metrics_port}{path}',"
            " timeout=3)\n"
            "    print(r.status); print(r.read().decode())\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n"
            "except OSError:\n    print(0)\n"
        )
        out = podman("exec", self.name, "python3", "-c", script, check=False).stdout
        status, _, body = out.partition("\n")
        return int(status.strip() or 0), body

    def http_status(self, path: str) -> int:
        return self.http_get(path)[0]

    def ready(self) -> bool:
        return self.active() and self.http_status("/readyz") == 200

    def journal(self, since: float | None = None) -> str:
        after = f" --since @{since:.0f}" if since is not None else ""
        return self.sh(f"journalctl --no-pager -o cat -u {SERVICE}{after}", check=False)


RECAP = re.compile(
    r"^(?P<host>\S+)\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)
HEADING = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(?:anarchon_sidecar : )?(?P<name>.*?)\] \**$")


@dataclass
class Play:
    rc: int
    output: str
    seconds: float

    @property
    def recap(self) -> dict[str, dict[str, int]]:
        found = {
            m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"}
            for m in RECAP.finditer(self.output)
        }
        assert found, f"no recap in the output:\n{self.output}"
        return found

    def changed(self) -> int:
        return sum(r["changed"] for r in self.recap.values())

    def assert_ok(self) -> Play:
        assert self.rc == 0 and all(r["failed"] == 0 for r in self.recap.values()), self.output
        return self

    def task(self, name: str) -> str:
        """The output of every run of the task (or handler) called `name`."""
        lines: list[str] = []
        current = False
        for line in self.output.splitlines():
            heading = HEADING.match(line)
            if heading:
                current = heading["name"] == name
            elif line.startswith("PLAY RECAP"):
                current = False
            elif current:
                lines.append(line)
        assert lines, f"task {name!r} did not run:\n{self.output}"
        return "\n".join(lines)


@dataclass
class World:
    workdir: Path
    hosts: list[Host]
    nats: NatsServer
    app: RecordingApp
    wheelhouse: Path
    env: dict[str, str]
    plays: list[Play] = field(default_factory=list)
    preflight_play: Play | None = None
    untouched: bool = False  # no virtualenv on the hosts after the refused play
    fresh_check_play: Play | None = None
    untouched_by_check: bool = False
    first_play: Play | None = None

    @property
    def nats_url(self) -> str:
        return f"nats://{NATS_USER}:{PASSWORD}@127.0.0.1:{self.nats.port}"

    def vars(self, **overrides: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "anarchon_sidecar_package_spec": f"anarchon-sidecar=={sidecar.__version__}",
            "anarchon_sidecar_wheelhouse": str(self.wheelhouse),
            "anarchon_sidecar_nats_servers": [self.nats.url],
            "anarchon_sidecar_nats_user": NATS_USER,
            "anarchon_sidecar_nats_password": PASSWORD,
            "anarchon_sidecar_target_url": self.app.url,
            "anarchon_sidecar_target_signing_secret": SIGNING,
            "anarchon_sidecar_jobs": [TICK],
        }
        base.update(overrides)
        return base

    def play(self, variables: dict[str, Any], *, check: bool = False, limit: str = "") -> Play:
        vars_file = self.workdir / "vars.json"
        vars_file.write_text(json.dumps(variables))
        cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "inventory.ini"]
        cmd += ["--diff", "-e", f"@{vars_file}", "playbook.yml"]
        if check:
            cmd.append("--check")
        if limit:
            cmd += ["--limit", limit]
        started = time.monotonic()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=self.env, cwd=self.workdir, timeout=600
        )
        play = Play(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started)
        self.plays.append(play)
        n = len(self.plays)
        (self.workdir / f"play-{n}.log").write_text(play.output)
        say(f"play {n}{' --check' if check else ''}: rc {play.rc}, {play.seconds:.1f} s")
        return play

    # -- what happened, from the stream and the app

    def stream(self) -> list[Any]:
        return read_stream(self.nats_url)

    def app_slots(self, job: str = "tick") -> Counter[int]:
        with self.app._lock:
            requests = list(self.app.requests)
        return Counter(
            int(r.headers["X-Anarchon-Slot"])
            for r in requests
            if r.headers.get("X-Anarchon-Job") == job
        )

    def assert_no_slot_twice(self) -> None:
        """No (job, slot) reached the app twice, nor was claimed twice in the stream."""
        with self.app._lock:
            requests = list(self.app.requests)
        ran = Counter(
            (r.headers.get("X-Anarchon-Job"), r.headers.get("X-Anarchon-Slot")) for r in requests
        )
        twice = [k for k, n in ran.items() if n > 1]
        assert not twice, f"slots run twice at the app: {twice}"
        claims = Counter(
            (m.data["job"], m.data["slot"])
            for m in self.stream()
            if m.subject.endswith(".claims") and not m.data.get("manual")
        )
        twice = [k for k, n in claims.items() if n > 1]
        assert not twice, f"slots claimed twice in the stream: {twice}"

    def instances_since(self, since: float) -> Counter[str]:
        with self.app._lock:
            requests = list(self.app.requests)
        return Counter(r.headers.get("X-Anarchon-Instance", "") for r in requests if r.at > since)


def write_inventory(workdir: Path, hosts: list[Host], extra: str = "") -> None:
    lines = ["[anarchon_sidecar]"]
    for host in hosts:
        lines.append(
            f"{host.name} ansible_connection=containers.podman.podman"
            " ansible_python_interpreter=/usr/bin/python3"
            f" anarchon_sidecar_metrics_listen=127.0.0.1:{host.metrics_port}{extra}"
        )
    (workdir / "inventory.ini").write_text("\n".join(lines) + "\n")
    (workdir / "playbook.yml").write_text(PLAYBOOK)
    (workdir / "ansible.cfg").write_text("[defaults]\n")


def ansible_env(workdir: Path) -> dict[str, str]:
    home = workdir / "ansible-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "ANARCHON_"))}
    env.update(PODMAN_ENV)
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        ANSIBLE_CONFIG=str(workdir / "ansible.cfg"),
        ANSIBLE_HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
        ANSIBLE_ROLES_PATH=str(ROLE_DIR),
        ANSIBLE_NOCOLOR="true",
        ANSIBLE_FORCE_COLOR="false",
        ANSIBLE_RETRY_FILES_ENABLED="false",
        ANSIBLE_STDOUT_CALLBACK="default",
        ANSIBLE_DEPRECATION_WARNINGS="false",
        ANSIBLE_HOST_KEY_CHECKING="false",
        ANSIBLE_FORKS="4",
        # Each task's time in the play logs (ansible.posix ships with `ansible`).
        ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks",
    )
    return env


def remove_everything(prefix: str) -> None:
    names = podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
    mine = [n for n in names if n.startswith(f"{prefix}-")]
    if mine:
        podman("rm", "--force", "--time", "5", *mine, check=False, timeout=180)
    ids = podman("images", "-q", "--filter", f"label=anarchon-hosts={prefix}", check=False).stdout
    if ids.split():
        podman("rmi", "--force", *sorted(set(ids.split())), check=False, timeout=180)
    left = podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
    say(f"removed the run's hosts and image (left: {[n for n in left if n.startswith(prefix)]})")


def sweep_stale() -> None:
    """What runs killed outright (SIGKILL, a machine stop) left behind."""
    out = podman("images", "--filter", "label=anarchon-hosts", "--format", "json", check=False)
    now = time.time()
    for image in json.loads(out.stdout or "[]"):
        if now - image["Created"] > STALE_AFTER:
            prefix = image["Labels"]["anarchon-hosts"]
            say(f"removing the leftovers of an earlier run, {prefix}")
            remove_everything(prefix)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def boot(name: str, image: str, *extra: str) -> None:
    # Host network: the hosts reach this machine's loopback (NATS, the app, the
    # Debian mirror) like app hosts reach theirs.
    podman(
        "run", "-d", "--name", name, "--hostname", name, "--network", "host",
        "--systemd=always", "--label", f"anarchon-hosts={name.rsplit('-', 1)[0]}",
        *extra, image, "/sbin/init",
    )  # fmt: skip
    wait_for(
        lambda: (
            podman("exec", name, "systemctl", "is-system-running", check=False).stdout.strip()
            in ("running", "degraded")
        ),
        90,
        f"systemd running in {name}",
    )


def restricted_nats(workdir: Path) -> NatsServer:
    """A nats-server whose only user is the sidecars', with deploy/nats/permissions.conf."""
    nats = NatsServer(
        workdir,
        extra_conf=(
            'include "permissions.conf"\n'
            f'authorization {{ users = [\n  {{user: {NATS_USER}, password: "{PASSWORD}", '
            "permissions: $ANARCHON_SIDECAR_PERMISSIONS}\n] }\n"
        ),
    )
    nats.store_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "deploy" / "nats" / "permissions.conf", nats.store_dir)  # beside its config
    return nats


def nats_violations(nats: NatsServer) -> list[str]:
    """The permissions violations in the server's log (none when the role's sidecars
    need nothing beyond deploy/nats/permissions.conf)."""
    log = nats.log_path.read_text(errors="replace").splitlines()
    return [line for line in log if "violation" in line.lower()]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if os.geteuid() != 0 or not shutil.which("podman") or not shutil.which("debootstrap"):
        pytest.fail("the hosts test needs root, podman and debootstrap: run it with `make hosts`")
    prefix = f"anarchon-hosts-{secrets.token_hex(4)}"
    say(f"run prefix {prefix}")
    sweep_stale()
    old_term = signal.signal(signal.SIGTERM, _interrupt)
    workdir = tmp_path_factory.mktemp("hosts")
    nats = restricted_nats(workdir / "nats")
    app = RecordingApp()
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(2) as pool:
            wheels = pool.submit(build_wheelhouse, workdir / "wheelhouse")
            tarball = host_rootfs()
            image = f"localhost/{prefix}-host:{SUITE}"
            podman(
                "import", "--quiet", "--change", f"LABEL anarchon-hosts={prefix}",
                str(tarball), image, timeout=300,
            )  # fmt: skip
            say(f"image {image}: {time.monotonic() - started:.1f} s")
            hosts = [Host(f"{prefix}-h{i}", free_port()) for i in (1, 2)]
            list(pool.map(lambda h: boot(h.name, image), hosts))
            wheelhouse = wheels.result()
        version = hosts[0].sh("systemctl --version | head -n 1")
        say(f"hosts booted ({version}): {time.monotonic() - started:.1f} s")
        nats.start()
        app.start()
        write_inventory(workdir, hosts)
        world = World(workdir, hosts, nats, app, wheelhouse, ansible_env(workdir))
        # A host without the packages and the role told not to install them.
        world.preflight_play = world.play(world.vars(anarchon_sidecar_install_os_packages=False))
        world.untouched = all(
            h.sh(f"test -e {VENV} || echo absent") == "absent" for h in world.hosts
        )
        # Check mode on the fresh hosts: it reports what it would do, changes nothing.
        world.fresh_check_play = world.play(world.vars(), check=True)
        world.untouched_by_check = all(
            h.sh(f"test -e {VENV} || test -e {CONFIG} || echo absent") == "absent"
            and h.sh("dpkg-query -W -f='${db:Status-Status}' python3-packaging", check=False)
            != "installed"
            for h in world.hosts
        )
        world.first_play = world.play(world.vars())
        yield world
    finally:
        failed = sys.exc_info()[0] is not None
        with contextlib.suppress(Exception):
            for host in locals().get("hosts", []):
                if failed or os.environ.get("HOSTS_KEEP_JOURNAL"):
                    say(f"journal of {host.name}:\n{host.journal()[-4000:]}")
        app.stop()
        nats.stop()
        remove_everything(prefix)
        signal.signal(signal.SIGTERM, old_term)
        say(f"the whole run took {time.monotonic() - started:.1f} s")


# ---------------------------------------------------------------- 1. converge


def test_preflight_names_the_packages_it_may_not_install(world: World) -> None:
    play = world.preflight_play
    assert play is not None and play.rc != 0, play and play.output
    message = play.task("Assert the host has the packages the venv method needs")
    assert "This host lacks python3-packaging" in message, message
    assert "python3-venv" not in message.split("(Debian")[0]  # it is there
    assert world.untouched  # it stopped before installing anything


def test_converge_on_minimal_hosts(world: World) -> None:
    play = world.first_play
    assert play is not None
    play.assert_ok()
    say(f"first converge: {play.seconds:.1f} s")
    assert "changed:" in play.task("Install the missing OS packages")
    for host in world.hosts:
        wait_for(host.ready, 60, f"{host.name}: unit active and /readyz 200")
        pid = host.main_pid()
        assert host.sh(f"stat -c %U /proc/{pid}") == SERVICE
        passwd = host.sh(f"getent passwd {SERVICE}").split(":")
        assert int(passwd[2]) != 0 and passwd[6] == "/usr/sbin/nologin", passwd
        modes = {
            path: host.sh(f"stat -c '%a %U %G' {path}")
            for path in (CONFIG, SECRETS_DIR, f"{SECRETS_DIR}/nats-password", UNIT)
        }
        assert modes == {
            CONFIG: f"640 root {SERVICE}",
            SECRETS_DIR: f"750 root {SERVICE}",
            f"{SECRETS_DIR}/nats-password": f"640 root {SERVICE}",
            UNIT: "644 root root",
        }
        assert host.sh(f"systemctl is-enabled {SERVICE}") == "enabled"
        wait_for(
            lambda host=host: "connected to NATS at" in host.journal(),
            30,
            f"{host.name}: journald shows the sidecar connected",
        )
        # The unprivileged user cannot read the secrets of others: only its group's.
        assert host.sh(f"runuser -u nobody -- cat {SECRETS_DIR}/nats-password", check=False) == ""


def test_check_mode_on_fresh_hosts_reports_changes_and_makes_none(world: World) -> None:
    play = world.fresh_check_play
    assert play is not None
    play.assert_ok()
    assert play.changed() > 0
    assert "python3-packaging" in play.task("Report the OS packages a run would install")
    assert world.untouched_by_check


# ---------------------------------------------------------------- 2. idempotence


def test_second_run_and_check_mode_change_nothing(world: World) -> None:
    play = world.play(world.vars()).assert_ok()
    assert play.changed() == 0, play.output
    check = world.play(world.vars(), check=True).assert_ok()
    assert check.changed() == 0, check.output


# ---------------------------------------------------------------- 3. one schedule


def test_two_hosts_share_one_schedule(world: World) -> None:
    for host in world.hosts:
        wait_for(host.ready, 60, f"{host.name} ready")
    start = time.time()
    names = {h.name for h in world.hosts}

    def both_served() -> bool:
        seen = world.instances_since(start)
        return time.time() - start >= 20 and all(seen[n] > 0 for n in names)

    wait_for(both_served, 120, "20 s of ticks, both hosts serving some", interval=1)
    end = time.time() - 2  # the last slots may still be on their way
    slots = world.app_slots()
    expected = range(int(start) + 1, int(end))
    counts = {s: slots.get(s * 1000, 0) for s in expected}
    wrong = {s: n for s, n in counts.items() if n != 1}
    assert not wrong, f"slots not run exactly once: {wrong}"
    world.assert_no_slot_twice()
    say(f"{len(counts)} slots, each once; by host: {dict(world.instances_since(start))}")


# ---------------------------------------------------------------- 4. restart


def test_kill_9_systemd_restarts_it_within_restart_sec(world: World) -> None:
    host = world.hosts[0]
    wait_for(host.ready, 60, f"{host.name} ready")
    pid, restarts = host.main_pid(), int(host.show("NRestarts"))
    host.sh(f"kill -9 {pid}")
    killed = time.monotonic()
    new_pid = wait_for(
        lambda: (p := host.main_pid()) not in (0, pid) and p,
        RESTART_SEC + 20,
        "a new main process",
        interval=0.2,
    )
    took = time.monotonic() - killed
    say(f"kill -9 {pid}: new main process {new_pid} after {took:.1f} s")
    assert took <= RESTART_SEC + 10, took
    assert int(host.show("NRestarts")) == restarts + 1
    wait_for(host.ready, 60, f"{host.name} ready again")
    back = time.time()
    wait_for(lambda: world.instances_since(back)[host.name] > 0, 60, "the host claiming again")
    world.assert_no_slot_twice()


# ---------------------------------------------------------------- 5. stop drains


def test_stop_drains_the_runs_in_flight(world: World) -> None:
    host = world.hosts[0]
    wait_for(host.ready, 60, f"{host.name} ready")
    world.app.delay["/tick"] = 4.0
    try:

        def in_flight() -> list[Any]:
            now = time.time()
            with world.app._lock:
                return [
                    r
                    for r in world.app.requests
                    if not r.finished
                    and r.at > now - 3
                    and r.headers.get("X-Anarchon-Instance") == host.name
                ]

        flying = wait_for(in_flight, 60, f"a trigger of {host.name} in flight", interval=0.1)
        began, stopped_at = time.monotonic(), time.time() - 1
        host.sh(f"systemctl stop {SERVICE}", timeout=STOP_TIMEOUT + 20)
        took = time.monotonic() - began
    finally:
        world.app.delay.pop("/tick", None)
    say(f"systemctl stop with {len(flying)} run(s) in flight: {took:.1f} s")
    assert took < STOP_TIMEOUT, took
    assert host.show("Result") == "success"
    assert host.show("ExecMainStatus") == "0"
    journal = host.journal(since=stopped_at)
    assert "draining running triggers" in journal
    assert "Deactivated successfully" in journal, journal[-2000:]
    assert "SIGKILL" not in journal and "Killing process" not in journal, journal[-2000:]
    # The runs in flight finished (the app answered them) and are recorded.
    results = {
        m.data.get("token"): m.data for m in world.stream() if m.subject.endswith(".results")
    }
    for request in flying:
        assert request.finished >= request.at + 3.9, request
        result = results.get(request.headers["X-Anarchon-Run-Id"])
        assert result is not None and result["status"] == "succeeded", (request, result)
        assert result["instance"] == host.name
    host.sh(f"systemctl start {SERVICE}")
    wait_for(host.ready, 60, f"{host.name} ready after the start")
    world.assert_no_slot_twice()


# ---------------------------------------------------------------- 6. config change


def test_config_change_restarts_once_and_a_bad_one_changes_nothing(world: World) -> None:
    pids = {h.name: h.main_pid() for h in world.hosts}
    restarts = {h.name: int(h.show("NRestarts")) for h in world.hosts}
    tock = {
        "name": "tock",
        "schedule": "*/2 * * * * *",
        "jitter": "0s",
        "request": {"path": "/tock"},
    }
    play = world.play(world.vars(anarchon_sidecar_jobs=[TICK, tock])).assert_ok()
    handler = play.task(HANDLER)
    for host in world.hosts:
        # The handler ran once per host: one new main process, no crash restart.
        assert handler.count(f"changed: [{host.name}]") == 1, handler
        assert host.main_pid() != pids[host.name]
        assert int(host.show("NRestarts")) == restarts[host.name]
        wait_for(host.ready, 60, f"{host.name} ready")
    changed_at = time.time()
    wait_for(
        lambda: len([s for s in world.app_slots("tock") if s / 1000 > changed_at]) >= 2,
        60,
        "the new job running",
    )
    assert all(s % 2000 == 0 for s in world.app_slots("tock")), "tock runs on even seconds"

    # A broken job: jitter + max_late not inside the duplicate window (5m), so a
    # late claim could run a slot twice. The play stops at validation.
    sums = {h.name: h.sh(f"sha256sum {CONFIG}") for h in world.hosts}
    pids = {h.name: h.main_pid() for h in world.hosts}
    bad = {**tock, "jitter": "5m", "max_late": "1m"}
    failed = world.play(world.vars(anarchon_sidecar_jobs=[TICK, bad]))
    assert failed.rc != 0, failed.output
    config_task = failed.task(CONFIG_TASK)
    assert "failed to validate" in config_task and "jobs[1].jitter" in config_task, config_task
    assert HANDLER not in failed.output.split("PLAY RECAP")[0].split(CONFIG_TASK)[-1]
    since = time.time()
    for host in world.hosts:
        assert host.sh(f"sha256sum {CONFIG}") == sums[host.name]
        assert host.active() and host.main_pid() == pids[host.name]
    wait_for(
        lambda: all(world.instances_since(since)[h.name] > 0 for h in world.hosts),
        90,
        "both hosts still claiming",
        interval=1,
    )
    # Back to the base config for the next tests (one more restart).
    world.play(world.vars()).assert_ok()
    world.assert_no_slot_twice()


# ---------------------------------------------------------------- 7. upgrade


def test_upgrade_to_a_newer_wheel_restarts_onto_it(world: World) -> None:
    # A valid newer version for any current one: 0.2.0.dev0 -> 0.2.0.post1
    # (a .post after a .dev is no version at all).
    newer = re.sub(r"\.dev\d+$", "", sidecar.__version__) + ".post1"
    wheelhouse = build_wheelhouse(world.workdir / "wheelhouse-newer", newer)
    pids = {h.name: h.main_pid() for h in world.hosts}
    before = time.time()
    play = world.play(
        world.vars(
            anarchon_sidecar_package_spec=f"anarchon-sidecar=={newer}",
            anarchon_sidecar_wheelhouse=str(wheelhouse),
        )
    ).assert_ok()
    assert "changed:" in play.task("Install the package into the virtualenv")
    for host in world.hosts:
        version = host.sh(f"{VENV}/bin/anarchon-sidecar --version")
        assert version == f"anarchon-sidecar, version {newer}", version
        assert host.main_pid() != pids[host.name]
        wait_for(host.ready, 60, f"{host.name} ready on {newer}")
        # The running process is the new version.
        _, metrics = host.http_get("/metrics")
        assert f'anarchon_build_info{{version="{newer}"}} 1.0' in metrics, metrics[:2000]
    after = before + play.seconds
    wait_for(
        lambda: all(world.instances_since(after)[h.name] > 0 for h in world.hosts),
        90,
        "both hosts claiming after the upgrade",
        interval=1,
    )
    with world.app._lock:
        agents = {r.headers.get("User-Agent") for r in world.app.requests if r.at > after}
    assert agents == {f"anarchon-sidecar/{newer}"}, agents
    world.assert_no_slot_twice()
    # Idempotent on the new version too.
    again = world.play(
        world.vars(
            anarchon_sidecar_package_spec=f"anarchon-sidecar=={newer}",
            anarchon_sidecar_wheelhouse=str(wheelhouse),
        )
    ).assert_ok()
    assert again.changed() == 0, again.output


# ---------------------------------------------------------------- 8. secrets


def test_secrets_never_in_play_output_unit_or_journal(world: World) -> None:
    assert world.plays
    for n, play in enumerate(world.plays, start=1):
        for secret in (PASSWORD, SIGNING):
            assert secret not in play.output, f"play {n} printed a secret"
    for host in world.hosts:
        # The sidecar reads them from its files...
        assert host.sh(f"cat {SECRETS_DIR}/nats-password") == PASSWORD
        # ...and they are nowhere else: unit, systemd's view of it, the whole journal
        # (the sidecar's log, the role's module invocations, systemd's messages).
        places = {
            "unit": host.sh(f"cat {UNIT}"),
            "systemctl show": host.sh(f"systemctl show {SERVICE}"),
            "journal": host.sh("journalctl --no-pager -o cat", timeout=120),
            "config": host.sh(f"cat {CONFIG}"),
        }
        assert "connected to NATS" in places["journal"]
        for place, text in places.items():
            for secret in (PASSWORD, SIGNING):
                assert secret not in text, f"{host.name}: a secret in the {place}"


# ---------------------------------------------------------------- 9. removal


def test_state_absent_removes_the_sidecar_and_leaves_the_stream(world: World) -> None:
    gone, stays = world.hosts[1], world.hosts[0]
    stream_before = len(world.stream())
    play = world.play(world.vars(anarchon_sidecar_state="absent"), limit=gone.name).assert_ok()
    assert play.changed() > 0
    assert gone.sh(f"systemctl is-active {SERVICE}", check=False) in ("inactive", "unknown")
    assert gone.sh(f"systemctl is-enabled {SERVICE}", check=False) in ("", "not-found")
    for path in (UNIT, CONFIG, SECRETS_DIR, "/etc/anarchon", "/opt/anarchon-sidecar"):
        assert gone.sh(f"test -e {path} || echo absent") == "absent", path
    assert gone.sh(f"getent passwd {SERVICE} || echo absent") == "absent"
    assert gone.sh(f"getent group {SERVICE} || echo absent") == "absent"
    # A second removal changes nothing.
    again = world.play(world.vars(anarchon_sidecar_state="absent"), limit=gone.name).assert_ok()
    assert again.changed() == 0, again.output
    # The stream is untouched and the other host runs every slot now.
    since = time.time()
    wait_for(
        lambda: world.instances_since(since)[stays.name] >= 3,
        60,
        f"{stays.name} running the slots alone",
        interval=1,
    )
    assert world.instances_since(since)[gone.name] == 0
    assert len(world.stream()) >= stream_before
    world.assert_no_slot_twice()


# ------------------------------------------------- 10. the restricted NATS user


def test_the_role_s_sidecars_needed_nothing_beyond_permissions_conf(world: World) -> None:
    # Every play above (claims, results, leases, restarts, an upgrade, a removal)
    # ran as a user with exactly deploy/nats/permissions.conf: nothing was refused.
    assert "$ANARCHON_SIDECAR_PERMISSIONS" in world.nats.config_text()
    assert world.stream(), "the test reads the stream as the same user"
    for host in world.hosts[:1]:  # the other was removed
        config = host.sh(f"cat {CONFIG}")
        assert f"user: {NATS_USER}" in config and "token" not in config, config
    assert not nats_violations(world.nats), nats_violations(world.nats)
