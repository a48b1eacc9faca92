"""What a plain ``pip install anarchon-sidecar`` brings: the runtime dependencies only.

A sidecar runs beside every replica, so every installed package is paid once
per replica. aiohttp is the one to keep out: nats-py imports it whenever it is
installed (about 10 MiB of RSS). The tests' toy apps use it from the dev extra.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import (
    NatsServer,
    RecordingApp,
    base,
    job,
    sidecars,
    wait_for,
    write_config,
)

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
        "for m in pkgutil.walk_packages(sidecar.__path__, 'sidecar.'):\n"
        "    if m.name == 'sidecar.__main__': continue\n"
        "    importlib.import_module(m.name)\n"
        "import sidecar.run.trigger, sidecar.admin.server, h11\n"
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
        "import sidecar.cli.main, sidecar.cli.daemon, sidecar.run.job_loop\n"
        "import sidecar.after.aftermath\n"
        "from sidecar.config.load import parse_config\n"
        "from sidecar.obs.spans import span_exporter\n"
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


def test_the_uvloop_extra_is_optional_and_only_used_when_asked_for(tmp_path: Path) -> None:
    """``pip install anarchon-sidecar[uvloop]`` brings uvloop; only
    ``ANARCHON_EVENT_LOOP=uvloop`` imports it. Asked for without the extra, or
    a loop that does not exist: exit 2 naming the variable, no traceback."""
    requires = importlib.metadata.requires("anarchon-sidecar") or []
    extra = [r for r in requires if 'extra == "uvloop"' in r]
    assert [requirement_name(r) for r in extra] == ["uvloop"]
    code = (
        "import os, sys\n"
        "from sidecar.cli.shared import loop_factory\n"
        "os.environ.pop('ANARCHON_EVENT_LOOP', None)\n"
        "assert loop_factory() is None\n"
        "os.environ['ANARCHON_EVENT_LOOP'] = 'asyncio'\n"
        "assert loop_factory() is None\n"
        "assert 'uvloop' not in sys.modules\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    # Any command goes through the same switch before it connects anywhere.
    config = write_config(
        tmp_path / "c.yaml",
        {
            "nats": {"servers": ["nats://127.0.0.1:1"]},
            "jobs": [{"name": "a", "schedule": "0 3 * * *"}],
        },
    )
    run = (
        "import sys\n"
        "sys.modules['uvloop'] = None\n"  # the plain install: uvloop not there
        f"sys.argv = ['anarchon-sidecar', 'stream', '-c', {str(config)!r}]\n"
        "from sidecar.__main__ import entry\n"
        "entry()\n"
    )
    for loop, message in (
        ("uvloop", "ANARCHON_EVENT_LOOP=uvloop but uvloop is not installed: pip install"),
        ("tokio", "ANARCHON_EVENT_LOOP='tokio': use asyncio or uvloop"),
    ):
        proc = subprocess.run(
            [sys.executable, "-c", run],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "ANARCHON_EVENT_LOOP": loop},
        )
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_sidecar_on_uvloop_runs_its_slots(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """With the extra installed and ANARCHON_EVENT_LOOP=uvloop, a real sidecar says
    which loop it runs on and triggers its job's slots like on asyncio's."""
    pytest.importorskip("uvloop")
    config = base(nats_server, http_app, [job("tick")])
    with sidecars(tmp_path, [("uv", config, {"ANARCHON_EVENT_LOOP": "uvloop"})]) as (proc,):
        wait_for(lambda: len(http_app.requests) >= 2, 20, what="two slots triggered")
        assert proc.terminate() == 0
    assert "event loop: uvloop" in proc.log(), proc.log()
    assert "Traceback" not in proc.log()
