"""The Ansible role, tested by really running it.

`ansible-playbook` (from this venv) converges `ansible/roles/anarchon_sidecar`
against localhost over the local connection, into a temporary root
(`anarchon_sidecar_root`), with systemd left alone and no users created. The
venv method pip-installs a wheel of this project built once per session; pip
reuses its cache, so the first converge takes seconds, not minutes. The
installed `anarchon-sidecar` then runs with the rendered config against a real
nats-server and triggers a real app.

One converged root is shared by the module (`site`); tests that need it in its
base state converge it back first, so they do not depend on their order.
"""

from __future__ import annotations

import grp
import hashlib
import hmac
import importlib.util
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import ROOT, NatsServer, RecordingApp, free_port, sidecar_env, wait_for

ANSIBLE_DIR = ROOT / "ansible"
ROLE_DIR = ANSIBLE_DIR / "roles" / "anarchon_sidecar"
BIN_DIR = Path(sys.executable).parent
CONFIG_TASK = "Write the config, checked by anarchon-sidecar check"
ARGSPEC_TASK = (
    "Validating arguments against arg spec 'main' - Install and run anarchon-sidecar on a host"
)

PLAYBOOK = """\
- name: Converge anarchon_sidecar on localhost
  hosts: localhost
  gather_facts: false
  roles:
    - role: anarchon_sidecar
"""

# The role's podman install and configure steps alone, without the preflight
# that wants podman 4.4+ on this host, to render the quadlet in check mode.
PODMAN_FILES_PLAYBOOK = """\
- name: Render the podman files of anarchon_sidecar on localhost
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Install (podman)
      ansible.builtin.include_role:
        name: anarchon_sidecar
        tasks_from: install_podman.yml
    - name: Configure
      ansible.builtin.include_role:
        name: anarchon_sidecar
        tasks_from: configure.yml
"""

RECAP = re.compile(
    r"^localhost\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)
HEADING = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(?:anarchon_sidecar : )?(?P<name>.*?)\] \**$")


def tool(name: str) -> str:
    path = BIN_DIR / name
    if not path.exists():
        pytest.fail(f"{name} is missing from {BIN_DIR.name}: run `make install` (dev extra)")
    return str(path)


@dataclass
class Play:
    """One ansible-playbook run: exit code, output, recap counts."""

    rc: int
    output: str
    seconds: float

    @property
    def recap(self) -> dict[str, int]:
        found = RECAP.search(self.output)
        assert found, f"no recap in ansible output:\n{self.output}"
        return {k: int(v) for k, v in found.groupdict().items()}

    @property
    def changed(self) -> int:
        return self.recap["changed"]

    def assert_ok(self) -> Play:
        assert self.rc == 0 and self.recap["failed"] == 0, self.output
        return self

    def task(self, name: str) -> str:
        """The output of the task called `name` (its heading up to the next one)."""
        blocks: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in self.output.splitlines():
            heading = HEADING.match(line)
            if heading:
                current = blocks.setdefault(heading["name"], [])
            elif line.startswith("PLAY RECAP"):
                current = None
            elif current is not None:
                current.append(line)
        assert name in blocks, f"task {name!r} did not run:\n{self.output}"
        return "\n".join(blocks[name])


