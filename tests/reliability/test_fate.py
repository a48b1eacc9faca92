"""A slot's fate is decided once for the fleet (docs/GUARANTEES.md, "One fate per slot").

Three sidecars, jobs every 2 s with ``jitter: 1s``, and an operator (the CLI's
own calls, in this process) firing pause, ``pause --until``, resume,
``resume --catchup``, skip and unskip at random moments around the slots'
instants, and a skip then a pause of the same slot: 200 rounds per scenario,
run on many jobs at once. What the app received and what the stream holds
must show, for every slot: at most one fate message (the claim or skip
record stored with ``<job>:<slot>``), never a run and a skip record both, the
app called at most once, a catch-up run only for a slot skipped because
paused (never for one `skip` chose, paused too or not), and what the
operator's acknowledged writes decided before the instant.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sidecar.admin import skipwrite
from sidecar.cli.shared import load
from sidecar.core.clock import parse_rfc3339
from sidecar.ops import skipops, streamops
from sidecar.when.backfillrange import backfill_slots
from sidecar.when.pauses import until_ms
from tests.reliability.conftest import Figures
from tests.reliability.helpers import config
from tests.support import (
    NatsServer,
    RecordingApp,
    StoredMsg,
    cli_config,
    read_stream,
    sidecars,
    wait_for,
)

JOBS = int(os.environ.get("FATE_JOBS", "20"))
ROUNDS = int(os.environ.get("FATE_ROUNDS", "200"))
EVERY_MS = 2000
# A slot's decision window (jitter + max_late) and a margin for the check.
JITTER, MAX_LATE = 1.0, 2.0


def fate_job(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "schedule": "*/2 * * * * *",
        "jitter": f"{JITTER:g}s",
        "max_late": f"{MAX_LATE:g}s",
    }


def next_slot(after: float) -> int:
    """The first slot of the jobs (every 2 s) at or after `after` (epoch s)."""
    ms = int(after * 1000)
    return (ms // EVERY_MS + 1) * EVERY_MS


async def sleep_until(at: float) -> None:
    await asyncio.sleep(max(0.0, at - time.time()))


@dataclass
class Expect:
    """What the operator's writes, acknowledged before a slot's instant, decided."""

    skipped: dict[tuple[str, int], str] = field(default_factory=dict)  # why
    ran: dict[tuple[str, int], str] = field(default_factory=dict)
    notes: dict[tuple[str, int], str] = field(default_factory=dict)
    # Paused at the instant, then resume --catchup: skipped, then caught up once.
    caught: dict[tuple[str, int], str] = field(default_factory=dict)
    rounds: int = 0


class Operator:
    """The CLI's calls, made at chosen moments (one NATS connection each, as the CLI)."""

    def __init__(self, cli_path: str) -> None:
        self.ld = load(cli_path)

    def job(self, name: str) -> Any:
        return self.ld.config.job(name)

    async def pause(self, job: str, until: float | None = None) -> Any:
        return await streamops.pause(
            self.ld.config, self.ld.secrets, job, "fate", "op", True, until
        )

    async def resume(self, job: str, catchup: bool) -> dict[str, Any] | None:
        spec = self.job(job)
        was = await streamops.resume(
            self.ld.config, self.ld.secrets, job, skipops.resume_bound(spec)
        )
        if catchup and was is not None:
            since = round(parse_rfc3339(str(was["at"])) * 1000)
            slots = backfill_slots(spec.schedule, since, round(time.time() * 1000))
            if slots:
                await skipops.backfill(
                    self.ld.config, self.ld.secrets, spec, slots, "op", False, False, "catchup"
                )
        return was

    async def skip(self, job: str) -> list[int]:
        added, _ = await skipwrite.skip(self.ld.config, self.ld.secrets, self.job(job), 1, "op", "")
        return added

    async def skip_next(self, job: str) -> tuple[int, float] | None:
        """skip: the slot it chose and when the skip was acknowledged (None: no slot)."""
        added = await self.skip(job)
        return (added[0], time.time()) if added else None

    async def unskip(self, job: str) -> None:
        await skipops.unskip(self.ld.config, self.ld.secrets, job)


async def catchup_round(op: Operator, job: str, expect: Expect, rng: random.Random) -> None:
    """pause; then resume --catchup at a random moment around a slot (issue 39, item 1)."""
    slot = next_slot(time.time() + 2.0)
    instant = slot / 1000
    await op.pause(job)
    paused_by = time.time()
    await sleep_until(instant + rng.uniform(-0.5, 1.0))
    sent = time.time()
    await op.resume(job, catchup=True)
    done = time.time()
    if paused_by < instant - 0.05 and sent > instant + 0.05:
        expect.caught[(job, slot)] = f"resumed {sent - instant:.3f}s after the slot"
    elif done < instant - 0.05:
        expect.ran[(job, slot)] = "resumed before the slot"
    await sleep_until(instant + 2.2)


