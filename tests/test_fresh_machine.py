"""Where `make test` cannot do everything: a root container without network admin rights.

`podman run debian` (or docker without --privileged) gives root without
CAP_NET_ADMIN and CAP_SYS_ADMIN: the nemesis and its network tests cannot make
namespaces there. They must skip saying why (and `make test` lists the
reasons), and fail under CI, where the nemesis must run. The same rights are
dropped here from the bounding set with setpriv (util-linux), as a container
runtime does; only the can-it-run check runs, never the nemesis itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.nemesis.net import CAP_NET_ADMIN, CAP_SYS_ADMIN, _effective_caps
from tests.support import ROOT, sidecar_env

NET_TESTS = ("tests/nemesis/test_net.py", "tests/nemesis/test_nemesis.py")

pytestmark = pytest.mark.skipif(
    shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed"
)


def pytest_without_net_admin(ci: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in sidecar_env().items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    caps = _effective_caps()
    has_rights = caps >> CAP_NET_ADMIN & 1 or caps >> CAP_SYS_ADMIN & 1
    # Already without them (a container, say): as we are. Else drop them as a runtime does.
    drop = ["setpriv", "--bounding-set", "-net_admin,-sys_admin"] if has_rights else []
    return subprocess.run(
        [
            *drop,
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-q",
            *NET_TESTS,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_network_admin_rights_the_nemesis_skips_saying_why() -> None:
    res = pytest_without_net_admin(ci=False)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "passed" not in out and "failed" not in out and "error" not in out.lower(), out
    # -rfEs (pyproject's addopts): each skip with its reason in the summary
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) >= 2, out
    why = "needs CAP_NET_ADMIN and CAP_SYS_ADMIN" if os.geteuid() == 0 else "needs root"
    assert all(why in line for line in skips), out


def test_under_ci_a_nemesis_that_cannot_run_fails() -> None:
    res = pytest_without_net_admin(ci=True)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "CI must run the nemesis: needs" in out, out
