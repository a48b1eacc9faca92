"""Issue 48's red team, replayed N rounds a scenario against the merged fixes.

Run standalone (not collected by pytest: the name has no ``test_`` prefix)::

    PYTHONPATH=. .venv/bin/python tests/reliability/redteam48.py --rounds 20

Each scenario starts its own real nats-server, three real sidecar processes
and a real recording app (tests/support.py), forges state bucket keys as a
writer of the bucket would, round after round, and counts the rounds in which
the bad thing happened: a forged key triggered the app, a slot ran twice, a
live run was cancelled early, a job was blocked, a header went out. It prints
one table (scenario, variant, rounds, bad, refused) and exits 1 when any
scenario was bad in any round. ``--only buffer,at`` picks scenarios.

Scenarios (issue 48's findings and a sceptic's variants of them):

- buffer: finding 2 (a forged ``buffer.<job>``: off the schedule, of a paused
  job with ``max_runs`` spent, a chosen run id, fence 2^53-1, attempt 7, a
  replay, mismatched fields) and a copy of a REAL claim: one that lost to the
  held lock of an ``overlap: skip`` job (recorded skipped), and the claim of
  the run holding ``lock.<job>`` right now.
- at: finding 3 (a raw ``at.<job>`` on an instant of the schedule) and one
  millisecond either side of it.
- stop: finding 4a (a forged ``stop.<job>`` with the token of ``lock.<job>``)
  and variants naming an older, the same, another job's, an absent sequence.
- lock: finding 4b (a forged ``lock.<job>`` without a TTL, with ``never``,
  with one over the limit) and one with a TTL of exactly the limit.
- headers: finding 5 (a bucket job with Host, Forwarded, X-Forwarded-Host,
  Proxy-Authorization, X-HTTP-Method-Override), written as a ``job.*`` key
  and through ``job add``.
- unknown: keys of no family with huge values; the sidecars stay up.
- stoprace: a ``stop.<job>`` naming the REAL newer claim, written the moment it
  is stored (before the real replacer): the newer slot runs once.
- lease: a live run's ``run.*`` rewritten with a 1 s TTL (``on_lost: rerun``),
  and a live run's ``lock.*`` deleted (``overlap: skip``: the next slot then
  runs beside it, as docs/GUARANTEES.md's "while leases hold" allows).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sidecar.core.clock import rfc3339  # noqa: E402
from tests.store.test_hostile_state import base, live_keys, put, total, with_nats  # noqa: E402
from tests.support import (  # noqa: E402
    NatsServer,
    RecordingApp,
    Sidecar,
    cli_config,
    job,
    read_stream,
    results,
    run_cli,
    sidecars,
    wait_for,
)

MAX_FENCE = 2**53 - 1
EVIL = "e" * 32


@dataclass
class Tally:
    """Rounds and bad rounds of one variant of a scenario."""

    rounds: int = 0
    bad: int = 0
    refused: int = 0  # rounds in which a sidecar counted the key hostile
    notes: list[str] = field(default_factory=list)

    def add(self, bad: bool, refused: bool, note: str = "") -> None:
        self.rounds += 1
        self.bad += int(bad)
        self.refused += int(refused)
        if note and len(self.notes) < 3:
            self.notes.append(note)


TABLE: dict[tuple[str, str], Tally] = {}


def tally(scenario: str, variant: str) -> Tally:
    return TABLE.setdefault((scenario, variant), Tally())


# ------------------------------------------------------------------ helpers


def raw_put(url: str, key: str, data: bytes, headers: dict[str, str] | None = None) -> None:
    """Publish `data` at `key` with raw headers (a Nats-TTL of any text)."""

    async def work(nc: Any) -> None:
        await nc.jetstream().publish(
            f"$KV.CRON_STATE.{key}", data, stream="KV_CRON_STATE", headers=headers
        )

    with_nats(url, work)


def purge(url: str, key: str) -> None:
    async def work(nc: Any) -> None:
        kv = await nc.jetstream().key_value("CRON_STATE")
        with contextlib.suppress(Exception):
            await kv.purge(key)

    with_nats(url, work)


def get_key(url: str, key: str) -> Any:
    async def work(nc: Any) -> Any:
        kv = await nc.jetstream().key_value("CRON_STATE")
        try:
            entry = await kv.get(key)
        except Exception:  # no such key
            return None
        return json.loads(entry.value) if entry.value else None

    return with_nats(url, work)


def claims_of(url: str, name: str) -> dict[str, tuple[int, dict[str, Any]]]:
    """Run id -> (sequence, claim) of every stored claim of job `name`."""
    return {
        m.data["token"]: (m.seq, m.data)
        for m in read_stream(url)
        if m.subject == f"cron.{name}.claims" and isinstance(m.data.get("token"), str)
    }


def hostile(procs: list[Sidecar], what: str) -> float:
    return total(procs, "anarchon_hostile_input_total", {"what": what})


def forge_and_wait(
    url: str, procs: list[Sidecar], what: str, key: str, write: Callable[[], None], wait: float
) -> bool:
    """Write a forged key; whether a sidecar counted it hostile within `wait` s. The key
    is purged afterwards whatever happened (the next round starts clean)."""
    before = hostile(procs, what)
    write()
    try:
        wait_for(lambda: hostile(procs, what) > before, wait, what=f"{key} refused")
        refused = True
    except AssertionError:
        refused = False
    return refused


@contextlib.contextmanager
def fleet(
    tmp: Path, name: str, jobs: list[dict[str, Any]], app: RecordingApp
) -> Iterator[tuple[NatsServer, list[Sidecar], str]]:
    """A nats-server and three sidecars running `jobs` against `app`."""
    work = tmp / name
    work.mkdir()
    server = NatsServer(work / "nats")
    server.start()
    try:
        config = base(server.url, app, jobs)
        cfg = cli_config(work, config)
        with sidecars(work, [(f"s{i}", config, {}) for i in range(3)]) as procs:
            yield server, procs, cfg
    finally:
        server.stop()


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# ------------------------------------------------------------------ finding 2: buffer.*


def scenario_buffer(tmp: Path, rounds: int) -> None:
    app = RecordingApp()
    app.start()
    app.delay["/jobs/sk"] = 2.5  # slots of sk lose to its held lock, recorded skipped
    app.delay["/jobs/bslow"] = 1.5  # a run of bslow holds its lock across slots
    jobs = [
        job("buf", overlap="buffer_one"),
        job("bslow", overlap="buffer_one", max_late="5s"),
        job("sk", overlap="skip", max_late="5s"),
        job("yearly", schedule="0 0 1 1 *", overlap="buffer_one", max_runs=1),
    ]
    try:
        with fleet(tmp, "buffer", jobs, app) as (server, procs, cfg):
            url = server.url
            paused = run_cli("pause", "yearly", "--reason", "migration", "-c", cfg)
            assert paused.returncode == 0, paused.stderr
            put(url, "count.yearly", {"runs": 1, "slots": [], "max_runs": 1, "by": "s0", "at": "x"})
            wait_for(lambda: len(results(url, "buf")) >= 3, 30, what="runs of buf")
            wait_for(
                lambda: any(m.data.get("status") == "skipped" for m in results(url, "sk")),
                30,
                what="a skipped slot of sk",
            )
            for r in range(rounds):
                buffer_round(url, procs, app, r)
                say(f"buffer round {r + 1}/{rounds}")
            # Settle: kept runs started before the last forge end.
            time.sleep(3)
            final_buffer_checks(url, app)
    finally:
        app.stop()


def _kept(name: str, slot: int, token: str, seq: int, **fields: Any) -> dict[str, Any]:
    return {
        "job": name,
        "slot": slot,
        "attempt": 1,
        "token": token,
        "trigger": "scheduled",
        "manual": False,
        "fence": seq,
        "instance": "s0",
        "kept_at": rfc3339(time.time()),
        "behind": "f" * 32,
        **fields,
    }


def buffer_round(url: str, procs: list[Sidecar], app: RecordingApp, r: int) -> None:
    now_ms = int(time.time() * 1000)
    # Results first: a claim is stored before its result, so every result read here has
    # its claim in the claims read after.
    done = [m.data for m in results(url, "buf") if m.data.get("status") == "succeeded"][-1]
    buf = claims_of(url, "buf")
    done_seq = buf[done["token"]][0]
    other_seq = max(s for s, _ in claims_of(url, "sk").values())
    k = _kept
    variants: list[tuple[str, str, dict[str, Any]]] = [
        (
            "yearly: paused, max_runs spent, off schedule, fence 2^53-1, attempt 7",
            "buffer.yearly",
            k("yearly", now_ms - 1234, EVIL, MAX_FENCE, attempt=7),
        ),
        (
            "buf: replay of a claim that ran",
            "buffer.buf",
            k("buf", done["slot"], done["token"], done_seq),
        ),
        ("buf: real claim, chosen run id", "buffer.buf", k("buf", done["slot"], EVIL, done_seq)),
        (
            "buf: real claim, other slot",
            "buffer.buf",
            k("buf", done["slot"] + 500, done["token"], done_seq),
        ),
        (
            "buf: fence of another job's claim",
            "buffer.buf",
            k("buf", done["slot"], done["token"], other_seq),
        ),
        (
            "buf: fence 2^53-1, attempt 7",
            "buffer.buf",
            k("buf", now_ms, EVIL, MAX_FENCE, attempt=7),
        ),
    ]
    # Sceptic: a copy of a REAL claim of sk (overlap: skip) that lost to the held lock
    # and was recorded skipped: does a buffer.sk make it run after all?
    skipped = [m.data for m in results(url, "sk") if m.data.get("status") == "skipped"]
    sk = claims_of(url, "sk")
    lost = next((d for d in reversed(skipped) if d["token"] in sk), None)
    if lost is not None:
        seq, claim = sk[lost["token"]]
        variants.append(
            (
                "sk (overlap: skip): copy of a real claim recorded skipped",
                "buffer.sk",
                k("sk", claim["slot"], claim["token"], seq),
            )
        )
    # Sceptic: a REAL claim of bslow (buffer_one) that lost while a slot was kept
    # already, recorded skipped: does a buffer.bslow naming it run it after all?
    lost_b = [m.data for m in results(url, "bslow") if m.data.get("status") == "skipped"]
    bs = claims_of(url, "bslow")
    one = next((d for d in reversed(lost_b) if d["token"] in bs), None)
    if one is not None:
        seq, claim = bs[one["token"]]
        variants.append(
            (
                "bslow (buffer_one): copy of a real claim recorded skipped",
                "buffer.bslow",
                k("bslow", claim["slot"], claim["token"], seq),
            )
        )
    # Sceptic: the claim of the run holding lock.bslow right now (it would run twice).
    lock = get_key(url, "lock.bslow")
    if lock and isinstance(lock.get("fence"), int):
        variants.append(
            (
                "bslow: copy of the claim holding the lock now",
                "buffer.bslow",
                k("bslow", lock["slot"], lock["token"], lock["fence"]),
            )
        )
    for variant, key, value in variants:
        before = len(app.requests)
        refused = forge_and_wait(
            url, procs, "buffer_key", key, lambda k=key, v=value: put(url, k, v), 8
        )
        time.sleep(0.3)
        bad_reqs = [
            q
            for q in app.requests[before:]
            if q.headers.get("X-Anarchon-Run-Id") == value["token"]
            and q.headers.get("X-Anarchon-Cancel") is None
            and (
                value["token"] == EVIL
                or q.path == "/jobs/yearly"
                or variant.startswith(("buf: replay", "sk ", "bslow"))
            )
        ]
        # A copied REAL claim is bad only if its run id reaches the app twice (or, for
        # sk's skipped slot, at all).
        if variant.startswith("bslow: copy of the claim holding"):
            n = len(
                [
                    q
                    for q in app.requests
                    if q.headers.get("X-Anarchon-Run-Id") == value["token"]
                    and q.headers.get("X-Anarchon-Cancel") is None
                ]
            )
            bad = n > 1
        else:
            bad = bool(bad_reqs)
        if key not in live_keys(url):
            pass
        elif not refused:
            purge(url, key)
        tally("buffer", variant).add(
            bad, refused, f"round {r}: {len(bad_reqs)} requests" if bad else ""
        )


def final_buffer_checks(url: str, app: RecordingApp) -> None:
    """Over all rounds: no run id reached the app twice, every fence is its claim's."""
    for name in ("buf", "bslow", "sk"):
        reqs = [
            q
            for q in app.requests_for(f"/jobs/{name}")
            if q.headers.get("X-Anarchon-Cancel") is None
        ]
        stored = {t: s for t, (s, _) in claims_of(url, name).items()}
        twice = [
            t for t, n in Counter(q.headers["X-Anarchon-Run-Id"] for q in reqs).items() if n > 1
        ]
        wrong = [
            q
            for q in reqs
            if stored.get(q.headers["X-Anarchon-Run-Id"]) != int(q.headers["X-Anarchon-Fence"])
        ]
        slots = Counter(q.headers["X-Anarchon-Slot"] for q in reqs)
        tally(
            "buffer", f"{name}: whole run, run id twice / fence not its claim's / slot twice"
        ).add(
            bool(twice or wrong or any(n > 1 for n in slots.values())),
            False,
            f"twice={twice[:2]} wrong={len(wrong)} "
            f"slots_twice={[s for s, n in slots.items() if n > 1][:2]}",
        )
    tally("buffer", "yearly: any request at all").add(bool(app.requests_for("/jobs/yearly")), False)


