"""The release bookkeeping: one version everywhere people and tools look for it.

The version is `sidecar.__version__`. It must agree with the image label and
the changelog, and show in a running sidecar's `/metrics`, in the fleet view
(`status`) and in the trigger's `User-Agent` (`--version`: tests/cli/test_cli.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from sidecar import __version__
from tests import test_upgrade
from tests.support import (
    ROOT,
    NatsServer,
    RecordingApp,
    run_cli,
    sidecars,
    wait_for,
    write_config,
)

RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d\d-\d\d)$", re.MULTILINE)


def released() -> list[str]:
    """The released versions of CHANGELOG.md, newest first."""
    return [m.group(1) for m in RELEASE.finditer((ROOT / "CHANGELOG.md").read_text())]


def as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3])


def test_the_version_is_semver_and_the_changelog_knows_it() -> None:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(\.dev\d+)?", __version__)
    assert match, __version__
    versions = released()
    assert versions, "CHANGELOG.md has no release"
    assert versions == sorted(versions, key=as_tuple, reverse=True)
    text = (ROOT / "CHANGELOG.md").read_text()
    if match.group(4):  # unreleased code: the next version, above the newest release
        assert "## [Unreleased]" in text
        assert as_tuple(__version__) > as_tuple(versions[0])
        assert f"released as {__version__.rsplit('.dev', 1)[0]}" in text
    else:
        assert versions[0] == __version__


def test_the_upgrade_test_runs_the_newest_release_before_this_code() -> None:
    newest = next(v for v in released() if as_tuple(v) < as_tuple(__version__))
    assert newest == test_upgrade.PREVIOUS_VERSION
    assert f"v{newest}" == test_upgrade.PREVIOUS_TAG
    assert re.fullmatch(r"[0-9a-f]{40}", test_upgrade.PREVIOUS_COMMIT)


def test_the_image_label_is_the_version() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    labels = re.findall(r'org\.opencontainers\.image\.version="([^"]+)"', dockerfile)
    assert labels == [__version__]


def test_a_running_sidecar_shows_its_version_in_metrics_status_and_user_agent(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = {
        "nats": {"servers": [nats_server.url]},
        "target": {"url": http_app.url},
        "jobs": [{"name": "tick", "schedule": "* * * * * *", "jitter": "100ms"}],
    }
    cli = write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config})
    with sidecars(tmp_path, [("web-1", config, {})]) as (proc,):
        assert proc.metric("anarchon_build_info", {"version": __version__}) == 1
        request = wait_for(lambda: http_app.requests_for("/jobs/tick"), 20, what="a run")[0]

        def instances() -> list[dict[str, str]]:
            res = run_cli("status", "-c", str(cli), "--json")
            assert res.returncode == 0, res.stderr
            return list(json.loads(res.stdout)["instances"])

        listed = wait_for(instances, 20, what="the instance in status")
        table = run_cli("status", "-c", str(cli)).stdout
    assert request.headers["User-Agent"] == f"anarchon-sidecar/{__version__}"
    assert [(i["id"], i["version"]) for i in listed] == [("web-1", __version__)]
    assert f"web-1  v{__version__}  since " in table, table
