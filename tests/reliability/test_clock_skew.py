"""Clock skew: instances whose clocks are off by up to ±2 s, each in another TZ.

Every instance computes the same slot (epoch ms, UTC) whatever its TZ, so
skewed instances race for the same msg ids and one of them wins each slot.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.reliability.conftest import Figures
from tests.reliability.helpers import (
    config,
    every_second,
    lateness,
    metric_total,
    next_second_ms,
    tally,
    unclaimed_runs,
    wait_all_ran,
)
from tests.support import NatsServer, RecordingApp, read_stream, sidecars

# (clock offset seconds, TZ of the process)
INSTANCES = [
    (-2.0, "Pacific/Chatham"),
    (-1.0, "America/New_York"),
    (0.0, "UTC"),
    (1.0, "Asia/Kolkata"),
    (2.0, "Australia/Lord_Howe"),
]
SECONDS = 8


def test_clock_skew_and_time_zones(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp, figures: Figures
) -> None:
    jobs = [
        every_second("utc", jitter="1s"),
        every_second("kolkata", jitter="1s", timezone="Asia/Kolkata"),
        every_second("even", jitter="1s", schedule="*/2 * * * * *", timezone="Pacific/Apia"),
    ]
    cfg = config([nats_server.url], http_app, jobs)
    procs = [
        # An instance id names a state bucket key: "skewm0_5" for -0.5 s.
        (
            "skew" + f"{offset:+g}".replace("+", "p").replace("-", "m").replace(".", "_"),
            cfg,
            {"ANARCHON_CLOCK_OFFSET": str(offset), "TZ": tz},
        )
        for offset, tz in INSTANCES
    ]
    with sidecars(tmp_path, procs) as running:
        start_ms = next_second_ms() + 3000  # past the slowest clock's first slot
        start_ms += start_ms % 2000  # even, for the */2 job
        end_ms = start_ms + (SECONDS - 1) * 1000
        wait_all_ran(http_app, ["utc", "kolkata"], start_ms, end_ms, timeout=SECONDS + 15)
        wait_all_ran(http_app, ["even"], start_ms, end_ms, timeout=10, step_ms=2000)
        claimed = {p.name: metric_total(p, "anarchon_claims_won_total") for p in running}
        claimed_any = {
            p.name: claimed[p.name] + metric_total(p, "anarchon_claims_lost_total") for p in running
        }
        codes = [p.terminate() for p in running]
    every = tally(http_app, ["utc", "kolkata"], start_ms, end_ms)
    even = tally(http_app, ["even"], start_ms, end_ms, step_ms=2000)
    # The even job's slots are exactly the even seconds, whichever TZ computed them.
    assert all(
        slot % 2000 == 0
        for slot in Counter(
            int(r.headers["X-Anarchon-Slot"]) for r in http_app.requests_for("/jobs/even")
        )
    )
    unclaimed = unclaimed_runs(read_stream(nats_server.url), http_app.requests)
    late = lateness(http_app, ["utc", "kolkata", "even"])
    doubles = {**every.doubles, **even.doubles}
    figures.report(
        "clock-skew",
        instances=len(INSTANCES),
        skew_s="-2..+2",
        slots=every.slots + even.slots,
        runs=every.runs + even.runs,
        doubles=len(doubles),
        misses=every.misses + even.misses,
        wins={name.removeprefix("skew"): int(n) for name, n in claimed.items()},
        earliest_start_s=round(min(late), 3),
        latest_start_s=round(max(late), 3),
    )
    assert codes == [0] * len(INSTANCES)
    assert not doubles, f"slots ran twice: {doubles}"
    assert not every.missing and not even.missing, (every.missing, even.missing)
    assert not unclaimed, unclaimed[:20]
    # Every instance took part in the race, the slowest clock included.
    assert all(n >= SECONDS for n in claimed_any.values()), claimed_any
    # An instance 2 s ahead starts runs up to 2 s early, never more (plus scheduling noise).
    assert min(late) > -2.5
