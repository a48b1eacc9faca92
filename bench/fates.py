"""What the stream says of the slots a burst did not run (bench.burst).

A slot nobody ran must still have a fate record (docs/GUARANTEES.md, "One fate
per slot"): its fate message, the claim or skip record stored with
``<job>:<slot>``, and a result for that message's token (``skipped``, with
its reason). Each job of the burst is due once, so the last message of its
claims subject and of its results subject say it all: two direct reads a job,
only for the jobs the app never saw.

A missed slot's fate is one of: ``skipped:<reason>`` (recorded: the fate the
docs promise), ``running`` (a claim stored without a result: nobody runs it
and nothing says so) or ``none`` (no claim of the slot at all). The last two
are the burst's ``missed_without_record``.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import nats
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from sidecar.core.wire import MSG_ID, claim_msg_id

# Reads in flight at once.
BATCH = 200
WITHOUT_RECORD = ("running", "none")


async def _last(js: JetStreamContext, stream: str, subject: str) -> Any:
    try:
        return await js.get_last_msg(stream, subject)
    except NotFoundError:
        return None


async def _fate(js: JetStreamContext, stream: str, prefix: str, job: str, slot: int) -> str:
    claim = await _last(js, stream, f"{prefix}{job}.claims")
    if claim is None or (claim.headers or {}).get(MSG_ID) != claim_msg_id(job, slot, "", False):
        return "none"
    token = json.loads(claim.data or b"{}").get("token")
    result = await _last(js, stream, f"{prefix}{job}.results")
    data = json.loads(result.data or b"{}") if result is not None else {}
    if data.get("token") != token:
        return "running"
    status = str(data.get("status"))
    if status == "skipped":
        return f"skipped:{str(data.get('error', '')).split(':', 1)[0]}"
    return status


async def fates(url: str, stream: str, prefix: str, jobs: list[str], slot: int) -> Counter[str]:
    """The fate of `slot` (epoch ms) of each of `jobs`, counted by kind (module doc)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        out: Counter[str] = Counter()
        for at in range(0, len(jobs), BATCH):
            batch = jobs[at : at + BATCH]
            out.update(await asyncio.gather(*(_fate(js, stream, prefix, j, slot) for j in batch)))
        return out
    finally:
        await nc.close()


def without_record(counted: Counter[str]) -> int:
    """How many of the slots counted have no fate record."""
    return sum(counted[kind] for kind in WITHOUT_RECORD)
