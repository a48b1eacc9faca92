"""JetStream publishes pipelined (sidecar/store/pipe.py), against a real nats-server:
the wire is js.publish's (what a listener and the stream receive), its answers
read as js.publish reads them (an error answer, no responders, a timeout, a
duplicate), many in flight within the window, and a reconnect in the middle."""

from __future__ import annotations

import asyncio
import gc
import math
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, NoStreamResponseError

from sidecar.core.wire import EXPECTED_LAST_SUBJECT_SEQ, MSG_ID, compact
from sidecar.store.bucketcheck import StateSpec
from sidecar.store.kv import KV_OPERATION, Keys
from sidecar.store.pipe import GRAIN, Pipe, writes_of
from sidecar.store.state import ensure_bucket
from sidecar.store.stream import StreamSpec, ensure_stream
from tests.run.test_claim import connection_for
from tests.support import NatsServer, until

STATE = StateSpec("T_STATE", 1, 60.0)
RESULTS = StreamSpec("CRON", "cron.", 300.0, 1000, None)


@pytest.fixture
async def js_nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    nc = await nats.connect(nats_server.url)
    await ensure_stream(nc.jetstream(), RESULTS)
    try:
        yield nc
    finally:
        await nc.close()


async def heard(nc: NATS, subject: str, count: int) -> list[Msg]:
    """The next `count` messages on `subject`, as a core subscriber receives them."""
    got: list[Msg] = []

    async def hear(msg: Msg) -> None:
        got.append(msg)

    sub = await nc.subscribe(subject, cb=hear)
    try:
        await until(lambda: len(got) >= count, 10, f"{count} messages on {subject}")
    finally:
        await sub.unsubscribe()
    return got


Wire = tuple[list[tuple[str, str]], bytes]


def wire(msg: Any) -> Wire:
    """Headers (in their order) and body of a message as received or stored."""
    return list((msg.headers or {}).items()), bytes(msg.data or b"")


def named(message: Wire, revisions: list[int]) -> Wire:
    """`message` with an expected last sequence said as the index of the key's
    write it names (``#1``), not as the stream's sequence number."""
    headers = [
        (h, f"#{revisions.index(int(v)) + 1}" if h == EXPECTED_LAST_SUBJECT_SEQ and v != "0" else v)
        for h, v in message[0]
    ]
    return headers, message[1]


async def test_the_writes_are_byte_for_byte_what_js_publish_sends_and_stores(
    js_nc: NATS,
) -> None:
    """A lease create, a renewal and a delete written by Keys (through the pipe) and
    the same three by js.publish: a listener on the wire and the stream's stored
    copies see the same headers, in the same order, and the same bodies."""
    bucket = await ensure_bucket(js_nc.jetstream(), STATE)
    keys = Keys(bucket)
    js = js_nc.jetstream()
    listener = await nats.connect(js_nc.connected_url.geturl())  # type: ignore[union-attr]
    try:
        value = {"job": "j", "slot": 1, "token": "t", "instance": "me"}
        wired = asyncio.ensure_future(heard(listener, f"$KV.{STATE.bucket}.run.*.1", 6))
        await listener.flush()
        await asyncio.sleep(0.05)  # the listener's interest reaches the server
        created = await keys.create("run.a.1", value, 30.0)
        renewed = await keys.renew("run.a.1", value, created, 30.0)
        deleted = await keys.delete("run.a.1", renewed)
        # The same writes as js.publish made them before the pipe.
        subject = keys.subject("run.b.1")
        data = compact(value)
        first = await js.publish(
            subject, data, 2.0, STATE.stream, {EXPECTED_LAST_SUBJECT_SEQ: "0"}, msg_ttl=30
        )
        second = await js.publish(
            subject,
            data,
            2.0,
            STATE.stream,
            {EXPECTED_LAST_SUBJECT_SEQ: str(first.seq)},
            msg_ttl=30,
        )
        theirs = await js.publish(
            subject,
            b"",
            2.0,
            STATE.stream,
            {KV_OPERATION: "DEL", EXPECTED_LAST_SUBJECT_SEQ: str(second.seq)},
            msg_ttl=math.ceil(keys.marker_ttl),
        )
        # The revisions the compare-and-sets name differ between the two keys: each
        # is said as which of its key's writes it names.
        revisions = {"a": [created, renewed], "b": [first.seq, second.seq]}
        by_key: dict[str, list[Wire]] = {"a": [], "b": []}
        for m in await wired:
            key = m.subject.rsplit(".", 2)[-2]
            by_key[key].append(named(wire(m), revisions[key]))
        assert by_key["a"] == by_key["b"] and len(by_key["a"]) == 3
        assert [h for h, _ in by_key["a"][0][0]] == [
            EXPECTED_LAST_SUBJECT_SEQ,
            "Nats-Expected-Stream",
            "Nats-TTL",
        ]
        # What the server stored (the bucket keeps a key's last message): the same.
        ours = named(wire(await js.get_msg(STATE.stream, deleted)), revisions["a"])
        stored = named(wire(await js.get_msg(STATE.stream, theirs.seq)), revisions["b"])
        assert ours == stored == by_key["a"][2]
        held = await keys.create("run.c.1", value, 30.0)
        reference = await js.publish(
            keys.subject("run.d.1"), data, 2.0, STATE.stream, {EXPECTED_LAST_SUBJECT_SEQ: "0"}, 30
        )
        assert wire(await js.get_msg(STATE.stream, held)) == wire(
            await js.get_msg(STATE.stream, reference.seq)
        )
    finally:
        await listener.close()


