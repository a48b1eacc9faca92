"""``jobs[].run_on: every``: each live instance runs each slot once, on its own app.

The config's refusals, then one real fleet: a nats-server, three sidecar
processes and three receivers (one app per sidecar): every slot once per
instance; a sidecar killed (-9) just after a slot and started again tries that
slot again (catch-up) and finds its own claim: not run twice; a sidecar
stopped for a few slots shows them ``missed`` for itself in ``history --json``
and ``status --json``; a ``run_on: one`` job beside it still runs once for the
fleet.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.config.load import parse_config
from sidecar.core.errors import ConfigError
from sidecar.store.missed import TRAIL, Seen, missed
from tests.receivers import Receiver, receiver
from tests.support import NatsServer, Sidecar, cli_config, job, run_cli, sidecars, wait_for

EVERY = "/jobs/every"
ONE = "/jobs/one"
PERIOD_MS = 2000
MAX_LATE_MS = 5000
MISSED = "anarchon_every_slots_missed_total"
AWAY = {"job": "every", "reason": "away"}
STOPPED = {"job": "every", "reason": "stopped"}


def every_job(**extra: Any) -> dict[str, Any]:
    keys = {"schedule": "*/2 * * * * *", "run_on": "every", "catchup": "all"}
    return job("every", **{**keys, "max_late": f"{MAX_LATE_MS}ms", **extra})


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ({"overlap": "skip"}, "jobs[0].overlap", "skip does not go with run_on: every"),
        ({"retry": {"max": 2}}, "jobs[0].retry.max", "2 does not go with run_on: every"),
        ({"max_runs": 3}, "jobs[0].max_runs", "a fleet-wide count does not go with run_on"),
        ({"claim": {"candidates": 1}}, "jobs[0].claim.candidates", "every instance claims"),
        ({"run_on": "all"}, "jobs[0].run_on", "one, every"),
    ],
)
def test_run_on_every_refuses_what_it_cannot_make_exact(
    extra: dict[str, Any], key: str, words: str
) -> None:
    raw = {"target": {"url": "http://127.0.0.1:9"}, "jobs": [every_job(**extra)]}
    with pytest.raises(ConfigError) as err:
        parse_config({"instance_id": "x", **raw}, {})
    assert err.value.key == key and words in str(err.value), str(err.value)


def test_run_on_every_with_on_lost_rerun_is_refused_on_the_command_line(tmp_path: Path) -> None:
    raw = {"target": {"url": "http://127.0.0.1:9"}}
    raw["jobs"] = [every_job(on_lost="rerun", retry={"max": 1})]
    done = run_cli("check", "-c", cli_config(tmp_path, raw))
    assert done.returncode == 2, done
    assert "jobs[0].retry.max: 1 does not go with run_on: every" in done.stderr
    assert "Traceback" not in done.stderr


def test_missed_is_the_slots_an_instance_was_away_for_and_a_trail_after_its_last() -> None:
    slots = [i * PERIOD_MS for i in range(1, 30)]
    seen = [Seen(s, "a") for s in slots]
    seen += [Seen(s, "b") for s in slots[2:] if s not in (slots[5], slots[6])]
    seen += [Seen(s, "c") for s in slots[:3]]  # away from slots[3] on, for good
    gaps = missed(seen, slots[-1] + MAX_LATE_MS + 1, MAX_LATE_MS)
    assert {g.slot for g in gaps if g.instance == "b"} == {slots[5], slots[6]}
    # c: the first TRAIL judged slots after its newest claim, then it counts as gone.
    assert {g.slot for g in gaps if g.instance == "c"} == set(slots[3 : 3 + TRAIL])
    assert not [g for g in gaps if g.instance == "a"]  # a came before b: b missed none before
    # A slot whose window is still open is not judged.
    assert missed([Seen(0, "a"), Seen(PERIOD_MS, "b")], PERIOD_MS + 1, MAX_LATE_MS) == []


def test_a_live_sidecar_judges_a_slot_missed_by_the_rule_of_history() -> None:
    from sidecar.run.everymissed import KEEP, Claims, claim_of

    claims = Claims()
    slots = [i * PERIOD_MS for i in range(1, 6)]
    for s in slots:
        claims.add(Seen(s, "a"))
        if s != slots[3]:
            claims.add(Seen(s, "b"))
    claims.add(Seen(slots[0], "c"))  # c: one claim, then away
    now = slots[-1] + MAX_LATE_MS + 1
    assert claims.missed_at(slots[3], now, MAX_LATE_MS) == ["b", "c"]
    assert claims.missed_at(slots[4], now, MAX_LATE_MS) == ["c"]
    assert claims.missed_at(slots[0], now, MAX_LATE_MS) == []  # nobody before it
    # A slot whose window is still open is not judged.
    assert claims.missed_at(slots[4], slots[4] + 1, MAX_LATE_MS) == []
    for i in range(KEEP + 5):  # bounded: the newest KEEP slots only
        claims.add(Seen(10**6 + i, "a"))
    assert len(claims.slots) == KEEP
    body = b'{"job":"every","slot":2000,"instance":"a","run_on":"every","token":"t"}'
    assert claim_of(body, "every") == Seen(2000, "a")
    assert claim_of(body.replace(b',"run_on":"every"', b""), "every") is None  # the fleet's
    assert claim_of(body, "other") is None and claim_of(b"[", "every") is None


def test_an_instance_seen_leaving_cleanly_is_stopped_for_the_slots_it_was_out_for() -> None:
    from types import SimpleNamespace

    from sidecar.run.everymissed import EXITS_KEPT, STOPPED_KEEP, EveryMissed
    from sidecar.store.state import DELETED, EXPIRED, Entry, Removal

    keys: dict[str, Entry] = {}
    clock = SimpleNamespace(now=100_000)
    ctx: Any = SimpleNamespace(
        config=SimpleNamespace(jobs=[]),
        fleet=SimpleNamespace(view=SimpleNamespace(keys=keys)),
        clock=SimpleNamespace(wall_ms=lambda: clock.now),
    )
    judge = EveryMissed(ctx)
    judge.removed(Removal("instance.c", Entry({}, 1), DELETED, None))  # SIGTERM: deleted
    judge.removed(Removal("instance.b", Entry({}, 2), EXPIRED, None))  # killed: expired
    judge.removed(Removal("paused.c", Entry({}, 3), DELETED, None))
    assert list(judge.stopped) == ["c"]
    assert judge.exited("c", 96_000, MAX_LATE_MS)  # out from 100 s on: in its window
    assert not judge.exited("c", 96_000, 3_000)  # its window closed before c left
    assert not judge.exited("b", 101_000, MAX_LATE_MS)  # b died: away
    clock.now = 110_000
    keys["instance.c"] = Entry({}, 4)
    judge.changed("instance.c")  # back at 110 s
    judge.changed("instance.c")  # a heartbeat: still back since 110 s
    # A slot it was out for stays stopped when judged after it came back (a restart
    # with the same id must not page for the slots of the restart) ...
    assert judge.exited("c", 108_000, MAX_LATE_MS) and judge.exited("c", 110_000, MAX_LATE_MS)
    # ... one after it came back is away: it was up and made no claim.
    assert not judge.exited("c", 110_001, MAX_LATE_MS)
    for i in range(EXITS_KEPT + 2):  # restarts: the newest EXITS_KEPT exits
        clock.now = 200_000 + i * 10_000
        judge.removed(Removal("instance.c", Entry({}, 5 + i), DELETED, None))
        clock.now += 1_000
        judge.changed("instance.c")
    assert len(judge.stopped["c"]) == EXITS_KEPT
    # Back seen by a full re-read (its key told as ""), not by its own put.
    clock.now = 300_000
    del keys["instance.c"]
    judge.removed(Removal("instance.c", Entry({}, 40), DELETED, None))
    clock.now = 310_000
    keys["instance.c"] = Entry({}, 41)
    judge.changed("")
    assert not judge.exited("c", 315_000, MAX_LATE_MS)
    keys["instance.c"] = Entry({}, 42)
    assert judge.exited("c", clock.now - 1_000, MAX_LATE_MS)
    assert not judge.exited("c", 205_000, MAX_LATE_MS)  # between two exits: up
    for i in range(STOPPED_KEEP + 3):  # bounded: each rollout adds its old ids
        judge.removed(Removal(f"instance.p{i}", Entry({}, 50 + i), DELETED, None))
    assert len(judge.stopped) == STOPPED_KEEP and "p0" not in judge.stopped
    # An exit told late (a full re-read after a reconnect) counts from when it was
    # stored, its marker's time; a marker stamped ahead of this clock, from now.
    clock.now = 400_000
    judge.removed(Removal("instance.late", Entry({}, 90), DELETED, 380.0))
    assert judge.exited("late", 378_000, 3_000)  # out from 380 s: in the window
    assert not judge.exited("late", 376_000, 3_000)  # the window closed before it left
    judge.removed(Removal("instance.ahead", Entry({}, 91), DELETED, 500.0))
    assert judge.stopped["ahead"][-1].at_ms == 400_000
    judge.removed(Removal("instance.odd", Entry({}, 92), DELETED, float("nan")))
    assert judge.stopped["odd"][-1].at_ms == 400_000


def test_a_claim_of_a_slot_far_ahead_is_not_taken() -> None:
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from sidecar.obs.metrics import Metrics
    from sidecar.run.everymissed import AHEAD_MS, Claims, EveryMissed

    now = 10**12
    ctx: Any = SimpleNamespace(
        config=SimpleNamespace(jobs=[]),
        clock=SimpleNamespace(wall_ms=lambda: now),
        metrics=Metrics(CollectorRegistry()),
    )
    judge = EveryMissed(ctx)
    judge.claims["every"] = Claims()
    body = '{"job":"every","slot":%d,"instance":"a","run_on":"every","token":"t"}'
    judge.on_claim("every", (body % (now + AHEAD_MS + 1)).encode())
    assert not judge.claims["every"].slots  # forged, or a clock far off
    judge.on_claim("every", (body % now).encode())
    assert judge.claims["every"].slots == {now: {"a"}}


@pytest.fixture
def apps() -> Iterator[list[Receiver]]:
    gens = [receiver() for _ in range(3)]
    try:
        yield [next(g) for g in gens]
    finally:
        for g in gens:
            next(g, None)


def slots_of(app: Receiver, path: str) -> list[int]:
    return [int(r.headers["X-Anarchon-Slot"]) for r in app.received(path)]


def slots_after(app: Receiver, after: int, count: int, what: str) -> set[int]:
    """The slots `app` ran after slot `after`, once it ran `count` of them."""
    wait_for(lambda: len([s for s in slots_of(app, EVERY) if s > after]) >= count, 20, what=what)
    return {s for s in slots_of(app, EVERY) if s > after}


def cli_json(tmp_path: Path, config: dict[str, Any], *args: str) -> list[Any]:
    done = run_cli(*args, "--json", "-c", cli_config(tmp_path, config))
    assert done.returncode == 0, done
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_three_sidecars_run_each_slot_once_each_and_show_what_one_missed(
    tmp_path: Path, nats_server: NatsServer, apps: list[Receiver]
) -> None:
    names = ["a", "b", "c"]
    jobs = [every_job(), job("one", schedule="* * * * * *", max_late="5s")]
    configs = [
        {"nats": {"servers": [nats_server.url]}, "target": {"url": app.url}, "jobs": jobs}
        for app in apps
    ]
    config = configs[0]
    with sidecars(tmp_path, [(n, c, {}) for n, c in zip(names, configs, strict=True)]) as procs:
        a, c = apps[0], apps[2]
        # Steady: every instance runs three slots that all three ran.
        wait_for(
            lambda: len(set.intersection(*(set(slots_of(x, EVERY)) for x in apps))) >= 3,
            40,
            what="three slots run on all three instances",
        )
        # The series an alert counts with increase() exists at 0 while none is missed.
        assert procs[0].metric(MISSED, AWAY) == 0
        # Restart c with kill -9 right after it ran a slot: its catch-up claims that slot
        # again under its own id, finds it stored, and does not run it a second time.
        ran = len(slots_of(c, EVERY))
        wait_for(lambda: len(slots_of(c, EVERY)) > ran, 10, what="c runs a slot")
        last = max(slots_of(c, EVERY))
        sidecar_c: Sidecar = procs[2]
        sidecar_c.kill()
        sidecar_c.start().wait_ready()
        wait_for(
            lambda: f"job every slot {last} already claimed by this instance" in sidecar_c.log(),
            10,
            what="c's catch-up finding its own claim of the slot it ran",
        )
        wait_for(lambda: max(slots_of(c, EVERY)) > last, 10, what="c runs on after its restart")
        # Stopped for a few slots: those show as missed for c, and only for c.
        sidecar_c.terminate()
        away = slots_after(a, max(slots_of(c, EVERY)), 3, "three slots while c is away")
        deadline = max(away) + MAX_LATE_MS + 500
        wait_for(lambda: time.time() * 1000 > deadline, 15, what="their windows over")
        status = cli_json(tmp_path, config, "status")[0]
        entry = next(j for j in status["jobs"] if j["name"] == "every")
        assert entry["run_on"] == "every"
        assert set(entry["instances"]) == set(names)
        said_missed = {(m["instance"], m["slot"]) for m in entry["missed"]}
        assert {iso(s) for s in away} <= {slot for who, slot in said_missed if who == "c"}
        history = cli_json(tmp_path, config, "history", "every", "--limit", "500")
        missed_c = {r["slot"] for r in history if r["status"] == "missed" and r["instance"] == "c"}
        assert away <= missed_c, (away, missed_c)
        # ... and in the metric: each live sidecar counts c's misses (docs/METRICS.md,
        # anarchon_every_slots_missed_total), as stopped: c exited cleanly (SIGTERM
        # deleted its presence), which the alert leaves alone (a rollout does that).
        for live in procs[:2]:
            wait_for(
                lambda live=live: (live.metric(MISSED, STOPPED) or 0) >= len(away),
                10,
                what=f"{live.name} counting c's missed slots",
            )
            assert live.metric(MISSED, AWAY) == 0
            assert f"job every: instance c missed slot {iso(min(away))}" in live.log()
            assert "instance a missed" not in live.log() and "instance b missed" not in live.log()
        sidecar_c.start().wait_ready()
        wait_for(lambda: max(slots_of(c, EVERY)) > max(away), 15, what="c back")
        # c, started after those windows closed, does not count them again.
        wait_for(lambda: sidecar_c.metric(MISSED, AWAY) == 0, 10, what="c's series")
        assert sidecar_c.metric(MISSED, STOPPED) is None
        # b killed (-9) for a few slots: away (its presence expires, nobody deleted
        # it), what AnarchonEveryInstanceMissedSlot pages for; a and c count them.
        b, sidecar_b = apps[1], procs[1]
        # The slot after its last may have been claimed before the kill: not counted.
        killed_after = max(slots_of(b, EVERY)) + PERIOD_MS
        sidecar_b.kill()
        dead = slots_after(a, killed_after, 3, "three slots while b is dead")
        for live in (procs[0], sidecar_c):
            wait_for(
                lambda live=live: all(said_away(live, "b", s) for s in dead),
                15,
                what=f"{live.name} saying b's missed slots away",
            )
            assert (live.metric(MISSED, AWAY) or 0) >= len(dead)
        sidecar_b.start().wait_ready()
        wait_for(lambda: max(slots_of(b, EVERY)) > max(dead), 15, what="b back")
        # c's restart with its own id (SIGTERM, then back) paged for nothing: the slots
        # it was out for are stopped, also those judged after it came back.
        assert "instance c missed" in procs[0].log()
        lines = procs[0].log().splitlines()
        assert not [x for x in lines if "instance c missed" in x and "it was away" in x], lines
    # Exactly once per instance per slot, and the history holds one run per
    # instance and slot that the instance's app got; missed only what it did not get.
    history = cli_json(tmp_path, config, "history", "every", "--limit", "1000")
    for name, app in zip(names, apps, strict=True):
        got = Counter(slots_of(app, EVERY))
        assert got and max(got.values()) == 1, (name, got)
        mine = [r for r in history if r["instance"] == name]
        ran = Counter(r["slot"] for r in mine if r["status"] != "missed")
        assert max(ran.values()) == 1, (name, ran)
        # Each slot its app got is its run there (running: killed before its result).
        by_slot = {r["slot"]: r["status"] for r in mine if r["status"] != "missed"}
        assert set(got) <= set(by_slot), (name, got, by_slot)
        assert {by_slot[s] for s in got} <= {"succeeded", "running"}, (name, by_slot)
        gaps = {r["slot"] for r in mine if r["status"] == "missed"}
        assert not gaps & set(got), (name, gaps)
        assert {r.headers["X-Anarchon-Instance"] for r in app.received(EVERY)} == {name}
    assert away <= {r["slot"] for r in history if r["status"] == "missed" and r["instance"] == "c"}
    # The run_on: one job beside it: once for the fleet, on any instance.
    one = Counter(s for app in apps for s in slots_of(app, ONE))
    assert len(one) >= 10 and max(one.values()) == 1, one


def said_away(p: Sidecar, instance: str, slot: int) -> bool:
    """`p` logged `instance`'s miss of `slot`, as away."""
    line = f"job every: instance {instance} missed slot {iso(slot)} (no claim of it within "
    return f"{line}max_late: it was away)" in p.log()