class Site:
    """A temporary root the role converges into, and how to run the playbook."""

    def __init__(self, workdir: Path, wheel: Path) -> None:
        self.workdir = workdir
        self.root = workdir / "root"
        self.wheel = wheel
        self.last_vars: dict[str, Any] | None = None
        self.first_play: Play | None = None
        self.playbook = workdir / "converge.yml"
        self.playbook.write_text(PLAYBOOK)
        self.podman_files_playbook = workdir / "podman-files.yml"
        self.podman_files_playbook.write_text(PODMAN_FILES_PLAYBOOK)
        home = workdir / "ansible-home"
        cfg = workdir / "ansible.cfg"
        cfg.write_text("[defaults]\n")
        # Only what we set: no user or system ansible.cfg, no user collections.
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "ANARCHON_"))
        }
        self.env.update(
            ANSIBLE_CONFIG=str(cfg),
            ANSIBLE_HOME=str(home),
            ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
            ANSIBLE_REMOTE_TEMP=str(home / "remote-tmp"),
            ANSIBLE_COLLECTIONS_PATH=str(home / "collections"),
            ANSIBLE_ROLES_PATH=str(ANSIBLE_DIR / "roles"),
            ANSIBLE_PYTHON_INTERPRETER=sys.executable,
            ANSIBLE_PIPELINING="true",
            ANSIBLE_NOCOLOR="true",
            ANSIBLE_FORCE_COLOR="false",
            ANSIBLE_RETRY_FILES_ENABLED="false",
            ANSIBLE_STDOUT_CALLBACK="default",
            ANSIBLE_LOCALHOST_WARNING="false",
            ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
            ANSIBLE_DEPRECATION_WARNINGS="false",
        )

    @property
    def config(self) -> Path:
        return self.root / "etc/anarchon/sidecar.yaml"

    @property
    def secrets(self) -> Path:
        return self.root / "etc/anarchon/secrets"

    @property
    def unit(self) -> Path:
        return self.root / "etc/systemd/system/anarchon-sidecar.service"

    @property
    def binary(self) -> Path:
        return self.root / "opt/anarchon-sidecar/venv/bin/anarchon-sidecar"

    def vars(self, **overrides: Any) -> dict[str, Any]:
        """The base variables of a test converge, with `overrides`."""
        user = pwd.getpwuid(os.getuid()).pw_name
        group = grp.getgrgid(os.getgid()).gr_name
        base: dict[str, Any] = {
            "anarchon_sidecar_root": str(self.root),
            "anarchon_sidecar_install_method": "venv",
            "anarchon_sidecar_package_spec": str(self.wheel),
            "anarchon_sidecar_python": sys.executable,
            "anarchon_sidecar_manage_service": False,
            "anarchon_sidecar_create_user": False,
            # This machine's packages are not the test's to change.
            "anarchon_sidecar_install_os_packages": False,
            "anarchon_sidecar_user": user,
            "anarchon_sidecar_group": group,
            "anarchon_sidecar_config_owner": user,
            "anarchon_sidecar_instance_id": "ansible-test",
            "anarchon_sidecar_nats_servers": ["nats://127.0.0.1:4222"],
            "anarchon_sidecar_nats_user": "anarchon",
            "anarchon_sidecar_nats_password": "nats-password-never-logged",
            "anarchon_sidecar_target_signing_secret": "signing-secret-never-logged",
            "anarchon_sidecar_admin_tokens": "alice:admin-token-never-logged",
            "anarchon_sidecar_metrics_listen": "127.0.0.1:9464",
            "anarchon_sidecar_jobs": [
                {"name": "sync", "schedule": "*/5 * * * *", "request": {"path": "/jobs/sync"}},
                {
                    "name": "nightly",
                    "schedule": "30 2 * * *",
                    "timezone": "Europe/Berlin",
                    "request": {"method": "POST", "path": "/jobs/nightly", "timeout": "5m"},
                },
            ],
        }
        base.update(overrides)
        return base

    def converge(
        self, variables: dict[str, Any], *, check: bool = False, playbook: Path | None = None
    ) -> Play:
        """ansible-playbook -i localhost, -c local --diff [--check] with `variables`."""
        vars_file = self.workdir / "vars.json"
        vars_file.write_text(json.dumps(variables))
        cmd = [tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "--diff"]
        cmd += ["-e", f"@{vars_file}", str(playbook or self.playbook)]
        if check:
            cmd.append("--check")
        started = time.monotonic()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=self.env, cwd=self.workdir, timeout=150
        )
        play = Play(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started)
        if not check and variables.get("anarchon_sidecar_root") == str(self.root):
            self.last_vars = variables if play.rc == 0 else None
        return play

    def converge_base(self) -> None:
        """Bring the root back to the base variables (a no-op when it is there)."""
        if self.last_vars != self.vars():
            self.converge(self.vars()).assert_ok()


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Mode and content of every file under `root`/etc (config, secrets, units)."""
    return {
        str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
        for p in sorted((root / "etc").rglob("*"))
    }


@pytest.fixture(scope="session")
def sidecar_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this project (`pip wheel --no-deps`), built from a copy of the sources."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    shutil.copytree(ROOT / "sidecar", src / "sidecar", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    out = work / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("anarchon_sidecar-*.whl")
    return wheel


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, sidecar_wheel: Path) -> Site:
    """The role converged once (venv method) into a temporary root."""
    site = Site(tmp_path_factory.mktemp("ansible"), sidecar_wheel)
    play = site.converge(site.vars()).assert_ok()
    site.first_play = play
    print(f"first converge (virtualenv + pip install): {play.seconds:.1f}s")
    return site


# --------------------------------------------------------------------------- the install


def test_converge_installs_the_sidecar_with_its_files(site: Site) -> None:
    play = site.first_play
    assert play is not None
    assert play.changed > 0

    # The virtualenv has the console script of the wheel.
    version = subprocess.run(
        [str(site.binary), "--version"], capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0, version.stderr
    assert "anarchon-sidecar" in version.stdout

    # The config is the role variables, secrets referenced by file, never inline.
    config = yaml.safe_load(site.config.read_text())
    assert config["instance_id"] == "ansible-test"
    assert config["shutdown_grace"] == "25s"
    assert config["nats"]["servers"] == ["nats://127.0.0.1:4222"]
    assert config["nats"]["user"] == "anarchon"
    assert config["nats"]["password_file"] == str(site.secrets / "nats-password")
    assert config["target"]["signing_secret_file"] == str(site.secrets / "signing-secret")
    assert config["admin"] == {"page": True, "token_file": str(site.secrets / "admin-tokens")}
    assert [job["name"] for job in config["jobs"]] == ["sync", "nightly"]
    assert config["jobs"][1]["timezone"] == "Europe/Berlin"
    assert "never-logged" not in site.config.read_text()

    # Secrets: files only root/owner and the service group may read.
    assert (site.secrets / "nats-password").read_text() == "nats-password-never-logged"
    assert (site.secrets / "signing-secret").read_text() == "signing-secret-never-logged"
    for path in (site.secrets / "nats-password", site.secrets / "signing-secret", site.config):
        assert oct(path.stat().st_mode & 0o777) == "0o640", path
    assert oct(site.secrets.stat().st_mode & 0o777) == "0o750"
    assert (site.secrets / "admin-tokens").read_text() == "alice:admin-token-never-logged"
    assert oct((site.secrets / "admin-tokens").stat().st_mode & 0o777) == "0o640"
    assert sorted(p.name for p in site.secrets.iterdir()) == [
        "admin-tokens",
        "nats-password",
        "signing-secret",
    ]
    # ... and no_log kept them out of the play's output, --diff included.
    assert "never-logged" not in play.output

    # The systemd unit: hardened, drains on SIGTERM, waits longer than the drain.
    unit = site.unit.read_text()
    assert "never-logged" not in unit  # world-readable: no secret in it
    for line in (
        f"ExecStart={site.binary} run -c {site.config}",
        "NoNewPrivileges=true",
        "ProtectSystem=strict",
        "ProtectHome=true",
        "PrivateTmp=true",
        "Restart=on-failure",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=40",
        "LimitNOFILE=65536",  # systemd's default soft 1024 is short of 1,000 jobs at once
    ):
        assert line in unit.splitlines(), line

    # `check` accepts what was written.
    checked = subprocess.run(
        [str(site.binary), "check", "-c", str(site.config)],
        capture_output=True,
        text=True,
        timeout=30,
        env=sidecar_env(),
    )
    assert checked.returncode == 0, checked.stderr


def test_installed_sidecar_becomes_ready_and_triggers_a_job(
    site: Site, nats_server: NatsServer, http_app: RecordingApp, tmp_path: Path
) -> None:
    port = free_port()
    secret, next_secret = "the-signing-secret", "the-next-signing-secret"
    play = site.converge(
        site.vars(
            anarchon_sidecar_nats_servers=[nats_server.url],
            anarchon_sidecar_nats_user="",
            anarchon_sidecar_nats_password="",
            anarchon_sidecar_target_url=http_app.url,
            anarchon_sidecar_target_signing_secret=secret,
            # A rotation under way: the next key beside the current one.
            anarchon_sidecar_target_signing_secret_next=next_secret,
            anarchon_sidecar_metrics_listen=f"127.0.0.1:{port}",
            anarchon_sidecar_jobs=[
                {
                    "name": "tick",
                    "schedule": "* * * * * *",
                    "jitter": "0s",
                    "request": {"method": "POST", "path": "/jobs/tick", "body": "hello"},
                }
            ],
        )
    ).assert_ok()
    assert next_secret not in play.output
    # The password is no longer configured, so its file is gone.
    assert not (site.secrets / "nats-password").exists()
    next_file = site.secrets / "signing-secret-next"
    assert next_file.read_text() == next_secret
    assert oct(next_file.stat().st_mode & 0o777) == "0o640"
    config = yaml.safe_load(site.config.read_text())
    assert config["target"]["signing_secret_next_file"] == str(next_file)
    assert config["target"]["signing_v1"] is True

    log_path = tmp_path / "sidecar.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(site.binary), "run", "-c", str(site.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=sidecar_env(),
        )
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"sidecar exited {proc.returncode}:\n{log_path.read_text()}")
            try:
                url = f"http://127.0.0.1:{port}/readyz"
                with urllib.request.urlopen(url, timeout=2) as resp:
                    return bool(resp.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        try:
            wait_for(ready, 30, what="installed sidecar /readyz 200")
            (request, *_) = wait_for(
                lambda: http_app.requests_for("/jobs/tick"), 20, what="a trigger"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nsidecar log:\n{log_path.read_text()}") from None
        assert request.method == "POST"
        assert request.body == b"hello"
        assert request.headers["X-Anarchon-Job"] == "tick"
        # Signed with the secret the role wrote to a file.
        fields = dict(
            part.split("=", 1) for part in request.headers["X-Anarchon-Signature"].split(",")
        )
        expected = hmac.new(
            secret.encode(), fields["t"].encode() + b"." + request.body, hashlib.sha256
        ).hexdigest()
        assert hmac.compare_digest(fields["v1"], expected)
        # v2, one entry per key: an app holding either key accepts it.
        for key in (secret, next_secret):
            verifier = signing_verifier().Verifier([key.encode()])
            verifier.verify(
                request.method,
                request.path,
                list(request.headers.items()),
                request.body,
            )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
    assert rc == 0, log_path.read_text()


def signing_verifier() -> Any:
    """docs/signing/verify.py, the sample verifier an app would copy."""
    spec = importlib.util.spec_from_file_location("verify", ROOT / "docs/signing/verify.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rotation_done_removes_the_next_key(site: Site) -> None:
    """Step 2 of a rotation: the next key becomes the current one, the next file goes."""
    site.converge(site.vars(anarchon_sidecar_target_signing_secret_next="next-never-logged"))
    assert (site.secrets / "signing-secret-next").exists()
    play = site.converge(
        site.vars(anarchon_sidecar_target_signing_secret="next-never-logged")
    ).assert_ok()
    assert not (site.secrets / "signing-secret-next").exists()
    assert (site.secrets / "signing-secret").read_text() == "next-never-logged"
    assert "signing_secret_next_file" not in site.config.read_text()
    assert "never-logged" not in play.output


# --------------------------------------------------------------------------- converging again


def test_second_converge_changes_nothing(site: Site) -> None:
    site.converge_base()
    play = site.converge(site.vars()).assert_ok()
    assert play.changed == 0, play.output


def test_check_mode_reports_a_change_and_writes_nothing(site: Site) -> None:
    site.converge_base()
    before = snapshot(site.root)
    changed = site.vars(
        anarchon_sidecar_metrics_listen="127.0.0.1:19464",
        anarchon_sidecar_shutdown_grace=30,
        anarchon_sidecar_target_signing_secret="",
    )
    play = site.converge(changed, check=True).assert_ok()
    config_task = play.task(CONFIG_TASK)
    assert "changed: [localhost]" in config_task
    assert "+  listen: 127.0.0.1:19464" in config_task
    assert "+shutdown_grace: 30s" in config_task
    assert "changed: [localhost] => (item=signing-secret)" in play.task(
        "Remove secret files that are no longer configured"
    )
    assert snapshot(site.root) == before


def test_check_mode_on_a_fresh_host_writes_nothing(site: Site, tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    play = site.converge(site.vars(anarchon_sidecar_root=str(fresh)), check=True).assert_ok()
    assert play.changed > 0
    assert "changed: [localhost]" in play.task("Install the package into the virtualenv")
    assert not fresh.exists()


def test_state_absent_removes_what_the_role_wrote(site: Site, tmp_path: Path) -> None:
    """`anarchon_sidecar_state: absent` on a root of its own (tests/hosts does it with systemd)."""
    root = tmp_path / "gone"
    site.converge(site.vars(anarchon_sidecar_root=str(root))).assert_ok()
    (root / "etc/anarchon/notes.txt").write_text("not the role's")
    play = site.converge(
        site.vars(anarchon_sidecar_root=str(root), anarchon_sidecar_state="absent")
    ).assert_ok()
    assert play.changed > 0
    assert "never-logged" not in play.output
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    # Only what is not the role's stays, and the directories that hold it.
    assert left == [
        "etc",
        "etc/anarchon",
        "etc/anarchon/notes.txt",
        "etc/systemd",
        "etc/systemd/system",
        "opt",
    ]
    again = site.converge(
        site.vars(anarchon_sidecar_root=str(root), anarchon_sidecar_state="absent")
    ).assert_ok()
    assert again.changed == 0, again.output


@pytest.mark.parametrize(
    ("job", "key"),
    [
        ({"name": "bad name!", "schedule": "*/5 * * * *"}, "jobs[0].name"),
        ({"name": "hourly", "schedule": "61 * * * *"}, "jobs[0].schedule"),
    ],
    ids=["name", "schedule"],
)
def test_bad_job_fails_at_validate_and_keeps_the_config(
    site: Site, job: dict[str, str], key: str
) -> None:
    if not site.config.exists():  # any valid config in place will do
        site.converge_base()
    before = site.config.read_bytes()
    play = site.converge(site.vars(anarchon_sidecar_jobs=[job]))
    assert play.rc != 0 and play.recap["failed"] == 1, play.output
    config_task = play.task(CONFIG_TASK)
    assert "fatal: [localhost]: FAILED!" in config_task
    assert "failed to validate" in config_task
    assert key in config_task  # `check` names the key
    assert site.config.read_bytes() == before


@pytest.mark.parametrize(
    ("overrides", "task", "message"),
    [
        (
            {"anarchon_sidecar_install_method": "docker"},
            ARGSPEC_TASK,
            "value of anarchon_sidecar_install_method must be one of: venv, podman",
        ),
        (
            {"anarchon_sidecar_stop_timeout": 20},
            "Assert systemd waits longer than the drain",
            "anarchon_sidecar_stop_timeout (20s) must be longer than",
        ),
        (
            {"anarchon_sidecar_nats_user": "", "anarchon_sidecar_nats_token": "t"},
            "Assert NATS has servers and one way to authenticate",
            "a password only with anarchon_sidecar_nats_user",
        ),
        (
            {"anarchon_sidecar_jobs": [{"name": "no-schedule"}]},
            ARGSPEC_TASK,
            "one of the following is required: schedule, after",
        ),
        (
            {
                "anarchon_sidecar_target_signing_secret": "",
                "anarchon_sidecar_target_signing_secret_next": "next-never-logged",
            },
            "Assert the signing keys make sense",
            "anarchon_sidecar_target_signing_secret_next (a rotation's next key) needs",
        ),
        (
            {"anarchon_sidecar_environment": {"ANARCHON_SIGNING_SECRET": "env-never-logged"}},
            "Assert no secret is passed through the service environment",
            "must not hold ANARCHON_SIGNING_SECRET: the unit file is",
        ),
    ],
    ids=["method", "stop-timeout", "auth", "job-fields", "next-without-current", "secret-env"],
)
def test_preflight_refuses_bad_variables_before_changing_anything(
    site: Site, tmp_path: Path, overrides: dict[str, Any], task: str, message: str
) -> None:
    root = tmp_path / "refused"
    play = site.converge(site.vars(anarchon_sidecar_root=str(root), **overrides))
    assert play.rc != 0, play.output
    assert message in play.task(task)
    assert "never-logged" not in play.output
    assert not root.exists()


# --------------------------------------------------------------------------- the unit files


def test_unit_passes_systemd_analyze_verify(site: Site) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    if not site.unit.exists():
        site.converge_base()
    proc = subprocess.run(
        [analyze, "verify", "--man=no", str(site.unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify exits 0 on unknown keys and bad values; it names the file in those lines.
    problems = [line for line in proc.stderr.splitlines() if site.unit.name in line]
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr


def podman_version() -> tuple[int, ...] | None:
    """This host's podman version, None without podman."""
    podman = shutil.which("podman")
    if podman is None:
        return None
    out = subprocess.run([podman, "--version"], capture_output=True, text=True, timeout=30)
    found = re.search(r"(\d+)\.(\d+)", out.stdout)
    return tuple(int(n) for n in found.groups()) if out.returncode == 0 and found else None


