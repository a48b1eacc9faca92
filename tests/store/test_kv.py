"""The state bucket's one writer (sidecar/store/kv.py) for keys without a TTL, against a
real nats-server: compare-and-set steps, plain puts, deletes by revision, the
pause written by the CLI and by the page; and a source check that no other
module writes the bucket.
"""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from sidecar.core.clock import rfc3339
from sidecar.core.errors import CasConflict, StreamError
from sidecar.core.wire import paused_key
from sidecar.store.bucketcheck import StateSpec
from sidecar.store.kv import (
    create_or_update,
    delete_at,
    lock_ttl_limit,
    put_json,
    store_pause,
    ttl_of,
)
from sidecar.store.state import ensure_bucket
from tests.support import NatsServer

SPEC = StateSpec("T_STATE", 1, 60.0)


async def bucket_kv(nc: NATS) -> KeyValue:
    return (await ensure_bucket(nc.jetstream(), SPEC)).kv


async def stored(kv: KeyValue, key: str) -> tuple[dict[str, object], int]:
    entry = await kv.get(key)
    return json.loads(entry.value or b"{}"), int(entry.revision or 0)


async def test_create_or_update_is_one_compare_and_set_step(nc: NATS) -> None:
    kv = await bucket_kv(nc)
    first = await create_or_update(kv, "skip.j", {"slots": [1]}, None)
    assert await stored(kv, "skip.j") == ({"slots": [1]}, first)
    with pytest.raises(CasConflict):  # created already
        await create_or_update(kv, "skip.j", {"slots": [2]}, None)
    second = await create_or_update(kv, "skip.j", b'{"slots":[1,2]}', first)  # bytes as is
    assert second > first
    with pytest.raises(CasConflict):  # the revision it was read at is gone
        await create_or_update(kv, "skip.j", {"slots": [3]}, first)
    assert await stored(kv, "skip.j") == ({"slots": [1, 2]}, second)
    # A deleted key is free again for a create.
    await delete_at(kv, "skip.j", second)
    third = await create_or_update(kv, "skip.j", {"slots": [4]}, None)
    assert await stored(kv, "skip.j") == ({"slots": [4]}, third)


async def test_delete_at_a_revision_that_moved_on_is_a_conflict_and_keeps_the_key(
    nc: NATS,
) -> None:
    kv = await bucket_kv(nc)
    first = await create_or_update(kv, "backfill.j", {"pending": [1]}, None)
    second = await create_or_update(kv, "backfill.j", {"pending": [1, 2]}, first)
    with pytest.raises(CasConflict):
        await delete_at(kv, "backfill.j", first)
    assert (await stored(kv, "backfill.j"))[0] == {"pending": [1, 2]}
    await delete_at(kv, "backfill.j", second)
    with pytest.raises(KeyNotFoundError):
        await kv.get("backfill.j")
    # Without a revision: whatever the key holds.
    await put_json(kv, "instance.a", {"id": "a"})
    await delete_at(kv, "instance.a")
    with pytest.raises(KeyNotFoundError):
        await kv.get("instance.a")


async def test_put_json_overwrites_and_a_failed_put_names_the_key(
    nats_server: NatsServer,
) -> None:
    nc = NATS()
    await nc.connect(nats_server.url)
    kv = await bucket_kv(nc)
    first = await put_json(kv, "since.j", {"at": 1})
    second = await put_json(kv, "since.j", {"at": 2})
    assert await stored(kv, "since.j") == ({"at": 2}, second)
    assert second > first
    await nc.close()
    with pytest.raises(StreamError, match=r"since\.j"):
        await put_json(kv, "since.j", {"at": 3})


def pause_value(by: str, until: float | None = None) -> dict[str, object]:
    value: dict[str, object] = {"by": by, "at": rfc3339(time.time()), "reason": "r"}
    if until is not None:
        value["until"] = rfc3339(until)
    return value


