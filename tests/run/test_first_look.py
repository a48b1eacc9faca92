"""A slot due while a sidecar starts waits for its first look at the stream and
its first read of the state bucket.

A real sidecar process and nats-server; the first look (failpoint
``stream.check``) or the first read (``watch.read``) is made late on purpose,
as a loaded machine or a slow JetStream makes it. Before the fix, each slot
due meanwhile was skipped at once ("stream not checked yet", "state bucket not
read yet"): a ``run_on: every`` instance restarted just before a slot lost that
slot on its own app (CI: the fleet counted it missed, as ``away``).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from tests.receivers import Receiver, receiver
from tests.support import NatsServer, job, sidecars, wait_for

LATE = 2.5  # the first look (or read) comes this long after the job's walk began
YEARLY = {"name": "keep", "schedule": "0 0 1 1 *"}


@pytest.mark.parametrize("point", ["stream.check", "watch.read"])
def test_slots_due_before_the_first_look_are_claimed_once_it_comes(
    tmp_path: Path, nats_server: NatsServer, point: str
) -> None:
    gen = receiver()
    app = next(gen)
    try:
        tick = job("tick", schedule="* * * * * *", run_on="every", max_late="10s")
        config = {"nats": {"servers": [nats_server.url]}, "target": {"url": app.url}}
        # The stream made beforehand: a slot before a stream's creation is never claimed.
        with sidecars(tmp_path, [("first", {**config, "jobs": [YEARLY]}, {})]):
            pass
        env = {"ANARCHON_FAILPOINTS": f"{point}=1*sleep({LATE})"}
        with sidecars(tmp_path, [("a", {**config, "jobs": [tick]}, env)]) as (a,):
            # Its sleep's line, and LATE after it the look (the log's local time).
            slept = next(x for x in a.log().splitlines() if f"failpoint {point}: sleep" in x)
            ready_at = datetime.fromisoformat(slept[:23].replace(",", ".")).timestamp() + LATE
            wait_for(
                lambda: any(s / 1000 > ready_at + 1 for s in slots_of(app)), 15, what="a run on"
            )
            got = Counter(slots_of(app))
            log = a.log()
        # Every slot due while it waited ran, once, claimed once the look came.
        before = sorted(s for s in got if s / 1000 < ready_at)
        assert len(before) >= 2, (before, ready_at, sorted(got), log)
        first, last = min(got), max(got)
        assert sorted(got) == list(range(first, last + 1000, 1000)), got
        assert max(got.values()) == 1, got
        assert "stream not checked yet" not in log, log
    finally:
        next(gen, None)


def slots_of(app: Receiver) -> list[int]:
    return [int(r.headers["X-Anarchon-Slot"]) for r in app.received("/jobs/tick")]
