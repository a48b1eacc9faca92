"""What a nats-server version can do for the sidecar (docs/DEPLOY.md, supported range).

The supported range is the range the tests run (tests/store/test_nats_versions.py):
2.11.2 to 2.15.1. The lower end is not 2.11.0: until 2.11.2 a key whose
per-message TTL ran out vanished without the ``MaxAge`` marker, so a lease
that expired was seen by nobody and the run of a runner that died was never
recorded ``lost``. Claims, pause and overlap locks work there; losing runs
in silence does not, so the sidecar says so at start.
"""

from __future__ import annotations

import re

SUPPORTED_FROM = (2, 11, 2)
TESTED_UP_TO = (2, 15, 1)


def parse_version(text: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a server's version string; None when it is not one."""
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if match is None or match.group(1) == "0":  # nats-py's "0.0.0-unknown"
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def version_problem(text: str) -> str | None:
    """One line for a connected server older than the supported range; None otherwise."""
    version = parse_version(text)
    if version is None or version >= SUPPORTED_FROM:
        return None
    low, found = ".".join(map(str, SUPPORTED_FROM)), ".".join(map(str, version))
    return (
        f"nats-server {found} is older than {low}, the oldest supported: an expired key "
        "leaves no MaxAge marker there, so a run whose runner dies is never recorded lost "
        f"and on_lost: rerun never reruns it; upgrade NATS to {low} or later"
    )
