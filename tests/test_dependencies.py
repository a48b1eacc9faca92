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


def test_the_otel_extra_is_optional_and_never_imported_without_an_endpoint() -> None:
    """``pip install anarchon-sidecar[otel]`` brings the OTLP exporter; a sidecar
    without ``tracing.otlp_endpoint`` never imports it, and without the extra it
    still starts (traceparent and trace ids work, export is refused in one line)."""
    requires = importlib.metadata.requires("anarchon-sidecar") or []
    otel = [r for r in requires if 'extra == "otel"' in r]
    assert [requirement_name(r) for r in otel] == ["opentelemetry-proto"]
    code = (
        "import sys\n"
        "import sidecar.cli, sidecar.daemon, sidecar.job, sidecar.aftermath\n"
        "from sidecar.config import parse_config\n"
        "from sidecar.tracing import span_exporter\n"
        "jobs = [{'name': 'a', 'schedule': '* * * * *'}]\n"
        "assert span_exporter(parse_config({'jobs': jobs}, {})) is None\n"
        "assert not [m for m in sys.modules if m.startswith(('opentelemetry', 'google'))]\n"
        "sys.modules['opentelemetry'] = None\n"
        "cfg = parse_config({'jobs': jobs, 'tracing': {'otlp_endpoint': 'http://x:4318'}}, {})\n"
        "assert span_exporter(cfg) is None\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert "the otel extra is not installed" in proc.stderr
