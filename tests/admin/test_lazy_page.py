"""The fleet page as `run` starts it: loaded and built by its first request."""

from __future__ import annotations

import asyncio

from sidecar.admin.lazy_page import LazyPage
from sidecar.admin.server import Answer, Request
from sidecar.cli.daemon import Daemon
from sidecar.config.load import Secrets, parse_config


def daemon() -> Daemon:
    config = parse_config(
        {
            "nats": {"servers": "nats://127.0.0.1:1"},
            "jobs": [{"name": "a", "schedule": "* * * * *"}],
        },
        {},
    )
    return Daemon(config, Secrets())


async def test_built_once_by_concurrent_first_requests_keeping_what_was_seen_before() -> None:
    d = daemon()
    page = d.page
    assert isinstance(page, LazyPage) and page.app is None and d.admin.app is page
    for listener in d.fleet.key_listeners:  # the watch delivers presences before any viewer
        listener("instance.s1")
    seen = page.seen["s1"]
    answers = await asyncio.gather(
        *(page(Request("GET", "/api/v1/jobs", headers={"host": "side"})) for _ in range(3))
    )
    assert all(isinstance(a, Answer) and a.status == 200 for a in answers), answers
    app = page.app
    assert app is not None and await page.get() is app  # one page for every request
    assert app.live.seen == {"s1": seen} and app.tokens is page.tokens
    assert page._key not in d.fleet.key_listeners  # the page's live feed keeps it now
    for listener in d.fleet.key_listeners:
        listener("instance.s2")
    assert set(app.live.seen) == {"s1", "s2"}
    assert app.live.jobs_changed in d.bucket_jobs.listeners
    await page.stop()
