"""What `make test` needs on a fresh machine besides the venv: git for the upgrade
test (installed by make, else that test skips saying why), and installers that
wait for an apt lock another package manager holds instead of failing at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, sidecar_env

# ---------------------------------------------------------------- git, the apt lock

PYTEST_ARGS = ("-p", "no:cacheprovider", "-p", "no:randomly", "-q", "-rs")
UPGRADE_TEST = (
    "tests/test_upgrade.py::test_rolling_update_from_the_previous_release_runs_no_slot_twice"
)


def pytest_without_git(ci: bool, empty: Path) -> subprocess.CompletedProcess[str]:
    """The upgrade test on a machine without git: PATH holds only an empty directory."""
    env = {k: v for k, v in sidecar_env().items() if k != "CI"}
    env["PATH"] = str(empty)
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", *PYTEST_ARGS, UPGRADE_TEST],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_git_the_upgrade_test_skips_saying_why(tmp_path: Path) -> None:
    done = pytest_without_git(False, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout, done.stdout
    assert "the upgrade test needs git: git is not installed (make git-tool" in done.stdout


def test_under_ci_an_upgrade_test_without_git_fails(tmp_path: Path) -> None:
    done = pytest_without_git(True, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the upgrade test cannot run under CI: git is not installed" in done.stdout


def test_in_a_shallow_clone_the_upgrade_test_skips_saying_why(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    cloned = subprocess.run(
        ["git", "clone", "-q", "--depth", "1", "--no-local", str(ROOT), str(clone)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cloned.returncode == 0, cloned.stderr
    env = {k: v for k, v in sidecar_env().items() if k != "CI"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *PYTEST_ARGS, UPGRADE_TEST],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout and "is not in this clone" in done.stdout, done.stdout
    assert "git fetch --unshallow" in done.stdout, done.stdout


def test_make_test_installs_git_when_missing() -> None:
    """`make unit` asks for git as it asks for Go and Node.js (tests/install-missing.sh)."""
    make = (ROOT / "Makefile").read_text()
    unit = next(line for line in make.splitlines() if line.startswith("unit:"))
    assert "git-tool" in unit.split(), unit
    assert "install-missing.sh" in make.split("git-tool:", 1)[1].split("\n\n", 1)[0]
    assert "git:git" in make.split("git-tool:", 1)[1].split("\n\n", 1)[0]
    contributing = (ROOT / "CONTRIBUTING.md").read_text()  # what make test installs
    assert "`git` (the upgrade test)" in contributing


APT_LOCKS = (Path("/var/lib/dpkg/lock-frontend"), Path("/var/lib/apt/lists/lock"))


@contextlib.contextmanager
def held(path: Path, seconds: float) -> Iterator[None]:
    """Hold apt's lock `path` (a fcntl write lock, as apt takes it) for `seconds`."""
    with path.open("r+") as f:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        timer = threading.Timer(seconds, fcntl.lockf, (f, fcntl.LOCK_UN))
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            fcntl.lockf(f, fcntl.LOCK_UN)


# Changes nothing: reinstalls no package, reads no source (the lists' lock is still taken).
NO_OP = {
    APT_LOCKS[0]: ["install", "-y", "-qq", "--no-install-recommends", "coreutils"],
    APT_LOCKS[1]: [
        "-o", "Dir::Etc::sourcelist=/dev/null", "-o", "Dir::Etc::sourceparts=/nonexistent",
        "update", "-qq",
    ],
}  # fmt: skip


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("apt-get") is None or not all(p.exists() for p in APT_LOCKS),
    reason="apt's locks are root's, on Debian and Ubuntu",
)
@pytest.mark.parametrize("lock", APT_LOCKS, ids=["dpkg", "lists"])
def test_the_installers_wait_for_a_held_apt_lock(lock: Path) -> None:
    hold = 3.0
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with held(lock, hold):
        plain = subprocess.run(["apt-get", *NO_OP[lock]], capture_output=True, text=True, env=env)
    assert plain.returncode == 100 and "Could not get lock" in plain.stderr, plain.stderr
    started = time.monotonic()
    with held(lock, hold):
        waited = subprocess.run(
            ["sh", str(ROOT / "tests" / "apt-wait.sh"), *NO_OP[lock]],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    took = time.monotonic() - started
    assert waited.returncode == 0, waited.stderr
    assert took >= hold - 0.5, took
    # Every apt-get of the installers that takes a lock goes through it.
    for script in INSTALLERS:
        text = (ROOT / script).read_text()
        assert "apt-wait.sh" in text, script
        assert not LOCKING_APT_GET.search(text), (script, LOCKING_APT_GET.search(text))


INSTALLERS = (
    "tests/install-missing.sh",
    "tests/install-prometheus.sh",
    "deploy/e2e/install-deps.sh",
)
# apt-get update or install run as a command (not in a message)
LOCKING_APT_GET = re.compile(r"^\s*(\w+=\S+ )*apt-get (\S+ )*(update|install)\b", re.M)


def test_no_apt_installs_nothing_even_as_root(tmp_path: Path) -> None:
    """`make test NO_APT=1`: what is missing is said, not installed (README, CONTRIBUTING.md)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    called = tmp_path / "apt-get.called"
    for name in ("apt-get", "id"):  # an apt-get that records its call; a root `id -u`
        body = f"touch {called}\n" if name == "apt-get" else "echo 0\n"
        (fake / name).write_text("#!/bin/sh\n" + body)
        (fake / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}

    def missing(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", str(ROOT / "tests" / "install-missing.sh"), "a test", "it skips",
             "no-such-command-here:some-package"],
            capture_output=True, text=True, env={**env, **extra}, timeout=30,
        )  # fmt: skip

    said = missing({"NO_APT": "1"})
    assert said.returncode == 0, said.stderr
    assert said.stdout.strip() == (
        "missing: some-package (apt-get install some-package as root); it skips"
    )
    assert not called.exists()
    installed = missing({})  # the same as root without NO_APT: apt-get runs
    assert "installing Debian's some-package (a test)" in installed.stdout, installed
    assert called.exists()
