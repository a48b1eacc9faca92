"""Jobs of the state bucket share their equal parsed parts (issue 49: 100,000 jobs).

Two jobs judged with equal settings hold one calendar, one set of request
headers, one retry, claim and cancel setting and one method string; a job
with other settings gets its own, and its neighbour's stay as they were.
What a job sends and when it runs are unchanged: the cancel request of a job
without ``overlap: replace`` is never sent, and one with it keeps its path.
"""

from __future__ import annotations

from typing import Any

from sidecar.admin.jobcheck import judge
from sidecar.config import interning, job_request
from sidecar.config.load import parse_config
from sidecar.config.model import Config

TARGET_HEADERS = {"Authorization": "Bearer app-token"}


def file_config() -> Config:
    return parse_config(
        {
            "instance_id": "i1",
            "nats": {"servers": ["nats://127.0.0.1:4222"]},
            "target": {"url": "http://127.0.0.1:8080", "headers": TARGET_HEADERS},
            "jobs": [{"name": "keep", "schedule": "0 0 1 1 *"}],
        },
        {},
    )


def tenant(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": f"tenant-{i}",
        "id": f"t/{i}",
        "schedule": "5 3 * * *",
        "timezone": "Europe/Paris",
        "request": {"path": f"/tenants/{i}/sync"},
        "retry": {"max": 2, "backoff": "10s"},
        **extra,
    }


def test_equal_settings_are_one_object_for_every_job() -> None:
    cfg = file_config()
    a = judge(cfg, "job.tenant-1", tenant(1)).job
    b = judge(cfg, "job.tenant-2", tenant(2)).job
    assert a.schedule is b.schedule
    assert a.request.headers is b.request.headers
    assert dict(a.request.headers) == TARGET_HEADERS
    assert a.retry is b.retry and a.claim is b.claim and a.answer is b.answer
    assert a.cancel is b.cancel
    assert a.request.method is b.request.method == "POST"
    # Each job keeps its own path; its cancel request (never sent without
    # overlap: replace) reads as the request's own path.
    assert (a.request.path, b.request.path) == ("/tenants/1/sync", "/tenants/2/sync")
    assert a.cancel.path == "" and (a.cancel.path or a.request.path) == "/tenants/1/sync"


def test_a_job_with_other_settings_leaves_its_neighbour_alone() -> None:
    cfg = file_config()
    a = judge(cfg, "job.tenant-1", tenant(1)).job
    other = tenant(
        2,
        schedule="7 4 * * *",
        request={"path": "/tenants/2/sync", "method": "put", "headers": {"X-Tenant": "2"}},
        retry={"max": 3},
    )
    b = judge(cfg, "job.tenant-2", other).job
    assert a.schedule is not b.schedule and a.schedule.expr == "5 3 * * *"
    assert b.schedule.expr == "7 4 * * *"
    assert dict(a.request.headers) == TARGET_HEADERS
    assert dict(b.request.headers) == {**TARGET_HEADERS, "X-Tenant": "2"}
    assert (a.request.method, b.request.method) == ("POST", "PUT")
    assert (a.retry.max, b.retry.max) == (2, 3)
    # A third job like the first shares the first's parts, not the second's.
    c = judge(cfg, "job.tenant-3", tenant(3)).job
    assert c.schedule is a.schedule and c.request.headers is a.request.headers
    # Two jobs adding the same header share the merged headers, in the order sent.
    d = judge(cfg, "job.tenant-4", {**other, "name": "tenant-4"}).job
    assert d.request.headers is b.request.headers
    assert list(d.request.headers) == ["Authorization", "X-Tenant"]


def test_a_replace_job_keeps_its_own_cancel_path() -> None:
    cfg = file_config()
    a = judge(cfg, "job.tenant-1", tenant(1, overlap="replace")).job
    b = judge(cfg, "job.tenant-2", tenant(2, overlap="replace")).job
    assert (a.cancel.path, b.cancel.path) == ("/tenants/1/sync", "/tenants/2/sync")
    assert a.cancel.method == b.cancel.method == "DELETE"


def test_sharing_goes_on_after_the_tables_filled() -> None:
    """A sidecar that has judged thousands of distinct jobs over weeks still
    shares the equal parts of the next ones (the tables forget their oldest
    entries; they do not stop keeping). Failed on CI: other tests had filled
    the tables first, and new jobs shared nothing."""
    cfg = file_config()
    for i in range(interning.SHARED_MAX + 10):
        job = tenant(i, schedule=f"{i % 60} {i // 60 % 24} {i // 1440 % 28 + 1} * *")
        job["request"] = {"path": "/x", "headers": {"X-Tenant": str(i)}}
        judge(cfg, f"job.fill-{i}", {**job, "name": f"fill-{i}"})
    assert len(interning.CALENDARS) <= interning.SHARED_MAX
    assert len(job_request._HEADERS) <= interning.SHARED_MAX
    a = judge(cfg, "job.tenant-1", tenant(1, schedule="9 9 9 9 *")).job
    b = judge(cfg, "job.tenant-2", tenant(2, schedule="9 9 9 9 *")).job
    assert a.schedule is b.schedule
    assert a.request.headers is b.request.headers