# ------------------------------------------------------------------ finding 3: at.*


def scenario_at(tmp: Path, rounds: int) -> None:
    app = RecordingApp()
    app.start()
    every2 = {"schedule": "*/2 * * * * *"}
    jobs = [job("atx", **every2), job("atm", **every2), job("atp", **every2)]
    try:
        with fleet(tmp, "at", jobs, app) as (server, procs, cfg):
            url = server.url
            wait_for(lambda: app.requests_for("/jobs/atx"), 20, what="a run of atx")
            # Does the CLI take an instant 1 ms off the schedule?
            probe_ms = (int(time.time()) // 2 * 2 + 60) * 1000 + 1
            probe = run_cli("at", "atm", rfc3339(probe_ms / 1000), "-c", cfg)
            say(
                f"CLI `at atm <instant + 1 ms>`: exit {probe.returncode} "
                f"{probe.stderr.strip()[:160]}"
            )
            tally("at", "CLI at on schedule instant + 1 ms (exit 0 = accepted)").add(
                probe.returncode == 0, False, (probe.stdout + probe.stderr).strip()[:120]
            )
            purge(url, "at.atm")
            for r in range(rounds):
                at_round(url, procs, app, r)
                say(f"at round {r + 1}/{rounds}")
    finally:
        app.stop()


def at_round(url: str, procs: list[Sidecar], app: RecordingApp, r: int) -> None:
    t = (int(time.time()) // 2 * 2 + 4) * 1000  # an instant of */2, 2 to 4 s ahead
    entry = {"by": "x", "queued_at": rfc3339(time.time())}
    before = hostile(procs, "at_key")
    put(url, "at.atx", {"runs": [{**entry, "slot": t}]})
    put(url, "at.atm", {"runs": [{**entry, "slot": t - 1}]})
    put(url, "at.atp", {"runs": [{**entry, "slot": t + 1}]})
    wait_for(lambda: time.time() * 1000 > t + 3500, 10)
    refused = hostile(procs, "at_key") > before
    for name, off in (("atx", 0), ("atm", -1), ("atp", 1)):
        reqs = app.requests_for(f"/jobs/{name}")
        at_slot = [q for q in reqs if int(q.headers["X-Anarchon-Slot"]) == t + off]
        sched = [q for q in reqs if int(q.headers["X-Anarchon-Slot"]) == t]
        if off == 0:
            bad = len(at_slot) > 1
            tally("at", "raw at.* on a schedule instant: slot run twice").add(
                bad, refused, f"round {r}: {len(at_slot)} runs of slot {t}" if bad else ""
            )
        else:
            ran = bool(at_slot) and bool(sched)
            gap = abs(at_slot[0].at - sched[0].at) if ran else 0
            tally("at", f"raw at.* {off:+d} ms off a schedule instant: ran beside the slot").add(
                ran, False, f"round {r}: two runs {gap * 1000:.0f} ms apart" if ran else ""
            )
        purge(url, f"at.{name}")


# ------------------------------------------------------------------ finding 4a: stop.*


def scenario_stop(tmp: Path, rounds: int) -> None:
    app = RecordingApp()
    app.start()
    path = "/jobs/rep"
    app.delay[path] = 60.0  # only a cancel request ends a run
    rep = job(
        "rep", schedule="*/10 * * * * *", max_late="8s", overlap="replace", cancel={"grace": "1s"}
    )
    jobs = [rep, job("plain")]
    try:
        with fleet(tmp, "stop", jobs, app) as (server, procs, _):
            url = server.url
            seen: set[str] = set()
            for r in range(rounds):
                stop_round(url, procs, app, r, seen)
                say(f"stop round {r + 1}/{rounds}")
            final_stop_checks(url, app)
    finally:
        app.stop()


def stop_round(url: str, procs: list[Sidecar], app: RecordingApp, r: int, seen: set[str]) -> None:
    path = "/jobs/rep"
    running = wait_for(
        lambda: next(
            (
                q
                for q in reversed(app.requests_for(path))
                if q.headers.get("X-Anarchon-Cancel") is None
                and q.headers["X-Anarchon-Run-Id"] not in seen
                and not q.finished
            ),
            None,
        ),
        30,
        what="a new live run of rep",
    )
    token = running.headers["X-Anarchon-Run-Id"]
    seen.add(token)
    slot = int(running.headers["X-Anarchon-Slot"])
    run_fence = int(running.headers["X-Anarchon-Fence"])
    lock = wait_for(lambda: get_key(url, "lock.rep"), 5, what="lock.rep")
    plain = max(s for s, _ in claims_of(url, "plain").values())

    def stop(**fields: Any) -> dict[str, Any]:
        at = rfc3339(time.time())
        return {
            "job": "rep",
            "token": lock["token"],
            "slot": 1,
            "instance": "s9",
            "at": at,
            **fields,
        }

    variants = [
        ("slot 1, token from lock.rep, no fence (the red team's)", stop()),
        ("fence of the running run itself", stop(fence=run_fence, slot=slot)),
        ("fence 2^53-1", stop(fence=MAX_FENCE, slot=slot + 10000)),
        ("fence of another job's newer claim", stop(fence=plain, slot=slot + 10000)),
        ("fence 1, an older slot", stop(fence=1, slot=slot - 10000)),
    ]
    next_slot_s = slot / 1000 + 10
    for variant, value in variants:
        refused = forge_and_wait(
            url, procs, "stop_key", "stop.rep", lambda v=value: put(url, "stop.rep", v), 6
        )
        time.sleep(0.2)
        early = [
            q
            for q in app.requests_for(path)
            if q.headers.get("X-Anarchon-Cancel") == token and q.at < next_slot_s
        ]
        bad = bool(early) or (running.finished and running.finished < next_slot_s)
        tally("stop", variant).add(bool(bad), refused, f"round {r}: cancelled early" if bad else "")
        if not refused:
            purge(url, "stop.rep")
        if time.time() > next_slot_s - 0.5:
            break  # the real replacer is due: the next variants next round


def final_stop_checks(url: str, app: RecordingApp) -> None:
    """Every replaced run's record names the slot after it; no slot ran twice."""
    recs = [m.data for m in results(url, "rep") if m.data.get("status") == "failed"]
    wrong = [
        d
        for d in recs
        if not str(d.get("error", "")).startswith(
            f"replaced: stopped for slot {rfc3339(d['slot'] / 1000 + 10)}"
        )
    ]
    reqs = [q for q in app.requests_for("/jobs/rep") if q.headers.get("X-Anarchon-Cancel") is None]
    twice = [s for s, n in Counter(q.headers["X-Anarchon-Slot"] for q in reqs).items() if n > 1]
    tally("stop", "whole run: a replaced record not naming the next slot, or a slot twice").add(
        bool(wrong or twice),
        False,
        f"wrong={[d.get('error') for d in wrong][:2]} twice={twice[:2]}",
    )


def scenario_stoprace(tmp: Path, rounds: int) -> None:
    """A sceptic's stop.*: at each new slot, the forger reads the newer REAL claim from
    the stream the moment it is stored and writes the stop request before the real
    replacer can: the next slot must still run once, the run be replaced once."""
    app = RecordingApp()
    app.start()
    app.delay["/jobs/rep"] = 60.0
    rep = job(
        "rep", schedule="*/10 * * * * *", max_late="8s", overlap="replace", cancel={"grace": "1s"}
    )
    try:
        with fleet(tmp, "stoprace", [rep], app) as (server, procs, _):
            url = server.url
            seen: set[str] = set()
            for r in range(rounds):
                stoprace_round(url, procs, app, r, seen)
                say(f"stoprace round {r + 1}/{rounds}")
    finally:
        app.stop()


async def _race(url: str, token: str, fence: int, deadline: float) -> tuple[int, int, float]:
    """Poll the claims of rep; at the first one after `fence`, write its stop request.
    (slot, seq, seconds from the claim's store time to the forged write)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        while time.time() < deadline:
            try:
                msg = await js.get_last_msg("CRON", "cron.rep.claims")
            except Exception:  # none yet
                msg = None
            if msg is not None and int(msg.seq or 0) > fence:
                data = json.loads(msg.data or b"{}")
                value = {
                    "job": "rep",
                    "token": token,
                    "slot": data["slot"],
                    "fence": int(msg.seq or 0),
                    "instance": "s9",
                    "at": rfc3339(time.time()),
                }
                await js.publish(
                    "$KV.CRON_STATE.stop.rep", json.dumps(value).encode(), stream="KV_CRON_STATE"
                )
                stored = msg.time.timestamp() if msg.time is not None else time.time()
                return int(data["slot"]), int(msg.seq or 0), time.time() - stored
            await asyncio.sleep(0.005)
        raise AssertionError("no newer claim of rep")
    finally:
        await nc.close()


def stoprace_round(
    url: str, procs: list[Sidecar], app: RecordingApp, r: int, seen: set[str]
) -> None:
    path = "/jobs/rep"
    running = wait_for(
        lambda: next(
            (
                q
                for q in reversed(app.requests_for(path))
                if q.headers.get("X-Anarchon-Cancel") is None
                and q.headers["X-Anarchon-Run-Id"] not in seen
                and not q.finished
            ),
            None,
        ),
        30,
        what="a new live run of rep",
    )
    token = running.headers["X-Anarchon-Run-Id"]
    seen.add(token)
    before = hostile(procs, "stop_key")
    slot, _seq, lag = asyncio.run(
        _race(url, token, int(running.headers["X-Anarchon-Fence"]), time.time() + 15)
    )
    newer = wait_for(
        lambda: [
            q
            for q in app.requests_for(path)
            if q.headers.get("X-Anarchon-Cancel") is None
            and int(q.headers["X-Anarchon-Slot"]) == slot
        ],
        15,
        what="the newer slot's run",
    )
    record = wait_for(
        lambda: next((m.data for m in results(url, "rep") if m.data["token"] == token), None),
        15,
        what="the replaced run's record",
    )
    time.sleep(1)
    runs_of_newer = [
        q
        for q in app.requests_for(path)
        if q.headers.get("X-Anarchon-Cancel") is None and int(q.headers["X-Anarchon-Slot"]) == slot
    ]
    cancels = [q for q in app.requests_for(path) if q.headers.get("X-Anarchon-Cancel") == token]
    want = f"replaced: stopped for slot {rfc3339(slot / 1000)}"
    bad = (
        len(runs_of_newer) != 1
        or not str(record.get("error", "")).startswith(want)
        or newer[0].headers["X-Anarchon-Run-Id"] == token
    )
    refused = hostile(procs, "stop_key") > before
    tally("stoprace", "stop.* naming the REAL newer claim, written first").add(
        bad,
        refused,
        f"round {r}: lag {lag * 1000:.0f} ms, newer ran {len(runs_of_newer)}x, "
        f"{len(cancels)} cancel(s), record {str(record.get('error'))[:60]!r}",
    )


# ------------------------------------------------------------------ finding 4b: lock.*


LOCK_VARIANTS = [
    ("lk0", "no TTL (the red team's)", None),
    ("lk1", "Nats-TTL never", "never"),
    ("lk2", "TTL 3601s, one over the limit", "3601s"),
    ("lk3", "TTL 3600s, exactly the limit (lease_ttl 2s: max(3600, 10x2))", "3600s"),
    ("lk4", "TTL 1h0m0.5s (Go duration, over the limit)", "1h0m0.5s"),
]


def scenario_lock(tmp: Path, rounds: int) -> None:
    app = RecordingApp()
    app.start()
    jobs = [job(name, overlap="skip") for name, _, _ in LOCK_VARIANTS]
    try:
        with fleet(tmp, "lock", jobs, app) as (server, procs, _):
            url = server.url
            for name, _, _ in LOCK_VARIANTS:
                wait_for(lambda n=name: app.requests_for(f"/jobs/{n}"), 20, what=f"a run of {name}")
            for r in range(rounds):
                lock_round(url, procs, app, r)
                say(f"lock round {r + 1}/{rounds}")
    finally:
        app.stop()


def lock_round(url: str, procs: list[Sidecar], app: RecordingApp, r: int) -> None:
    before = hostile(procs, "lock_key")
    forged_at = time.time()
    for name, _, ttl in LOCK_VARIANTS:
        value = {
            "job": name,
            "slot": int(time.time() * 1000) - 1500,
            "attempt": 7,
            "token": EVIL,
            "instance": "evil",
            "fence": MAX_FENCE,
            "started_at": rfc3339(time.time()),
        }
        raw_put(url, f"lock.{name}", json.dumps(value).encode(), {"Nats-TTL": ttl} if ttl else None)
    # Blocked: no run of the job in the 5 s after the forged lock (a run every second).
    time.sleep(5)
    refused = hostile(procs, "lock_key") > before
    for name, variant, _ in LOCK_VARIANTS:
        ran = [q for q in app.requests_for(f"/jobs/{name}") if q.at > forged_at + 1.5]
        bad = not ran
        tally("lock", variant).add(bad, refused, f"round {r}: 0 runs in 3.5 s" if bad else "")
        purge(url, f"lock.{name}")
    time.sleep(1.5)


def scenario_lease(tmp: Path, rounds: int) -> None:
    """A sceptic's live lease: a bucket writer rewrites the lease of a LIVE run with a
    1 s TTL (run.<job>.*, on_lost: rerun) or deletes lock.<job> (overlap: skip) while
    the run is in flight. Bad: the slot runs a second time while the first is still
    in flight, or two runs of the skip job overlap."""
    app = RecordingApp()
    app.start()
    app.delay["/jobs/lr"] = 6.0
    app.delay["/jobs/ls"] = 6.0
    jobs = [
        job(
            "lr",
            schedule="*/10 * * * * *",
            max_late="5s",
            on_lost="rerun",
            retry={"max": 1, "backoff": "1s"},
        ),
        job("ls", schedule="* * * * * *", overlap="skip", max_late="5s"),
    ]
    try:
        with fleet(tmp, "lease", jobs, app) as (server, procs, _):
            url = server.url
            seen: set[str] = set()
            for r in range(rounds):
                lease_round(url, procs, app, r, seen)
                say(f"lease round {r + 1}/{rounds}")
    finally:
        app.stop()


def _live(app: RecordingApp, path: str, seen: set[str]) -> Any:
    return next(
        (
            q
            for q in reversed(app.requests_for(path))
            if q.headers.get("X-Anarchon-Run-Id") not in seen and not q.finished
        ),
        None,
    )


def lease_round(url: str, procs: list[Sidecar], app: RecordingApp, r: int, seen: set[str]) -> None:
    run = wait_for(lambda: _live(app, "/jobs/lr", seen), 30, what="a live run of lr")
    seen.add(run.headers["X-Anarchon-Run-Id"])
    slot = int(run.headers["X-Anarchon-Slot"])
    key = next((k for k in live_keys(url) if k.startswith(f"run.lr.{slot}")), None)
    value = get_key(url, key) if key else None
    if key and value:
        put(url, key, value, ttl=1)
    held = wait_for(lambda: _live(app, "/jobs/ls", seen), 10, what="a live run of ls")
    seen.add(held.headers["X-Anarchon-Run-Id"])
    purge(url, "lock.ls")
    wait_for(lambda: run.finished and held.finished, 15, what="both runs' end")
    twice = [
        q
        for q in app.requests_for("/jobs/lr")
        if int(q.headers["X-Anarchon-Slot"]) == slot
        and q.headers["X-Anarchon-Run-Id"] != run.headers["X-Anarchon-Run-Id"]
        and q.at < run.finished
    ]
    tally("lease", "run.* of a live run rewritten with a 1 s TTL: slot rerun while in flight").add(
        bool(twice),
        False,
        f"round {r}: key {key}, {len(twice)} more run(s) of slot"
        + f" (live keys: {[k for k in live_keys(url) if k.startswith('run.')][:3]})",
    )
    overlap = [
        q for q in app.requests_for("/jobs/ls") if held.at < q.at < held.finished and q is not held
    ]
    tally("lease", "lock.* of a live run deleted: a second run overlaps it").add(
        bool(overlap), False, f"round {r}: {len(overlap)} overlapping run(s)" if overlap else ""
    )
    time.sleep(1)


# ------------------------------------------------------------------ finding 5: headers


HEADERS = {
    "Host": "internal-admin.svc.cluster.local:9999",
    "Forwarded": "for=1.2.3.4;host=internal-admin",
    "X-Forwarded-Host": "internal-admin",
    "Proxy-Authorization": "Basic ZXZpbDpldmls",
    "X-HTTP-Method-Override": "DELETE",
}


def scenario_headers(tmp: Path, rounds: int) -> None:
    app = RecordingApp()
    app.start()
    try:
        with fleet(tmp, "headers", [job("plain")], app) as (server, procs, cfg):
            url = server.url
            for r in range(rounds):
                headers_round(url, procs, app, cfg, tmp, r)
                say(f"headers round {r + 1}/{rounds}")
    finally:
        app.stop()


def _went_out(app: RecordingApp, path: str, header: str, value: str) -> bool:
    return any(q.headers.get(header) == value for q in app.requests_for(path))


def headers_round(
    url: str, procs: list[Sidecar], app: RecordingApp, cfg: str, tmp: Path, r: int
) -> None:
    names: list[tuple[str, str, str, bool]] = []  # (job, header, how, refused)
    for i, (header, value) in enumerate(HEADERS.items()):
        name = f"hk{r}x{i}"
        spec = {
            "name": name,
            "schedule": "* * * * * *",
            "max_late": "3s",
            "request": {"path": f"/jobs/{name}", "headers": {header: value}},
        }
        before = hostile(procs, "job")
        put(url, f"job.{name}", {**spec, "by": "x", "at": rfc3339(time.time())})
        refused = forge_and_wait(url, procs, "job", f"job.{name}", lambda: None, 3)
        names.append((name, header, "job.* key by hand", refused or hostile(procs, "job") > before))
        name2 = f"ha{r}x{i}"
        spec2 = {**spec, "name": name2, "request": {**spec["request"], "path": f"/jobs/{name2}"}}
        f = tmp / f"{name2}.json"
        f.write_text(json.dumps(spec2))
        added = run_cli("job", "add", str(f), "-c", cfg)
        names.append((name2, header, "job add", added.returncode == 2))
    deadline = time.time() + 6
    while time.time() < deadline:
        if all(_went_out(app, f"/jobs/{n}", h, HEADERS[h]) for n, h, _, _ in names):
            break
        time.sleep(0.2)
    for name, header, how, refused in names:
        bad = _went_out(app, f"/jobs/{name}", header, HEADERS[header])
        tally("headers", f"{header} via {how}: went out").add(bad, refused)
        purge(url, f"job.{name}")


# ------------------------------------------------------------------ unknown families


def scenario_unknown(tmp: Path, rounds: int) -> None:
    app = RecordingApp()
    app.start()
    try:
        with fleet(tmp, "unknown", [job("plain")], app) as (server, procs, _):
            url = server.url
            for r in range(rounds):
                before = hostile(procs, "unknown_key")
                for i in range(5):
                    raw_put(url, f"zz{r}x{i}.k", b"{" + b'"a":"' + b"x" * 900_000 + b'"}')
                raw_put(url, f"evil{r}", b"[" * 100_000)
                start = time.time()
                time.sleep(2)
                alive = all(p.proc and p.proc.poll() is None and p.ready() for p in procs)
                ran = [q for q in app.requests_for("/jobs/plain") if q.at > start]
                counted = hostile(procs, "unknown_key") > before
                tally(
                    "unknown", "keys of no family, ~900 kB values: a sidecar down or plain stopped"
                ).add(not alive or not ran, counted)
                for i in range(5):
                    purge(url, f"zz{r}x{i}.k")
                purge(url, f"evil{r}")
                say(f"unknown round {r + 1}/{rounds}")
    finally:
        app.stop()


SCENARIOS: dict[str, Callable[[Path, int], None]] = {
    "buffer": scenario_buffer,
    "at": scenario_at,
    "stop": scenario_stop,
    "stoprace": scenario_stoprace,
    "lease": scenario_lease,
    "lock": scenario_lock,
    "headers": scenario_headers,
    "unknown": scenario_unknown,
}


def print_table() -> int:
    print("\n| scenario | variant | rounds | bad | refused (counted hostile) |")
    print("|---|---|---|---|---|")
    worst = 0
    for (scenario, variant), t in TABLE.items():
        print(f"| {scenario} | {variant} | {t.rounds} | {t.bad} | {t.refused} |")
        worst = max(worst, t.bad)
    for (scenario, variant), t in TABLE.items():
        for note in t.notes:
            print(f"  {scenario} / {variant}: {note}")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="redteam48-") as tmp:
        for name in args.only.split(","):
            started = time.time()
            try:
                SCENARIOS[name](Path(tmp), args.rounds)
            except Exception as exc:  # a scenario that could not run: said, others go on
                tally(name, "scenario error").add(True, False, repr(exc)[:300])
            say(f"{name} done in {time.time() - started:.0f}s")
    return 1 if print_table() else 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["main"]
