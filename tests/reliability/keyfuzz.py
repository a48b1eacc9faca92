"""Forged state bucket keys of every family (sidecar/store/keyfamilies.py), seeded.

``forged(jobs, now_ms, seed)`` gives (key, body, Nats-TTL header) triples: for
each family of the table, the red team's values of issue 48, hostile values
the family's check must refuse, and a bounded number of random ones
(garbage, wrong types, absurd numbers, malformed keys). None of them is
something a command of this project would write and the config and stream
would run: every value here must trigger nothing.
"""

from __future__ import annotations

import json
import random
from typing import Any

from sidecar.store.keyfamilies import FAMILIES

BIG = 2**53 - 1
GARBAGE: list[bytes] = [
    b"",
    b"\x00\xff\xfe not json",
    b"{",
    b"[]",
    b"null",
    b"42",
    b'"a string"',
    b"[" * 10_000,
    b"{}",
]


def _random_value(rng: random.Random, job: str) -> Any:
    """A JSON value with a shape that some family might read, its fields absurd."""
    atoms: list[Any] = [
        None,
        True,
        -1,
        0,
        1,
        BIG,
        10**30,
        1e308,
        "x" * rng.randint(0, 300),
        "evil\n\x1b[31m",
        "\u202e",
        [],
        {},
    ]
    fields = [
        "slot",
        "attempt",
        "token",
        "instance",
        "fence",
        "count",
        "runs",
        "slots",
        "until",
        "at",
        "by",
        "job",
        "due_at",
        "result",
        "started_at",
        "schedule",
        "request",
        "hash",
        "failures",
    ]
    value: dict[str, Any] = {f: rng.choice(atoms) for f in rng.sample(fields, rng.randint(1, 6))}
    if rng.random() < 0.5:
        value["job"] = job
    return value


def _red_team(job: str, on_schedule_ms: int, now_ms: int) -> dict[str, list[Any]]:
    """Issue 48's forged values, and one hostile value per family with a check."""
    runs = {"slot": on_schedule_ms, "by": "x", "queued_at": "y"}
    forged_run = {
        "job": job,
        "slot": now_ms - 1500,  # not a slot of a yearly schedule
        "attempt": 7,
        "token": "chosen-run-id-0000000000000000",
        "instance": "evil",
        "fence": BIG,
        "started_at": "2026-01-01T00:00:00Z",
    }
    return {
        "due.": [{"due_at": now_ms / 1000, "reason": "retry", "result": 1}],
        "backfill.": [
            {"slots": [now_ms + 3_600_000], "by": "x", "at": "y"},  # in the future
            {"slots": list(range(now_ms - 2000, now_ms - 1000)), "by": "x"},  # off the schedule
        ],
        # On an instant of the schedule (finding 3); more than 366 days ahead.
        "at.": [
            {"runs": [runs]},
            {"runs": [{**runs, "slot": now_ms + 400 * 86_400_000 + 1}]},
        ],
        # A job the file does not define: a request to another host.
        "job.": [{"schedule": "* * * * * *", "request": {"url": "http://evil.example/"}}],
        "lock.": [forged_run],  # without a TTL (finding 4b)
        "conc.": [forged_run],  # a concurrency slot without a TTL: held for ever
        "buffer.": [forged_run],  # finding 2
        "stop.": [{**forged_run, "slot": 1}],  # finding 4a
        "run.": [forged_run],
        "count.": [{"count": -5}, {"count": BIG}],
    }


# A pause or a skip may hold a job, as the commands may: `running` (the job
# that must keep taking its lock, to meet the forged one) gets none.
HOLDING = ("paused.", "skip.")


def forged(
    jobs: list[str],
    on_schedule_ms: dict[str, int],
    now_ms: int,
    seed: int,
    running: str,
    families: tuple[str, ...],
    per_family: int = 4,
) -> list[tuple[str, bytes, str | None]]:
    """(key, body, Nats-TTL) for every family of `families` and job, and keys of no
    family."""
    rng = random.Random(seed)
    out: list[tuple[str, bytes, str | None]] = []
    for family in (f for f in FAMILIES if f.prefix in families):
        # Keys without a TTL where a sidecar writes one, and a few with "never".
        ttls: list[str | None] = [None, "never"] if family.ttl else [None]
        for job in jobs:
            if job == running and family.prefix in HOLDING:
                continue
            key = f"{family.prefix}{job}"
            if family.prefix in ("due.", "run."):
                key = f"{key}.{now_ms - 1500}.2"  # a slot off every schedule here
            if family.prefix == "event.":
                key = f"{key}.forged.failing"
            if family.prefix == "conc.":
                key = f"{key}.0"  # slot 0 of the concurrency key named as the job
            for _ in range(per_family):
                body = (
                    rng.choice(GARBAGE)
                    if rng.random() < 0.3
                    else json.dumps(_random_value(rng, job)).encode()
                )
                out.append((key, body, rng.choice(ttls)))
            # The red team's last: the value the key keeps (history 1).
            red = _red_team(job, on_schedule_ms[job], now_ms).get(family.prefix, [])
            for value in red:
                out.append((key, json.dumps(value).encode(), None))
            # A malformed key of the family: more tokens, or none after the prefix.
            out.append((f"{key}.x.y", b"{}", None))
    # Last, a lock with a short TTL of each job (but `running`, whose untimed lock
    # it must meet): a sidecar sees it expire, as a real run's end, and looks at
    # what the forged buffer.<job>/stop.<job> keys say then.
    for job in (j for j in jobs if j != running):
        lock = {**_red_team(job, 0, now_ms)["lock."][0], "slot": now_ms - 1500, "attempt": 1}
        out.append((f"lock.{job}", json.dumps(lock).encode(), "1"))
    for name in ("evil", "ghost.a", "LOCK.a", "locks.a"):  # keys of no family
        out.append((f"{name}.k" if "." not in name else name, b'{"slot":1}', None))
    return out
