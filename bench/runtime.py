"""The runtime-only environment the benchmarks measure: a venv with ``pip install .``.

What a user gets from a plain install: the sidecar and its runtime
dependencies, nothing of the dev extra (no aiohttp, which nats-py would
import). Made once in ``bench/.runtime-venv`` and made again when the
project's source changes. Sidecars run from its ``anarchon-sidecar`` script
outside the source tree (so the installed package is the one imported); the
raw baselines (``bench.raw_*``, standard library and nats-py only) run with its
Python from the source tree.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import ROOT, Sidecar, sidecar_env

VENV = ROOT / "bench" / ".runtime-venv"
STAMP = VENV / ".source-hash"


def source_hash() -> str:
    digest = hashlib.sha256()
    # Every file of the package, its subpackages and static files included.
    files = [
        p for p in (ROOT / "sidecar").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    ]
    for path in sorted([ROOT / "pyproject.toml", *files]):
        digest.update(str(path.relative_to(ROOT)).encode() + path.read_bytes())
    return digest.hexdigest()


def ensure(interpreter: str | None = None, extras: tuple[str, ...] = (), name: str = "") -> Path:
    """The runtime venv, made (or made again) from this checkout.

    With `interpreter` (another CPython) or `extras` (an optional extra such as
    ``uvloop``), a venv of its own, ``bench/.runtime-venv-<name>``, made the
    same way: the variants that ``bench.scale`` measures side by side.
    """
    venv = VENV.with_name(f"{VENV.name}-{name}") if name else VENV
    stamp = venv / STAMP.name
    wanted = source_hash() + repr((interpreter, extras))
    if stamp.exists() and stamp.read_text() == wanted:
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([interpreter or sys.executable, "-m", "venv", str(venv)], check=True)
    target = f"{ROOT}[{','.join(extras)}]" if extras else str(ROOT)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", target],
        check=True,
        env=sidecar_env(),
        cwd=venv,
    )
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "list", "--format=freeze"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.lower()
    if "aiohttp" in installed:
        raise RuntimeError("the runtime venv holds aiohttp: a runtime dependency pulls it in")
    stamp.write_text(wanted)
    return venv


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process run with the runtime venv's Python.

    Without the caller's ``PYTHONPATH`` (the house exports the checkout's root
    there): with it, the sidecar would import its package from the source tree,
    not the installed one, and, with ``PYTHONDONTWRITEBYTECODE`` set beside it,
    compile every module at each start (about 1 MiB of RSS more, measured by
    ``bench.footprint``). A ``PYTHONPATH`` in `extra` (a bench measuring
    another checkout) is kept.
    """
    clean = {k: v for k, v in sidecar_env().items() if k != "PYTHONPATH"}
    clean.update(extra or {})
    return clean


def python() -> str:
    return str(ensure() / "bin" / "python")


def packages() -> dict[str, str]:
    """Name -> version of everything in the runtime venv."""
    out = subprocess.run(
        [str(ensure() / "bin" / "pip"), "list", "--format=freeze"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return dict(line.split("==", 1) for line in out.splitlines() if "==" in line)


# The sidecar's script run under a profiler that SIGUSR1 turns on and SIGUSR2 off
# (Python runs a signal's handler in the main thread, the event loop's, which is
# the thread a cProfile.Profile.enable() profiles); written to argv[1] at exit.
# Timed in the process's CPU time, not the wall clock: on a shared machine a
# function's wall time counts the time the process waited for a core as well.
WINDOWED = """
import cProfile, runpy, signal, sys, time
out, script = sys.argv[1], sys.argv[2]
prof = cProfile.Profile(time.process_time)
signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
signal.signal(signal.SIGUSR2, lambda *_: prof.disable())
sys.argv = [script, *sys.argv[3:]]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    prof.disable()
    prof.dump_stats(out)
"""


class RuntimeSidecar(Sidecar):
    """A sidecar run from the runtime venv's ``anarchon-sidecar``, outside the source tree.

    `venv`: another runtime venv (``ensure(..., name=...)``), default the plain one.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Here, not in start(), which benches time: ensure() hashes the sources.
        self.venv: Path = ensure()
        self.cwd = self.workdir  # outside the source tree
        # A file to write this sidecar's cProfile to when it exits (bench.burst's
        # BURST_PROFILE): where its CPU goes, measured in the runtime venv.
        self.profile: Path | None = None
        # With `profile`: profile only between SIGUSR1 and SIGUSR2 (profile_on/off),
        # not the start (bench.burst: the burst's CPU alone, as it measures it).
        self.profile_window = False

    def environment(self) -> dict[str, str]:
        return env(self.env)

    def command(self) -> list[str]:
        script = str(self.venv / "bin" / "anarchon-sidecar")
        if self.profile is not None:
            python = str(self.venv / "bin" / "python")
            if self.profile_window:
                return [python, "-c", WINDOWED, str(self.profile), script]
            return [python, "-m", "cProfile", "-o", str(self.profile), script]
        return [script]

    def profile_on(self) -> None:
        """Start the windowed profile (`profile_window`)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGUSR1)

    def profile_off(self) -> None:
        """Stop the windowed profile; it is written when the sidecar exits."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGUSR2)