def iso(slot: int) -> str:
    from sidecar.core.clock import rfc3339

    return rfc3339(slot / 1000)


@pytest.mark.parametrize(
    "args", [("run-now", "every"), ("at", "every", "30m"), ("backfill", "every", "--from", "1h")]
)
def test_commands_that_run_a_slot_once_for_the_fleet_refuse_a_run_on_every_job(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    raw = {"nats": {"servers": ["nats://127.0.0.1:9"]}, "target": {"url": "http://127.0.0.1:9"}}
    raw["jobs"] = [every_job()]
    done = run_cli(*args, "-c", cli_config(tmp_path, raw))
    assert done.returncode == 2, done
    assert f"{args[0]} runs a slot of every once for the fleet" in done.stderr
    assert "run_on: every" in done.stderr and "Traceback" not in done.stderr


def test_status_text_has_a_line_per_instance_with_what_it_missed() -> None:
    from sidecar.cli.status_text import every_lines

    jobs = [
        {"name": "plain", "run_on": "one"},
        {
            "name": "every",
            "run_on": "every",
            "instances": {
                "a": {"slot": "2026-12-06T07:00:04.000Z", "status": "succeeded"},
                "c": {"slot": "2026-12-06T07:00:00.000Z", "status": "succeeded"},
            },
            "missed": [
                {"slot": "2026-12-06T07:00:04.000Z", "instance": "c"},
                {"slot": "2026-12-06T07:00:02.000Z", "instance": "c"},
            ],
        },
    ]
    assert every_lines(jobs) == [
        "every on a: last 2026-12-06T07:00:04.000Z succeeded",
        "every on c: last 2026-12-06T07:00:00.000Z succeeded, missed 2 "
        "(newest 2026-12-06T07:00:04.000Z)",
    ]


def test_check_says_a_job_runs_on_every_instance(tmp_path: Path) -> None:
    raw = {"target": {"url": "http://127.0.0.1:9"}, "jobs": [every_job()]}
    done = run_cli("check", "-c", cli_config(tmp_path, raw))
    assert done.returncode == 0, done
    assert "  run_on every: each slot runs once on every live instance" in done.stdout


def test_the_page_row_of_a_run_on_every_job_names_each_instance_and_what_it_missed() -> None:
    from sidecar.admin.page import job_row

    row = job_row(
        {
            "name": "every",
            "schedules": [],
            "timezone": "UTC",
            "run_on": "every",
            "instances": {
                "a": {"slot": "2026-12-06T07:00:04.000Z", "status": "succeeded"},
                "c": {"slot": "2026-12-06T07:00:00.000Z", "status": "succeeded"},
            },
            "missed": [{"slot": "2026-12-06T07:00:02.000Z", "instance": "c"}],
            "recent": [
                {"slot": "2026-12-06T07:00:04.000Z", "status": "succeeded", "instance": "a"}
            ],
        }
    )
    assert "every instance" in row
    assert "a: " in row and "c: " in row and "missed 1" in row
    assert 'title="succeeded 2026-12-06T07:00:04.000Z on a"' in row


def test_a_run_on_every_job_of_the_state_bucket_has_its_missed_slots_counted(
    tmp_path: Path, nats_server: NatsServer, apps: list[Receiver]
) -> None:
    """A job added with `job add` (no `every` job in the file): the sidecars follow its
    claims from the take-up on, and count a slot an instance missed; removed, it is
    followed no more."""
    keep = job("keep", schedule="0 0 1 1 *")
    configs = [
        {"nats": {"servers": [nats_server.url]}, "target": {"url": app.url}, "jobs": [keep]}
        for app in apps[:2]
    ]
    path = tmp_path / "every.json"
    path.write_text(json.dumps(every_job()))
    cfg = cli_config(tmp_path, configs[0])
    with sidecars(tmp_path, [("a", configs[0], {}), ("b", configs[1], {})]) as procs:
        added = run_cli("job", "add", str(path), "-c", cfg)
        assert added.returncode == 0, added.stderr
        a, b = apps[0], apps[1]
        wait_for(
            lambda: len(set(slots_of(a, EVERY)) & set(slots_of(b, EVERY))) >= 2,
            30,
            what="two slots run on both instances",
        )
        procs[1].terminate()
        away = slots_after(a, max(slots_of(b, EVERY)), 2, "two slots while b is away")
        wait_for(
            lambda: (procs[0].metric(MISSED, STOPPED) or 0) >= len(away),
            20,
            what="a counting b's missed slots of the bucket's job",
        )
        assert f"job every: instance b missed slot {iso(min(away))}" in procs[0].log()
        removed = run_cli("job", "remove", "every", "-c", cfg)
        assert removed.returncode == 0, removed.stderr
        wait_for(
            lambda: "job every (id" in procs[0].log() and "left the state bucket" in procs[0].log(),
            15,
            what="the job retired",
        )
        counted = procs[0].metric(MISSED, STOPPED)
        later = time.time() + MAX_LATE_MS / 1000 + 3  # slots' windows that would close
        wait_for(lambda: time.time() > later, 15, what="a few more slots' windows")
        assert procs[0].metric(MISSED, STOPPED) == counted


async def test_a_bucket_every_job_that_leaves_keeps_no_consumer(nats_server: NatsServer) -> None:
    """Following the claims of a job of the state bucket is a consumer of the stream;
    the job changed, then removed, leaves none behind (nor told twice to a part made
    by the job set's change itself)."""
    import asyncio
    from types import SimpleNamespace

    import nats

    from sidecar.config.jobset import JobSet
    from sidecar.core.tasks import TaskSet, cancel_all
    from sidecar.fleet.listeners import KeyListeners
    from sidecar.run.everymissed import EveryMissed
    from tests.support import until

    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="CRON", subjects=["cron.>"])
        never = asyncio.Event()

        async def sleep_until(_: float) -> bool:
            await never.wait()
            return True

        jobs = JobSet(())
        tasks = TaskSet("test")
        ctx: Any = SimpleNamespace(
            # A real KeyListeners: the judge registers with the families it uses.
            fleet=SimpleNamespace(removal_listeners=[], key_listeners=KeyListeners()),
            jobs=jobs,
            tasks=tasks,
            js=js,
            spec=SimpleNamespace(prefix="cron.", name="CRON"),
            stopping=asyncio.Event(),
            sleeper=SimpleNamespace(until=sleep_until),
        )
        judge = EveryMissed(ctx)
        judge.begin()
        (every,) = parse_config({"jobs": [every_job()]}, {}).jobs

        async def consumers() -> int:
            return int((await js.stream_info("CRON")).state.consumer_count)

        jobs.put([every])
        await until(lambda: "every" in judge._tasks, 5, "followed")
        count: list[int] = []

        async def settle(want: int) -> None:  # the count once it is `want`, or after 10 s
            for _ in range(200):
                got = await consumers()
                if got == want:
                    break
                await asyncio.sleep(0.05)
            count.append(got)

        await settle(1)
        before = judge._tasks["every"]
        jobs.put([every])  # changed: followed afresh
        await until(lambda: judge._tasks.get("every") not in (None, before), 5, "refollowed")
        await settle(1)
        jobs.remove(["every"])
        await settle(0)
        assert count == [1, 1, 0] and not judge._tasks and not judge.claims
        await cancel_all(list(tasks))
    finally:
        await nc.close()