async def skip_round(op: Operator, job: str, expect: Expect, rng: random.Random) -> None:
    """skip; then a second skip or an unskip around the skipped slot (item 2)."""
    if (skipped := await op.skip_next(job)) is None:
        return
    slot, acked = skipped
    instant = slot / 1000
    await sleep_until(instant + rng.uniform(-0.3, 0.6))
    second = "skip" if rng.random() < 0.5 else "unskip"
    sent = time.time()
    await (op.skip(job) if second == "skip" else op.unskip(job))
    done = time.time()
    expect.notes[(job, slot)] = f"then {second} at {sent - instant:+.3f}s"
    if acked < instant - 0.05:
        # A second skip never drops the slot; an unskip takes it out only when
        # stored before the slot's instant.
        if second == "skip" or sent > instant + 0.05:
            expect.skipped[(job, slot)] = f"skip acknowledged {instant - acked:.3f}s before"
        elif done < instant - 0.05:
            expect.ran[(job, slot)] = "unskip acknowledged before the slot"
    await sleep_until(slot / 1000 + 2.2)


async def pause_round(op: Operator, job: str, expect: Expect, rng: random.Random) -> None:
    """pause --until ending around a slot, or pause and a plain resume around it (item 3)."""
    slot = next_slot(time.time() + 1.5)
    if rng.random() < 0.6:
        until = slot / 1000 + rng.uniform(-0.5, 1.0)
        done = await op.pause(job, until)
        acked = time.time()
        end = until_ms(done.value)
        assert end is not None
        if acked < slot / 1000 - 0.05:
            if slot < end:
                expect.skipped[(job, slot)] = "paused until after the slot"
            else:
                expect.ran[(job, slot)] = "the pause ended at or before the slot"
        await sleep_until(slot / 1000 + 2.2)
        return
    await op.pause(job)
    paused_by = time.time()
    at = slot / 1000 + rng.uniform(-0.5, 1.0)
    await sleep_until(at)
    sent = time.time()
    await op.resume(job, catchup=False)
    acked = time.time()
    if acked < slot / 1000 - 0.05:
        expect.ran[(job, slot)] = "resumed before the slot"
    elif sent > slot / 1000 + 0.05 and paused_by < slot / 1000 - 0.05:
        expect.skipped[(job, slot)] = "resumed after the slot"
    await sleep_until(slot / 1000 + 2.2)


async def skip_pause_round(op: Operator, job: str, expect: Expect, rng: random.Random) -> None:
    """skip, then pause before the skipped slot, then resume --catchup after it: the
    skip decided the slot, which is never caught up (GUARANTEES.md, rule 5)."""
    if (skipped := await op.skip_next(job)) is None:
        return
    slot, acked = skipped
    instant = slot / 1000
    await sleep_until(instant - rng.uniform(0.1, 0.4))
    await op.pause(job)
    paused_by = time.time()
    await sleep_until(instant + rng.uniform(0.1, 1.0))
    await op.resume(job, catchup=True)
    if acked < instant - 0.05:
        expect.skipped[(job, slot)] = f"skip acknowledged {instant - acked:.3f}s before"
        expect.notes[(job, slot)] = f"paused {paused_by - instant:+.3f}s, resume --catchup"
    await sleep_until(instant + 2.2)


SCENARIOS = {
    "catchup": catchup_round,
    "skip": skip_round,
    "pause": pause_round,
    "skip-pause": skip_pause_round,
}