async def test_a_result_with_a_message_id_is_stored_once_and_a_duplicate_is_said(
    js_nc: NATS,
) -> None:
    """duplicate is None for a first store (as nats-py gives it), True with the
    stored message's sequence for the second; the stored copy is js.publish's."""
    pipe = Pipe(js_nc)
    headers = {MSG_ID: "r-1"}
    first = await pipe.send("cron.j.results", b'{"a":1}', headers, RESULTS.name, 2.0)
    again = await pipe.send("cron.j.results", b'{"a":1}', headers, RESULTS.name, 2.0)
    assert first.duplicate is None and again.duplicate is True and again.seq == first.seq
    assert first.stream == RESULTS.name
    js = js_nc.jetstream()
    reference = await js.publish("cron.j.results", b'{"a":1}', 2.0, RESULTS.name, {MSG_ID: "r-2"})
    assert wire(await js.get_msg(RESULTS.name, first.seq)) == (
        [(MSG_ID, "r-1"), ("Nats-Expected-Stream", RESULTS.name)],
        b'{"a":1}',
    )
    assert wire(await js.get_msg(RESULTS.name, reference.seq)) == (
        [(MSG_ID, "r-2"), ("Nats-Expected-Stream", RESULTS.name)],
        b'{"a":1}',
    )


async def test_an_error_answer_is_the_typed_api_error_js_publish_raises(js_nc: NATS) -> None:
    """A wrong last subject sequence: the APIError (10071) js.publish raises, from the
    pipe too; the wrong stream expected and a subject no stream holds likewise."""
    pipe, js = Pipe(js_nc), js_nc.jetstream()
    await pipe.send("cron.e.results", b"1", {}, RESULTS.name, 2.0)
    wrong = {EXPECTED_LAST_SUBJECT_SEQ: "999"}
    with pytest.raises(APIError) as ours:
        await pipe.send("cron.e.results", b"2", dict(wrong), RESULTS.name, 2.0)
    with pytest.raises(APIError) as theirs:
        await js.publish("cron.e.results", b"2", 2.0, RESULTS.name, dict(wrong))
    assert ours.value.err_code == theirs.value.err_code == 10071
    assert type(ours.value) is type(theirs.value)
    with pytest.raises(APIError) as ours:
        await pipe.send("cron.e.results", b"2", {}, "OTHER", 2.0)
    with pytest.raises(APIError) as theirs:
        await js.publish("cron.e.results", b"2", 2.0, "OTHER", {})
    assert ours.value.err_code == theirs.value.err_code is not None
    with pytest.raises(NoStreamResponseError):
        await pipe.send("nowhere.x", b"", {}, RESULTS.name, 2.0)
    assert pipe.window.held == 0 and not pipe._pending


async def test_an_answer_that_does_not_come_times_out_on_time(js_nc: NATS) -> None:
    """A subject whose only listener never answers: NATS's TimeoutError after the
    timeout (rounded up to the grain, never early), nothing left waiting; a place
    not given within the timeout is the same TimeoutError, nothing sent."""
    heard: list[Msg] = []

    async def hear(msg: Msg) -> None:
        heard.append(msg)

    silent = await js_nc.subscribe("silent.>", cb=hear)
    pipe = Pipe(js_nc, window=1)
    started = time.monotonic()
    results = await asyncio.gather(
        *(pipe.send(f"silent.{i}", b"", {}, RESULTS.name, 0.3) for i in range(2)),
        return_exceptions=True,
    )
    took = time.monotonic() - started
    assert all(isinstance(r, NatsTimeoutError) for r in results), results
    assert 0.3 <= took < 0.3 + 2 * GRAIN + 0.5
    assert pipe.window.held == 0 and not pipe._pending and len(pipe.expiry) == 0
    # The second never went out: it waited for the one place until its timeout.
    await js_nc.flush()
    assert [m.subject for m in heard] == ["silent.0"]
    await silent.unsubscribe()


async def test_many_in_flight_within_the_window(js_nc: NATS) -> None:
    """2,000 writes at once through a window of 16: every one stored once, in
    order of their acks' sequences, never more than 16 out, nothing left behind."""
    pipe = Pipe(js_nc, window=16)
    most = 0
    real = pipe.publish

    async def publish(*args: Any, **kwargs: Any) -> Any:
        nonlocal most
        most = max(most, pipe.window.held)
        return await real(*args, **kwargs)

    pipe.publish = publish  # type: ignore[method-assign]
    acks = await asyncio.gather(
        *(
            pipe.send(f"cron.m{i}.results", b"x", {MSG_ID: f"m{i}"}, RESULTS.name, 5.0)
            for i in range(2000)
        )
    )
    assert len({a.seq for a in acks}) == 2000 and all(a.duplicate is None for a in acks)
    assert most == 16 and pipe.window.held == 0 and not pipe._pending


async def test_the_writes_go_on_after_a_reconnect(nats_server: NatsServer) -> None:
    """The server restarts with writes in flight: each one is answered or raises a
    transient error (never hangs), and once reconnected the same pipe (its inbox
    subscribed again by nats-py) is answered."""
    conn = connection_for(nats_server)
    nc = await conn.connect()
    try:
        await ensure_stream(nc.jetstream(), RESULTS)
        pipe = writes_of(nc)
        assert writes_of(nc) is pipe  # one per connection
        await pipe.send("cron.r.results", b"0", {}, RESULTS.name, 2.0)
        tasks = [
            asyncio.ensure_future(pipe.send(f"cron.r{i}.results", b"1", {}, RESULTS.name, 1.0))
            for i in range(300)
        ]
        await asyncio.to_thread(nats_server.stop)
        await asyncio.to_thread(nats_server.start)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        for r in results:
            assert not isinstance(r, BaseException) or isinstance(
                r, (NatsTimeoutError, NoStreamResponseError, nats.errors.Error)
            ), r
        await until(lambda: nc.is_connected, 20, "reconnected")
        deadline = time.monotonic() + 20
        while True:  # JetStream may take a moment to answer after the restart
            try:
                ack = await pipe.send("cron.r.results", b"2", {}, RESULTS.name, 1.0)
                break
            except (NatsTimeoutError, NoStreamResponseError):
                assert time.monotonic() < deadline, "no answer after the reconnect"
        assert ack.stream == RESULTS.name
        assert pipe.window.held == 0 and not pipe._pending
    finally:
        await conn.close()


async def test_a_connections_writes_pipe_goes_with_it(nats_server: NatsServer) -> None:
    """``writes_of`` keeps no connection alive: once a closed connection is dropped,
    its pipe is gone too (a pipe that held it would keep both for ever)."""
    nc = await nats.connect(nats_server.url)
    await ensure_stream(nc.jetstream(), RESULTS)
    pipe = writes_of(nc)
    await pipe.send("cron.g.results", b"1", {}, RESULTS.name, 2.0)
    gone = weakref.ref(pipe)
    await nc.close()
    del nc, pipe
    await asyncio.sleep(0)
    gc.collect()
    assert gone() is None