def podman_vars(site: Site, root: Path, **overrides: Any) -> dict[str, Any]:
    return site.vars(
        anarchon_sidecar_root=str(root),
        anarchon_sidecar_install_method="podman",
        anarchon_sidecar_image="anarchon-sidecar:test",
        **overrides,
    )


def test_podman_method_in_check_mode_wants_quadlet_support(site: Site, tmp_path: Path) -> None:
    """The whole play in check mode: podman missing (a role may install it) or 4.4+ passes,
    an older podman (no quadlet) fails the preflight with a clear message."""
    root = tmp_path / "podman"
    play = site.converge(podman_vars(site, root), check=True)
    version = podman_version()
    if version is not None and version < (4, 4):
        assert play.rc != 0, play.output
        preflight = play.task("Assert podman 4.4 or newer is installed")
        assert "The podman method needs podman 4.4 or newer (quadlet)" in preflight
    else:
        play.assert_ok()
        assert play.changed > 0
    assert not root.exists()


def test_podman_method_renders_a_quadlet(site: Site, tmp_path: Path) -> None:
    """The podman install and configure steps in check mode: the quadlet shows in the diff."""
    root = tmp_path / "podman"
    quadlets = root / "etc/containers/systemd"
    quadlets.mkdir(parents=True)  # as a podman package leaves it
    play = site.converge(
        podman_vars(site, root, anarchon_sidecar_podman_pull=False),
        check=True,
        playbook=site.podman_files_playbook,
    ).assert_ok()
    quadlet = play.task("Write the quadlet container file")
    secrets = root / "etc/anarchon/secrets"
    for line in (
        "+Image=anarchon-sidecar:test",
        "+Exec=run -c /etc/anarchon/sidecar.yaml",
        f"+Volume={root}/etc/anarchon/sidecar.yaml:/etc/anarchon/sidecar.yaml:ro,z",
        f"+Volume={secrets}:{secrets}:ro,z",
        f"+User={os.getuid()}",
        f"+Group={os.getgid()}",
        "+Network=host",
        "+ReadOnly=true",
        "+Ulimit=nofile=65536:65536",
        "+PodmanArgs=--stop-timeout=40",
        "+WantedBy=multi-user.target",
    ):
        assert line in quadlet.splitlines(), line
    assert "never-logged" not in play.output
    assert sorted(root.rglob("*")) == [root / "etc", root / "etc/containers", quadlets]


