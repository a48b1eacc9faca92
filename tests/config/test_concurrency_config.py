"""``jobs[].concurrency`` in the config: its shape, and one limit per key (docs/CONFIG.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.config.load import ConfigError, parse_config
from sidecar.config.model import ConcurrencyConfig
from sidecar.store.digests import job_hash
from tests.support import run_cli, write_config


def config_of(*concurrency: object) -> dict[str, Any]:
    jobs = [
        {"name": f"j{i}", "schedule": "* * * * *", "concurrency": c}
        for i, c in enumerate(concurrency)
    ]
    return {"target": {"url": "http://127.0.0.1:8080"}, "jobs": jobs}


def test_jobs_sharing_a_key_with_one_limit() -> None:
    shared = {"key": "db-heavy", "limit": 2}
    config = parse_config(config_of(shared, shared, None), {})
    assert [j.concurrency for j in config.jobs] == [
        ConcurrencyConfig("db-heavy", 2),
        ConcurrencyConfig("db-heavy", 2),
        None,
    ]
    # The limit is part of the job's hash: replicas that differ are flagged.
    other = parse_config(config_of({"key": "db-heavy", "limit": 3}), {}).jobs[0]
    assert job_hash(config.jobs[0]) != job_hash(other)
    assert job_hash(config.jobs[0]) != job_hash(config.jobs[2])


@pytest.mark.parametrize(
    ("concurrency", "key", "says"),
    [
        ("db", "jobs[0].concurrency", "expected a map"),
        ({"limit": 2}, "jobs[0].concurrency.key", "required"),
        ({"key": "db"}, "jobs[0].concurrency.limit", "required"),
        ({"key": "db", "limit": 0}, "jobs[0].concurrency.limit", "between 1 and 100, got 0"),
        ({"key": "db", "limit": 101}, "jobs[0].concurrency.limit", "between 1 and 100"),
        ({"key": "db", "limit": "2"}, "jobs[0].concurrency.limit", "whole number"),
        ({"key": "db", "limit": True}, "jobs[0].concurrency.limit", "whole number"),
        ({"key": "db.x", "limit": 2}, "jobs[0].concurrency.key", "not a concurrency key"),
        ({"key": "d b", "limit": 2}, "jobs[0].concurrency.key", "not a concurrency key"),
        ({"key": "x" * 65, "limit": 2}, "jobs[0].concurrency.key", "at most 64"),
        ({"key": "db", "limit": 2, "wait": 1}, "jobs[0].concurrency.wait", "unknown key"),
    ],
)
def test_a_malformed_concurrency_names_its_key(concurrency: object, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(config_of(concurrency), {})
    assert err.value.key == key, err.value
    assert says in str(err.value), err.value


def test_two_limits_for_one_key_are_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(config_of({"key": "db", "limit": 2}, None, {"key": "db", "limit": 3}), {})
    assert err.value.key == "jobs[2].concurrency.limit"
    assert "concurrency key 'db' has limit 3 here but 2 in jobs[0] (j0)" in str(err.value)


def test_check_says_the_limit_or_refuses_with_exit_2(tmp_path: Path) -> None:
    good = config_of({"key": "db", "limit": 2}, {"key": "db", "limit": 2})
    good["jobs"][1]["overlap"] = "skip"
    ok = run_cli("check", "-c", str(write_config(tmp_path / "good.yaml", good)))
    assert ok.returncode == 0, ok.stderr
    assert (
        "  concurrency db: at most 2 run(s) at once of j0, j1 (fleet-wide); when all are "
        "held, a slot waits up to max_late, then skipped"
    ) in ok.stdout
    assert "when all are held, a slot skipped" in ok.stdout
    bad = config_of({"key": "db", "limit": 2}, {"key": "db", "limit": 1})
    refused = run_cli("check", "-c", str(write_config(tmp_path / "bad.yaml", bad)))
    assert refused.returncode == 2, refused
    assert "config error: jobs[1].concurrency.limit: concurrency key 'db' has limit 1" in (
        refused.stderr
    )
    assert "Traceback" not in refused.stderr
