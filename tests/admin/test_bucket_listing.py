"""The bucket's job list a sidecar serves (``/api/v1/fleet``'s ``bucket_jobs``, the
page's) is ``status --json``'s, while the view lets running jobs' bytes go.

In-process, on the daemon's parts (``make_jobs``), the view filled as the watch
fills it (``View.apply``) and re-read as sidecar/store/watch.py re-reads it (a
fresh view's keys, then ``changed("")``). ``status`` lists a view read whole from
the bucket, every value's bytes in it: here a second view given the same
writes. After each step and its take-up, the runner's listing and the page's
(kept between requests, ``PageData._listing``) equal status's.
"""

from __future__ import annotations

import json
from typing import Any

from sidecar.admin.bucket_jobs import BucketJobs
from sidecar.admin.jobcheck import listing
from sidecar.admin.jobkeys import JobKeys
from sidecar.admin.live import Live
from sidecar.admin.pagecache import PageData
from sidecar.config.load import parse_config
from sidecar.store.state import View
from tests.support import MakeJobs, until


def value(name: str, by: str, at: str, **extra: Any) -> bytes:
    job = {"name": name, "schedule": "0 0 1 1 *", "id": f"t/{name}", "by": by, "at": at}
    return json.dumps({**job, **extra}).encode()


async def test_the_served_list_is_status_s_through_rewrites_removals_and_rereads(
    make_jobs: MakeJobs,
) -> None:
    config = parse_config(
        {
            "nats": {"servers": ["nats://127.0.0.1:1"]},  # not used: no NATS here
            "target": {"url": "http://127.0.0.1:9"},  # never called: nothing is due
            "bucket_jobs": {"max_jobs": 5},
            "jobs": [{"name": "keep", "schedule": "0 0 1 1 *"}],
        },
        {},
    )
    stored: dict[str, tuple[bytes, int]] = {}
    revision = 0

    async with make_jobs(config) as jobs:
        fleet = jobs.ctx.fleet
        view = fleet.view
        keys = JobKeys(config, jobs.metrics, fleet)
        page = PageData(config, fleet, jobs.ctx.guard, jobs.ctx.clock, Live(config, fleet))
        page.bucket_jobs = keys

        def write(name: str, data: bytes) -> None:
            nonlocal revision
            revision += 1
            stored[f"job.{name}"] = (data, revision)
            view.apply(f"job.{name}", data, revision, False)

        def remove(name: str) -> None:
            nonlocal revision
            revision += 1
            del stored[f"job.{name}"]
            view.apply(f"job.{name}", None, revision, True, "DEL")

        def status() -> list[dict[str, Any]]:
            whole = View()
            for key, (data, rev) in stored.items():
                whole.apply(key, data, rev, False)
            whole.synced = True
            return listing(config, whole)

        async def settled(what: str) -> BucketJobs:
            runner = keys.runner
            assert runner is not None
            await until(
                lambda: not runner._wake.is_set() and not runner._dirty and not runner._batch,
                10,
                what=what,
            )
            await until(lambda: keys.listing() == status(), 10, what=f"{what}: listed")
            assert page._listing() == status(), what
            return runner

        view.synced = True
        keys.start(jobs)
        write("a", value("a", "alice", "2026-01-02T03:04:05.678Z"))
        write("b", value("b", "bob", "not a time"))
        write("keep", value("keep", "eve", "2026-01-01T00:00:00Z"))  # shadowed
        write("bad", value("bad", "eve", "x", request={"url": "http://elsewhere"}))
        write("c", value("c", "carol", "2026-01-02T00:00:00Z"))
        runner = await settled("first take-up")
        assert set(runner.running) == {"a", "b", "c"}
        assert view.keys["job.a"].held and not view.keys["job.bad"].held

        # The same job written again by someone else: restamped, listed anew.
        write("a", value("a", "mallory", "2026-03-03T00:00:00Z"))
        runner = await settled("a written again")
        assert runner.running["a"].revision == revision, (runner.running["a"], runner._dirty)
        assert view.keys["job.a"].held
        write("d", value("d", "dan", "2026-01-02T00:00:00Z"))  # the 6th job key: beyond
        await settled("d written beyond the cap")
        # A removal: the key beyond the cap comes in.
        remove("b")
        runner = await settled("b removed")
        assert set(runner.running) == {"a", "c", "d"}
        # A full re-read: every value's bytes back, then held again once judged.
        fresh = View()
        for key, (data, rev) in stored.items():
            fresh.apply(key, data, rev, False)
        view.keys = fresh.keys
        assert keys.listing() == status()
        keys.changed("")
        runner = await settled("a re-read")
        assert all(view.keys[f"job.{n}"].held for n in runner.running)
        # A removal and a write of a new key between two requests: the page lists both.
        remove("c")
        write("e", value("e", "erin", "2026-04-04T00:00:00Z"))
        await settled("c removed, e written")
        await keys.stop()
