"""podman as the container suites run it (tests/e2e, tests/hosts): runc, cgroupfs, file
events and vfs storage from deploy/e2e/containers.toml (see CONTAINERS.md's flags)."""

from __future__ import annotations

import os
import subprocess

from tests.support import ROOT

CONTAINERS_CONF = ROOT / "deploy" / "e2e" / "containers.toml"
PODMAN_ENV = {"CONTAINERS_CONF": str(CONTAINERS_CONF), "STORAGE_DRIVER": "vfs"}


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `podman ARGS`; an AssertionError with its output when it fails and `check`."""
    proc = subprocess.run(
        ["podman", *args],
        env={**os.environ, **PODMAN_ENV},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc
