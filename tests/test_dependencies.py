"""What a plain ``pip install anarchon-sidecar`` brings: the runtime dependencies only.

A sidecar runs beside every replica, so every installed package is paid once
per replica. aiohttp is the one to keep out: nats-py imports it whenever it is
installed (about 10 MiB of RSS). The tests' toy apps use it from the dev extra.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

RUNTIME = {"nats-py", "prometheus-client", "click", "pyyaml", "cronsim", "h11"}


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return match[0].lower().replace("_", "-")


def test_runtime_requirements_are_exactly_the_lean_set() -> None:
    requires = importlib.metadata.requires("anarchon-sidecar") or []
    runtime = {requirement_name(r) for r in requires if "extra ==" not in r}
    assert runtime == RUNTIME
    aiohttp = [r for r in requires if requirement_name(r) == "aiohttp"]
    assert aiohttp, "the dev extra keeps aiohttp for the tests' apps"
    assert all('extra == "dev"' in r for r in aiohttp), aiohttp


def test_every_module_imports_without_aiohttp() -> None:
    """Every module of the package loads with aiohttp made unimportable."""
    code = (
        "import sys, pkgutil, importlib\n"
        "sys.modules['aiohttp'] = None\n"
        "import sidecar\n"
        "for m in pkgutil.iter_modules(sidecar.__path__):\n"
        "    if m.name == '__main__': continue\n"
        "    importlib.import_module('sidecar.' + m.name)\n"
        "import sidecar.trigger, sidecar.server, h11\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
