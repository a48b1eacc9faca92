"""The state bucket's job keys as `run` follows them: the runner made on the first.

No NATS: the daemon is built as `run` builds it, and the watch's calls
(a key delivered, a re-sync, a removal) are made by hand, as
tests/admin/test_lazy_page.py does for the page. The processes that add,
update and remove such jobs are in tests/admin/test_bucket_jobs.py.
"""

from __future__ import annotations

from sidecar.admin import jobcheck, jobkeys
from sidecar.admin.jobkeys import JobKeys
from sidecar.cli.daemon import Daemon
from sidecar.config.load import Secrets, parse_config
from sidecar.store.state import Entry, Removal


def daemon() -> tuple[Daemon, JobKeys]:
    config = parse_config(
        {
            "nats": {"servers": "nats://127.0.0.1:1"},
            "jobs": [{"name": "a", "schedule": "* * * * *"}],
        },
        {},
    )
    d = Daemon(config, Secrets())
    assert isinstance(d.bucket_jobs, JobKeys)
    return d, d.bucket_jobs


def tell(d: Daemon, key: str) -> None:
    for listener in d.fleet.key_listeners:
        listener(key)


def test_no_runner_until_a_job_key_then_one_runner_told_of_every_key() -> None:
    d, keys = daemon()
    seen: list[str] = []
    keys.listeners.append(lambda: seen.append("changed"))  # the page joins early
    for key in ("instance.s1", "paused.a", "skip.a", "backfill.a", "at.a", ""):
        tell(d, key)
    for listener in d.fleet.removal_listeners:
        listener(Removal("job.gone", Entry({}, 3), "DEL", None))
    assert keys.runner is None
    # What the page asks before any job key: the file's job, no bucket job.
    assert keys.origin("a") == ("file", None)
    assert keys.origin("other") == ("bucket", None)
    assert keys.listing() == []

    tell(d, "job.dyn")
    runner = keys.runner
    assert runner is not None and runner.jobs is None  # made; its loops start with the daemon
    assert runner.listeners is keys.listeners  # the page, joined before, is told too
    assert runner._dirty == {"dyn"}
    tell(d, "job.other")
    tell(d, "paused.a")
    assert keys.runner is runner and runner._dirty == {"dyn", "other"}
    assert keys.origin("a") == ("file", None) and keys.origin("dyn") == ("bucket", None)


def test_a_resync_holding_a_job_key_makes_the_runner() -> None:
    d, keys = daemon()
    d.fleet.view.keys["instance.s1"] = Entry({"jobs": {}}, 1)
    tell(d, "")
    assert keys.runner is None
    d.fleet.view.keys["job.dyn"] = Entry({"name": "dyn", "schedule": "* * * * *"}, 2)
    tell(d, "")
    # Every job key is named by the runner's next round, in slices (a full re-read
    # of 100,000 keys named here held the loop 60 ms): asked, not named yet.
    assert keys.runner is not None and keys.runner._everything
    assert [item["name"] for item in keys.listing()] == ["dyn"]


async def test_after_stop_a_job_key_makes_nothing() -> None:
    d, keys = daemon()
    await keys.stop()
    tell(d, "job.dyn")
    assert keys.runner is None


def test_the_front_names_keys_and_origins_as_the_runner_does() -> None:
    assert (jobkeys.PREFIX, jobkeys.FILE, jobkeys.BUCKET) == (
        jobcheck.PREFIX,
        jobcheck.FILE,
        jobcheck.BUCKET,
    )