async def operate(op: Operator, scenario: str, rounds: int, seed: int) -> Expect:
    expect = Expect()
    play = SCENARIOS[scenario]
    per_job = -(-rounds // JOBS)

    async def one(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        await asyncio.sleep(rng.uniform(0, 2.0))  # the jobs' rounds out of step
        for _ in range(per_job):
            await play(op, f"f{i}", expect, rng)
            expect.rounds += 1

    await asyncio.gather(*(one(i) for i in range(JOBS)))
    return expect


def fate_messages(stored: list[StoredMsg]) -> dict[tuple[str, int], list[StoredMsg]]:
    """Per (job, slot): the claims that decide the slot (attempt 1, not manual, not a
    backfill), whatever their id: a run's claim or a skip record."""
    out: dict[tuple[str, int], list[StoredMsg]] = defaultdict(list)
    for m in stored:
        d = m.data
        if not m.subject.endswith(".claims") or not isinstance(d.get("slot"), int):
            continue
        if d.get("manual") is True or "backfill" in d or d.get("attempt", 1) != 1:
            continue
        out[(str(d["job"]), int(d["slot"]))].append(m)
    return out


def violations(app: RecordingApp, stored: list[StoredMsg], expect: Expect) -> list[str]:
    """Every breach of "one fate per slot, the app sees a slot at most once"."""
    calls: dict[tuple[str, int], list[str]] = defaultdict(list)
    for r in app.requests:
        key = (r.headers["X-Anarchon-Job"], int(r.headers["X-Anarchon-Slot"]))
        calls[key].append(r.headers.get("X-Anarchon-Trigger", "scheduled"))
    fates = fate_messages(stored)
    bad: list[str] = []
    for key, triggers in calls.items():
        if len(triggers) > 1:
            bad.append(f"twice {key}: the app saw it {len(triggers)} times ({triggers})")
    for key, msgs in fates.items():
        if len(msgs) > 1:
            ids = [m.headers.get("Nats-Msg-Id") for m in msgs]
            bad.append(f"fates {key}: {len(msgs)} fate messages {ids}")
        skip = next((m.data["skipped"] for m in msgs if "skipped" in m.data), None)
        runs = [t for t in calls.get(key, []) if t != "catchup"]
        if skip is not None and runs:
            bad.append(f"both {key}: a skip record ({skip}) and a run ({runs})")
        if "catchup" in calls.get(key, []) and (skip != "paused" or len(msgs) != 1):
            bad.append(f"catchup {key}: caught up though its fate is {[m.data for m in msgs]}")
    for key, why in expect.skipped.items():
        msgs = fates.get(key, [])
        if calls.get(key) or not any("skipped" in m.data for m in msgs):
            note = expect.notes.get(key, "")
            bad.append(f"unskipped {key}: not skipped ({why}, {note}): calls {calls.get(key)}")
    for key, why in expect.caught.items():
        skipped = [m.data.get("skipped") for m in fates.get(key, [])]
        if calls.get(key) != ["catchup"] or skipped != ["paused"]:
            bad.append(f"uncaught {key}: not caught up once ({why}): {calls.get(key)} {skipped}")
    for key, why in expect.ran.items():
        if [t for t in calls.get(key, []) if t == "scheduled"] != ["scheduled"]:
            bad.append(f"unrun {key}: not run once ({why}): calls {calls.get(key)}")
    return bad


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_operator_actions_around_the_instant_leave_one_fate_per_slot(
    tmp_path: Path,
    nats_server: NatsServer,
    http_app: RecordingApp,
    figures: Figures,
    scenario: str,
) -> None:
    jobs = [fate_job(f"f{i}") for i in range(JOBS)]
    cfg = config([nats_server.url], http_app, jobs)
    op = Operator(cli_config(tmp_path, cfg))
    seed = random.randrange(1 << 30)
    with sidecars(tmp_path, [(f"s{i}", cfg, {}) for i in range(3)]) as procs:
        expect = asyncio.run(operate(op, scenario, ROUNDS, seed))
        # Catch-up runs (one at a time per job) end; every result is in.
        wait_for(lambda: not backfills_left(nats_server.url), 90, what="catch-ups done")
        # Every slot the operator's writes decided has its fate stored by now, and
        # the slots that were still being decided when the rounds ended have theirs.
        decided = {*expect.skipped, *expect.ran, *expect.caught}
        last = max(slot for _, slot in decided) if decided else 0

        def settled() -> list[StoredMsg] | None:
            stored = read_stream(nats_server.url)
            fates = fate_messages(stored)
            done = all(key in fates for key in decided) and all(
                (f"f{i}", last) in fates for i in range(JOBS)
            )
            return stored if done else None

        stored = wait_for(settled, 60, interval=1.0, what="every decided slot's fate stored")
        logs = [p.log() for p in procs]
    assert not any("Traceback" in text for text in logs), "a sidecar logged a traceback"
    bad = violations(http_app, stored, expect)
    fates = fate_messages(stored)
    calls = Counter(r.headers.get("X-Anarchon-Trigger", "scheduled") for r in http_app.requests)
    figures.report(
        f"fate-{scenario}",
        seed=seed,
        rounds=expect.rounds,
        slots=len(fates),
        skip_records=sum(1 for ms in fates.values() if any("skipped" in m.data for m in ms)),
        runs=dict(calls),
        expected=len(expect.skipped) + len(expect.ran) + len(expect.caught),
        violations=len(bad),
        kinds=dict(Counter(v.split(" ", 1)[0] for v in bad)),
    )
    assert expect.rounds >= ROUNDS
    assert not bad, f"seed {seed}: {len(bad)} violation(s):\n" + "\n".join(bad[:30])


def backfills_left(url: str) -> list[str]:
    """The jobs whose ``backfill.<job>`` (catch-ups queued) is still there: each read
    directly (a key listing that fails must not read as "none left")."""

    async def read() -> list[str]:
        import nats
        from nats.js.errors import KeyNotFoundError

        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value("CRON_STATE")
            left = []
            for i in range(JOBS):
                try:
                    await kv.get(f"backfill.f{i}")
                except KeyNotFoundError:  # never made, done or deleted
                    continue
                left.append(f"f{i}")
            return left
        finally:
            await nc.close()

    return asyncio.run(read())
