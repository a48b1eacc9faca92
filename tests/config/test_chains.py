"""``jobs[].after`` (chains) in the config: what is read, and which configs are
refused with the key named (a cycle, an unknown or own job, a schedule too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.admin.jobcheck import parse_bucket_job
from sidecar.config.load import ConfigError, parse_config
from sidecar.config.model import AfterConfig
from tests.support import run_cli


def config_of(jobs: list[dict[str, Any]]) -> Any:
    return parse_config({"target": {"url": "http://127.0.0.1:8080"}, "jobs": jobs}, {})


A = {"name": "a", "schedule": "* * * * *"}


def test_after_is_read_with_success_by_default_and_no_slots() -> None:
    config = config_of([A, {"name": "b", "after": {"job": "a"}}])
    b = config.job("b")
    assert b.after == AfterConfig("a", "success")
    assert b.schedule.runs(0, 3) == []  # its job loop claims nothing
    assert config_of([A, {"name": "b", "after": {"job": "a", "on": "always"}}]).job(
        "b"
    ).after == AfterConfig("a", "always")
    assert config.job("a").after is None


@pytest.mark.parametrize(
    ("jobs", "key", "words"),
    [
        ([A, {"name": "b", "after": {"job": "b"}}], "jobs[1].after.job", "run after itself"),
        ([A, {"name": "b", "after": {"job": "nope"}}], "jobs[1].after.job", "no job named 'nope'"),
        (
            [{"name": "a", "after": {"job": "b"}}, {"name": "b", "after": {"job": "a"}}],
            "jobs[0].after.job",
            "a cycle: a after b after a",
        ),
        (
            [
                A,
                {"name": "x", "after": {"job": "z"}},
                {"name": "y", "after": {"job": "x"}},
                {"name": "z", "after": {"job": "y"}},
            ],
            "jobs[1].after.job",
            "a cycle: x after z after y after x",
        ),
        ([A, {"name": "b", "after": {}}], "jobs[1].after.job", "required"),
        ([A, {"name": "b", "after": {"job": "a", "on": "maybe"}}], "jobs[1].after.on", ""),
        ([A, {"name": "b", "after": {"job": "a", "when": 1}}], "jobs[1].after.when", ""),
        ([A, {**A, "name": "b", "after": {"job": "a"}}], "jobs[1].schedule", "not with after"),
        (
            [A, {"name": "b", "after": {"job": "a"}, "retry": {"max": 1}}],
            "jobs[1].retry",
            "not retried",
        ),
    ],
)
def test_refused_naming_the_key(jobs: list[dict[str, Any]], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_of(jobs)
    assert str(err.value).startswith(f"{key}:"), err.value
    assert words in str(err.value)


def test_a_job_of_the_state_bucket_cannot_run_after_another() -> None:
    config = config_of([A])
    with pytest.raises(ConfigError, match=r"^job\.b\.after: "):
        parse_bucket_job(config, {"name": "b", "after": {"job": "a"}}, "job.b")


def test_check_says_the_cycle_exit_2_without_a_traceback(tmp_path: Path) -> None:
    jobs = [A, {"name": "b", "after": {"job": "c"}}, {"name": "c", "after": {"job": "b"}}]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"instance_id": "web-1", "jobs": jobs}))
    bad = run_cli("check", "-c", str(cfg))
    assert bad.returncode == 2, bad
    assert "config error: jobs[1].after.job: a cycle: b after c after b" in bad.stderr
    assert "Traceback" not in bad.stderr
    jobs[2]["after"] = {"job": "a", "on": "failure"}
    cfg.write_text(yaml.safe_dump({"instance_id": "web-1", "jobs": jobs}))
    good = run_cli("check", "-c", str(cfg))
    assert good.returncode == 0, good.stderr
