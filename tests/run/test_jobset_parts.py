"""Every part of a running sidecar reads the one job set (sidecar/config/jobset.py):
a job put into it is run, judged and looked up by every part at once, and one
removed is gone from all of them; no part keeps a copy (issue 49).

Real nats-server, real HTTP app, the parts wired as the daemon wires them.
"""

from __future__ import annotations

import json
import time

from sidecar.config.load import parse_config
from tests.run.test_job_life import running
from tests.support import MakeJobs, NatsServer, RecordingApp, job, slots, until


async def test_a_job_put_into_the_set_is_every_parts_job_and_one_removed_is_no_ones(
    make_jobs: MakeJobs, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = parse_config(
        {
            "instance_id": "a",
            "nats": {"servers": [nats_server.url], "lease_ttl": "3s"},
            "target": {"url": http_app.url, "timeout": "5s"},
            "jobs": [job("file-job", schedule="0 0 1 1 *")],
        },
        {},
    )
    # Jobs as the state bucket's take-up parses them: a plain one and a `replace` one.
    tenants = [job("tenant-1", max_late="5s"), job("tenant-2", overlap="replace", max_late="10s")]
    added = parse_config({"target": {"url": http_app.url}, "jobs": tenants}, {}).jobs
    async with make_jobs(config) as jobs, running(jobs):
        ctx, guard, fleet = jobs.ctx, jobs.guard, jobs.fleet
        # One set, the same object in every part that looks jobs up by name.
        one = ctx.jobs
        parts = {
            "fleet": fleet.jobs,
            "guard": guard.jobs,
            "due": jobs.due.made().by_name,  # made when first needed: made here
            "lost": jobs.lost.jobs,
            "aftermath": jobs.aftermath._jobs,
        }
        assert {name: part is one for name, part in parts.items()} == dict.fromkeys(parts, True)
        assert jobs.overlap is None  # no `replace` job yet: its part not made

        # Their keys in the state bucket, as the take-up found them (a slot of a job
        # not of the file whose key left the view is not claimed: Fleet.left_bucket).
        assert fleet.bucket is not None
        for tenant in tenants:
            await fleet.bucket.kv.put(f"job.{tenant['name']}", json.dumps(tenant).encode())
        await until(lambda: "job.tenant-2" in fleet.view.keys, 10, "the keys in the view")
        one.put(added)
        for job_config in added:
            jobs.start(job_config)
        # Every part knows them now, with nothing copied by hand.
        assert guard.uncovered.get("tenant-1", "unjudged") is None  # the stream holds it
        assert jobs.overlap is not None  # made for tenant-2's `replace`
        assert jobs.overlap.jobs is one
        assert "tenant-2" in fleet._lease_jobs  # its lock needs the bucket's leases
        await until(lambda: len(slots(http_app, "/jobs/tenant-1")) >= 2, 15, "runs")

        await jobs.retire("tenant-1")
        one.remove(["tenant-1", "tenant-2"])
        await jobs.retire("tenant-2")
        assert "tenant-1" not in guard.uncovered and "tenant-2" not in fleet._lease_jobs
        assert all("tenant-1" not in part for part in parts.values())
        assert one.names == ("file-job",)
        ran = len(slots(http_app, "/jobs/tenant-1"))
        later = time.time() + 2.5  # two more slots' time: none is claimed
        await until(lambda: time.time() > later, 5, "two more slots' time")
        assert len(slots(http_app, "/jobs/tenant-1")) == ran
