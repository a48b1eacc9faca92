"""The Makefile's set-up targets, run for real by make in a copy of the project.

Python's venv, pip and apt-get are stand-ins (shell scripts that log their
arguments), so these tests need neither the network nor root, and they show
what `make` would run on a fresh machine: a venv creation that failed is
started again, and prometheus/promtool are unpacked, never installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What the targets may call, and nothing else: PATH holds only links to these
# (so a promtool installed on this machine cannot hide a fault).
UTILITIES = (
    "sh",
    "make",
    "rm",
    "cp",
    "ln",
    "mkdir",
    "mktemp",
    "head",
    "id",
    "cat",
    "chmod",
    "touch",
    "dpkg-deb",
    "tar",
    "xz",
    "gzip",
    "find",
    "tee",
    "grep",
    "tail",
)

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The Makefile and its helper script in an otherwise empty project."""
    proj = tmp_path / "proj"
    (proj / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", proj / "Makefile")
    shutil.copy(ROOT / "tests" / "install-prometheus.sh", proj / "tests")
    (proj / "pyproject.toml").write_text("")
    return proj


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A PATH directory with the utilities above and nothing else."""
    path = tmp_path / "path"
    path.mkdir()
    for name in UTILITIES:
        found = shutil.which(name)
        if found:
            (path / name).symlink_to(found)
    return path


def make(project: Path, bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(bin_dir), "HOME": str(project), "LC_ALL": "C"}
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def pythons(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(broken python, working python, log of the stand-in pip's calls)."""
    log = tmp_path / "pip.log"
    # Debian's python3 without python3-venv: the venv's python exists, pip never comes.
    broken = script(
        tmp_path / "broken-python",
        'mkdir -p "$3/bin" && touch "$3/bin/python" && chmod +x "$3/bin/python"\n'
        'echo "The virtual environment was not created successfully because ensurepip'
        ' is not available." >&2\nexit 1\n',
    )
    working = script(
        tmp_path / "python",
        f'mkdir -p "$3/bin" && touch "$3/bin/python"\n'
        f'printf \'#!/bin/sh\\necho "$@" >> {log}\\n\' > "$3/bin/pip"\n'
        'chmod +x "$3/bin/python" "$3/bin/pip"\n',
    )
    return broken, working, log


def test_a_failed_venv_creation_does_not_stick(
    project: Path, bin_dir: Path, tmp_path: Path
) -> None:
    broken, working, log = pythons(tmp_path)

    failed = make(project, bin_dir, "install", f"PYTHON={broken}")
    assert failed.returncode != 0
    assert "apt-get install python3-venv" in failed.stdout + failed.stderr
    assert not (project / ".venv").exists()

    # What an older Makefile left behind: a venv with a python and no pip.
    script(project / ".venv" / "bin" / "python", "exit 0\n")
    healed = make(project, bin_dir, "install", f"PYTHON={working}")
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert "install --quiet -e .[dev]" in log.read_text()
    assert (project / ".venv" / ".installed").exists()

    # Once installed, nothing is created again.
    again = make(project, bin_dir, "install", f"PYTHON={broken}")
    assert again.returncode == 0, again.stdout + again.stderr


def fake_deb(tmp_path: Path) -> Path:
    """A .deb holding usr/bin/prometheus and usr/bin/promtool stand-ins."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed")
    tree = tmp_path / "deb"
    for tool in ("prometheus", "promtool"):
        script(tree / "usr" / "bin" / tool, f'echo "{tool}, version 0.0.0-test"\n')
    (tree / "DEBIAN").mkdir()
    (tree / "DEBIAN" / "control").write_text(
        "Package: prometheus\nVersion: 0.0.0\nArchitecture: all\n"
        "Maintainer: test <test@example.org>\nDescription: stand-in\n"
    )
    deb = tmp_path / "prometheus_0.0.0_all.deb"
    subprocess.run(["dpkg-deb", "-b", str(tree), str(deb)], check=True, capture_output=True)
    return deb


def apt_get(bin_dir: Path, tmp_path: Path, deb: Path | None) -> Path:
    """A stand-in apt-get that logs its arguments and `download`s `deb` into the cwd."""
    log = tmp_path / "apt-get.log"
    log.touch()
    fetch = f"cp {deb} .\n" if deb else "exit 100\n"
    script(
        bin_dir / "apt-get",
        f'echo "$@" >> {log}\ncase " $* " in *" download "*) {fetch};; esac\n',
    )
    return log


def venv(project: Path) -> Path:
    """An installed venv, so that only the prometheus target runs."""
    bin_ = project / ".venv" / "bin"
    script(bin_ / "pip", "exit 0\n")
    return bin_


def test_prometheus_is_unpacked_into_the_venv_not_installed(
    project: Path, bin_dir: Path, tmp_path: Path
) -> None:
    log = apt_get(bin_dir, tmp_path, fake_deb(tmp_path))
    bin_ = venv(project)

    proc = make(project, bin_dir, "prometheus")

    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    assert calls and all(call.split()[0] == "download" for call in calls), calls
    for tool in ("prometheus", "promtool"):
        assert os.access(bin_ / tool, os.X_OK), tool
    assert "promtool, version 0.0.0-test" in proc.stdout
    # Up to date afterwards: apt-get is not asked again.
    assert make(project, bin_dir, "prometheus").returncode == 0
    assert log.read_text().splitlines() == calls


def test_prometheus_on_path_is_linked(project: Path, bin_dir: Path, tmp_path: Path) -> None:
    log = apt_get(bin_dir, tmp_path, None)
    for tool in ("prometheus", "promtool"):
        script(tmp_path / "system" / tool, "exit 0\n")
        (bin_dir / tool).symlink_to(tmp_path / "system" / tool)
    bin_ = venv(project)

    proc = make(project, bin_dir, "prometheus")

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert log.read_text() == ""
    assert (bin_ / "promtool").resolve() == (tmp_path / "system" / "promtool").resolve()


def test_prometheus_missing_without_apt_says_what_to_do(
    project: Path, bin_dir: Path, tmp_path: Path
) -> None:
    venv(project)

    proc = make(project, bin_dir, "prometheus")

    assert proc.returncode != 0
    assert "put them on PATH" in proc.stderr


def test_the_editable_install_prints_no_setuptools_warning(tmp_path: Path) -> None:
    """`make install` is quiet: no BuildBackendWarning block from setuptools on each install."""
    # Into a venv of its own: installing into this one would replace the project here.
    target = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(target / "bin" / "python")]
    proc = subprocess.run(
        [*pip, "install", "--quiet", "--no-deps", "-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "BuildBackendWarning" not in proc.stderr, proc.stderr
    assert "Editable install" not in proc.stderr, proc.stderr


def test_make_clean_removes_what_runs_made_and_keeps_the_source(
    project: Path, bin_dir: Path
) -> None:
    made = [
        ".venv/bin/python",
        ".hypothesis/examples/x",
        "bench/results/run.json",
        "bench/.runtime-venv/bin/python",
        "sidecar/__pycache__/cli.cpython-311.pyc",
        "tests/nemesis/__pycache__/net.cpython-311.pyc",
        ".pytest_cache/v",
        "anarchon_sidecar.egg-info/PKG-INFO",
    ]
    kept = ["sidecar/cli/main.py", "bench/runtime.py", "tests/test_x.py", "docs/CLI.md"]
    for name in made + kept:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("x")
    res = make(project, bin_dir, "clean")
    assert res.returncode == 0, res.stdout + res.stderr
    assert [name for name in made if (project / name).exists()] == []
    assert not (project / "sidecar" / "__pycache__").exists()
    assert [name for name in kept if not (project / name).exists()] == []


def test_make_unit_runs_the_second_pass_after_a_failed_first(
    project: Path, bin_dir: Path, tmp_path: Path
) -> None:
    """A timing failure in the first pass must not hide the reliability scenarios and
    the nemesis: both passes run, and make still fails. What the first pass said of
    its failure is told again after the second pass (the end of a cut log)."""
    log = tmp_path / "pytest.log"
    script(project / ".venv" / "bin" / "pip", "exit 0\n")
    script(
        project / ".venv" / "bin" / "pytest",
        f'echo "$@" >> {log}\n'
        'case "$*" in *"reliability tests/nemesis") echo "second pass: all passed"; exit 0;; esac\n'
        'echo "____ test_y ____"; echo "tests/test_x.py:12: in test_y"; echo "filler"\n'
        'echo "log new-1| 12:00:01 WARNING lease lock.a expired"\n'
        'echo "E   assert 1 == 2"; echo "FAILED tests/test_x.py::test_y - assert 1 == 2"\n'
        "exit 1\n",
    )
    (project / ".venv" / ".installed").touch()
    res = make(
        project,
        bin_dir,
        "unit",
        "-o",
        "prometheus",
        "-o",
        "verifiers",
        "-o",
        "git-tool",
        "-o",
        "netns-tools",
        "-o",
        "chromium",
        "-o",
        "helm",
        "-o",
        "oldest-python",
    )
    assert res.returncode != 0, res.stdout + res.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2, calls
    assert calls[1].endswith("tests/reliability tests/nemesis"), calls
    after = res.stdout.split("second pass: all passed", 1)[1].splitlines()
    told = [line for line in after if "test_y" in line or line.startswith(("E ", "log "))]
    assert told == [
        "log new-1| 12:00:01 WARNING lease lock.a expired",
        "____ test_y ____",
        "tests/test_x.py:12: in test_y",
        "E   assert 1 == 2",
        "FAILED tests/test_x.py::test_y - assert 1 == 2",
    ], res.stdout