async def test_keep_leaves_a_pause_in_force_and_replaces_one_that_ended(nc: NATS) -> None:
    kv = await bucket_kv(nc)
    cli = pause_value("cli")
    done = await store_pause(kv, "j", cli, "keep")
    assert (done.value, done.stored, done.replaced) == (cli, True, None)
    kept = await store_pause(kv, "j", pause_value("other"), "keep")
    assert (kept.value, kept.stored) == (cli, False)
    assert (await stored(kv, paused_key("j")))[0] == cli
    # A pause whose end has passed is no longer in force: replaced, and said so.
    ended = pause_value("ended", until=time.time() - 60)
    await put_json(kv, paused_key("j"), ended)
    fresh = pause_value("fresh")
    again = await store_pause(kv, "j", fresh, "keep")
    assert (again.value, again.stored, again.replaced) == (fresh, True, ended)
    assert (await stored(kv, paused_key("j")))[0] == fresh


async def test_replace_and_overwrite_store_over_a_pause_in_force(nc: NATS) -> None:
    kv = await bucket_kv(nc)
    first = pause_value("first")
    await store_pause(kv, "j", first, "keep")
    forced = pause_value("forced")
    replaced = await store_pause(kv, "j", forced, "replace")
    assert (replaced.value, replaced.stored, replaced.replaced) == (forced, True, first)
    page = pause_value("page")
    overwritten = await store_pause(kv, "j", page, "overwrite")
    assert (overwritten.value, overwritten.stored, overwritten.replaced) == (page, True, None)
    assert (await stored(kv, paused_key("j")))[0] == page
    # Over a deleted pause, each way stores.
    await delete_at(kv, paused_key("j"))
    assert (await store_pause(kv, "j", first, "replace")).replaced is None
    assert (await stored(kv, paused_key("j")))[0] == first


WRITES = {"create", "update", "put", "delete", "purge", "purge_deletes"}


def bucket_receiver(node: ast.expr) -> bool:
    """Whether a call's receiver is a nats-py KeyValue as sidecar/ names them:
    ``kv``, ``*.kv``, or ``await js.key_value(...)`` / ``create_key_value(...)``."""
    if isinstance(node, ast.Name):
        return node.id == "kv" or node.id.endswith("_kv")
    if isinstance(node, ast.Attribute):
        return node.attr == "kv"
    if isinstance(node, ast.Await):
        return bucket_receiver(node.value)
    if isinstance(node, ast.Call):
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        return name in {"key_value", "create_key_value"}
    return False


def bucket_subject(node: ast.expr) -> bool:
    """Whether a publish's subject is a state bucket key's: ``kv_subject(...)`` or
    ``keys.subject(...)`` (a ``Keys``, however it is reached)."""
    if not isinstance(node, ast.Call):
        return False
    if isinstance(node.func, ast.Name):
        return node.func.id == "kv_subject"
    if isinstance(node.func, ast.Attribute) and node.func.attr == "subject":
        receiver = node.func.value
        name = getattr(receiver, "id", getattr(receiver, "attr", ""))
        return name == "keys" or name.endswith("_keys")
    return False


def test_only_kv_py_writes_the_state_bucket() -> None:
    """Every write of the state bucket is in sidecar/store/kv.py (``Keys`` or the functions
    beside it): no other module calls a KeyValue's create/update/put/delete, nor
    publishes on a key's subject itself (as health.<job>'s writes once did)."""
    package = Path(__file__).resolve().parents[2] / "sidecar"
    writers: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr in WRITES and bucket_receiver(node.func.value):
                writers.setdefault(path.name, set()).add(node.func.attr)
            # ``send``: a write through a pipe (sidecar/store/pipe.py).
            sent = node.func.attr in {"publish", "send"}
            if sent and node.args and bucket_subject(node.args[0]):
                writers.setdefault(path.name, set()).add("publish")
    assert set(writers) == {"kv.py"}, writers
    assert writers["kv.py"] >= {"create", "update", "put", "delete"}  # the check sees them


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, None),
        ("30", 30.0),
        ("2s", 2.0),
        ("1h30m", 5400.0),
        ("1.5m", 90.0),
        ("never", None),  # nats-server keeps such a message for ever
        ("-1", None),
        ("0", None),
        ("500ms", None),  # under a second: nats-server refuses it
        ("30x", None),
        ("٣٠", None),  # digits, but not ASCII
    ],
)
def test_a_messages_ttl_as_nats_server_reads_it(header: str | None, seconds: float | None) -> None:
    assert ttl_of(header) == seconds
    assert lock_ttl_limit(2.0) == 3600.0 and lock_ttl_limit(600.0) == 6000.0