# --------------------------------------------------------------------------- the role's source


def test_defaults_match_argument_specs() -> None:
    defaults = yaml.safe_load((ROLE_DIR / "defaults/main.yml").read_text())
    specs = yaml.safe_load((ROLE_DIR / "meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert sorted(defaults) == sorted(options)
    for name, spec in options.items():
        assert name.startswith("anarchon_sidecar_"), name
        assert spec.get("description"), f"{name} has no description"
        assert spec.get("type"), f"{name} has no type"
        assert spec.get("default") == defaults[name], name
        if "choices" in spec:
            assert defaults[name] in spec["choices"], name


def test_ansible_lint_production_profile_passes() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(NO_COLOR="1", PATH=f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}")
    proc = subprocess.run(
        [tool("ansible-lint"), "--offline", "--profile", "production", "ansible/"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


def test_pings_notifications_and_tracing_are_rendered_and_their_urls_never_shown(
    site: Site,
) -> None:
    key = "check-key-never-shown"
    variables = site.vars(
        anarchon_sidecar_ping_default={"url": f"https://hc.example/ping/{key}/{{job}}"},
        anarchon_sidecar_notify=[
            {"url": f"https://hooks.example/services/{key}", "format": "slack"}
        ],
        anarchon_sidecar_tracing={"otlp_endpoint": "http://127.0.0.1:4318"},
        anarchon_sidecar_jobs=[
            {
                "name": "sync",
                "schedule": "*/5 * * * *",
                "pause_after": 3,
                "expect": {"min": "1s", "max": "10m"},
            }
        ],
    )
    play = site.converge(variables)
    play.assert_ok()
    config = yaml.safe_load(site.config.read_text())
    assert config["defaults"]["ping"]["url"] == f"https://hc.example/ping/{key}/{{job}}"
    assert config["notify"][0]["format"] == "slack"
    assert config["tracing"] == {"otlp_endpoint": "http://127.0.0.1:4318"}
    assert config["jobs"][0]["pause_after"] == 3
    # Converged with --diff: the config's diff would have shown the keys.
    assert key not in play.output
    assert os.stat(site.config).st_mode & 0o777 == 0o640
    site.converge_base()


# --------------------------------------------------- the NATS user the examples use


def _role_vars(node: Any) -> dict[str, Any]:
    """Every anarchon_sidecar_* variable set anywhere in a YAML document."""
    found: dict[str, Any] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            if str(key).startswith("anarchon_sidecar_"):
                found[str(key)] = value
            found.update(_role_vars(value))
    elif isinstance(node, list):
        for item in node:
            found.update(_role_vars(item))
    return found


def test_examples_connect_as_a_user_restricted_by_permissions_conf() -> None:
    """The inventory's group_vars and the README's playbook use a NATS user (a token
    carries no permissions on the server), and the README says to restrict it with
    deploy/nats/permissions.conf, which exists where it points."""
    readme = (ROLE_DIR / "README.md").read_text()
    examples = [
        yaml.safe_load(
            (ANSIBLE_DIR / "inventory" / "group_vars" / "anarchon_sidecar.yml").read_text()
        )
    ] + [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", readme, re.DOTALL)]
    with_nats = [v for v in map(_role_vars, examples) if "anarchon_sidecar_nats_servers" in v]
    assert len(with_nats) >= 2, "the inventory and the README's playbook set NATS servers"
    for variables in with_nats:
        assert variables.get("anarchon_sidecar_nats_user") == "anarchon", variables
        assert variables.get("anarchon_sidecar_nats_password"), variables
        for unrestricted in ("token", "nkey_seed", "creds"):
            assert not variables.get(f"anarchon_sidecar_nats_{unrestricted}"), variables
    links = re.findall(r"\]\(([^)]*permissions\.conf)\)", readme)
    assert links, "the README points at deploy/nats/permissions.conf"
    for link in links:
        assert (ROLE_DIR / link).resolve().is_file(), link
    assert (ROLE_DIR / links[0]).resolve() == ROOT / "deploy" / "nats" / "permissions.conf"
    assert "permissions: $ANARCHON_SIDECAR_PERMISSIONS" in readme
    assert "restrict" in readme.lower()


@pytest.mark.timeout(420)  # three converges (and the first one, when run alone)
def test_calendar_files_are_written_before_the_config_that_names_them(site: Site) -> None:
    """anarchon_sidecar_calendars: a file's content lands in <config_dir>/calendars and the
    config names it there (absolute: the validate's copy of the config is elsewhere); a
    file that does not parse fails the validate and keeps the config in place."""
    ics = (
        "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nBEGIN:VEVENT\r\n"
        "DTSTART;VALUE=DATE:20261225\r\nDTEND;VALUE=DATE:20261227\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n"
    )
    jobs = [
        {
            "name": "nightly",
            "schedule": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "exclude": ["calendar:holidays-de", "calendar:freeze"],
        }
    ]
    calendars = {"holidays-de": {"content": ics}, "freeze": {"dates": ["2026-12-24"]}}
    try:
        play = site.converge(
            site.vars(anarchon_sidecar_jobs=jobs, anarchon_sidecar_calendars=calendars)
        )
        assert play.rc == 0, play.output
        (written,) = (site.config.parent / "calendars").glob("holidays-de-*.ics")
        assert written.read_bytes() == ics.encode()  # CRLF kept
        config = yaml.safe_load(site.config.read_text())
        assert config["calendars"] == {
            "holidays-de": {"file": str(written)},
            "freeze": {"dates": ["2026-12-24"]},
        }
        before = site.config.read_bytes()
        bad = {**calendars, "holidays-de": {"content": ics.replace("20261227", "2026-12-27")}}
        play = site.converge(site.vars(anarchon_sidecar_jobs=jobs, anarchon_sidecar_calendars=bad))
        assert play.rc != 0, play.output
        assert "calendars.holidays-de.file" in play.task(CONFIG_TASK)  # check names it
        assert site.config.read_bytes() == before
        assert written.read_bytes() == ics.encode()  # the file the config names: as it was
    finally:
        site.converge_base()
