"""The stream: created or brought in line as the reference says, against a real server."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from sidecar.cli.daemon import stream_spec
from sidecar.config.load import parse_config
from sidecar.core.errors import StreamError, StreamNotFound
from sidecar.store.stream import StreamSpec, StreamState, ensure_stream, read_stream
from tests.support import NatsServer

SPEC = StreamSpec("CRON", "cron.", 300.0, 1000, None)


class ApiSpy:
    """Sees every JetStream API request of one kind, on a connection of its own.

    Core NATS delivers a request to every subscriber of its subject, so the spy
    receives what the server's JetStream API receives. A marker published after
    the calls under test, over the same connection, arrives after them.
    """

    def __init__(self, url: str, api: str) -> None:
        self.url = url
        self.api = api
        self.seen: list[str] = []
        self.markers: dict[str, asyncio.Event] = {}

    async def __aenter__(self) -> ApiSpy:
        self.nc = await nats.connect(self.url)

        async def on_api(msg: Msg) -> None:
            self.seen.append(msg.subject)

        async def on_marker(msg: Msg) -> None:
            self.markers.setdefault(msg.data.decode(), asyncio.Event()).set()

        await self.nc.subscribe(f"$JS.API.{self.api}", cb=on_api)
        await self.nc.subscribe("spy.marker", cb=on_marker)
        await self.nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    async def settle(self, caller: NATS, name: str) -> list[str]:
        """What was seen up to now: sends a marker from `caller` and waits for it."""
        arrived = self.markers.setdefault(name, asyncio.Event())
        await caller.publish("spy.marker", name.encode())
        await caller.flush()
        await asyncio.wait_for(arrived.wait(), 5)
        return list(self.seen)


def no_leader(state: StreamState) -> StreamState:
    """A created stream's state has no leader yet; a read one has it."""
    return replace(state, leader=None)


async def test_missing_stream_is_created(nc: NATS) -> None:
    state = await ensure_stream(nc.jetstream(), SPEC)
    info = await nc.jetstream().stream_info("CRON")
    cfg = info.config
    assert cfg.subjects == ["cron.>"]
    assert cfg.duplicate_window == 300.0
    assert cfg.max_msgs_per_subject == 1000
    assert cfg.num_replicas == 1
    assert (state.name, state.subjects, state.duplicate_window) == ("CRON", ("cron.>",), 300.0)
    assert (state.history_size, state.replicas, state.messages) == (1000, 1, 0)
    assert state.storage == "file"
    assert state == no_leader(await read_stream(nc.jetstream(), SPEC))


async def test_existing_stream_is_brought_in_line_and_keeps_the_rest(nc: NATS) -> None:
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(
            name="CRON",
            subjects=["other.>"],
            description="shared with the billing team",
            duplicate_window=60.0,
            max_age=3600.0,
            max_msgs_per_subject=5,
        )
    )
    await js.publish("other.keep", b"still here")
    state = await ensure_stream(js, SPEC)
    cfg = (await js.stream_info("CRON")).config
    assert cfg.subjects == ["other.>", "cron.>"]
    assert cfg.duplicate_window == 300.0
    assert cfg.max_msgs_per_subject == 1000
    assert cfg.description == "shared with the billing team"
    assert cfg.max_age == 3600.0
    assert cfg.num_replicas == 1
    assert state.subjects == ("other.>", "cron.>") and state.history_size == 1000
    assert state.messages == 1
    assert (await js.get_msg("CRON", 1)).data == b"still here"
    # the added subject takes claims
    ack = await js.publish("cron.sync.claims", b"{}", headers={"Nats-Msg-Id": "sync:1"})
    assert ack.stream == "CRON"


async def test_only_what_differs_triggers_an_update(nats_server: NatsServer, nc: NATS) -> None:
    js = nc.jetstream()
    async with ApiSpy(nats_server.url, "STREAM.UPDATE.CRON") as spy:
        created = await ensure_stream(js, SPEC)
        assert await spy.settle(nc, "created") == []
        unchanged = await ensure_stream(js, SPEC)
        assert await spy.settle(nc, "unchanged") == []
        assert no_leader(unchanged) == no_leader(created)
        # each setting on its own is brought back
        for change in (
            {"duplicate_window": 120.0},
            {"max_msgs_per_subject": 10},
            {"subjects": ["other.>"]},
        ):
            before = len(spy.seen)
            cfg = (await js.stream_info("CRON")).config
            for key, value in change.items():
                setattr(cfg, key, value)
            await js.update_stream(cfg)
            state = await ensure_stream(js, SPEC)
            assert "cron.>" in state.subjects
            assert (state.duplicate_window, state.history_size) == (300.0, 1000)
            seen = await spy.settle(nc, str(change))
            assert len(seen) == before + 2, change  # ours above and the sidecar's
        assert await ensure_stream(js, SPEC) == await read_stream(js, SPEC)  # both from info
        assert len(await spy.settle(nc, "end")) == 6


async def test_replicas_on_a_standalone_server_say_what_to_do(nc: NATS) -> None:
    js = nc.jetstream()
    three = StreamSpec("CRON", "cron.", 300.0, 1000, 3)
    with pytest.raises(StreamError) as created:
        await ensure_stream(js, three)
    with pytest.raises(StreamNotFound):
        await read_stream(js, three)
    await ensure_stream(js, SPEC)
    with pytest.raises(StreamError) as updated:
        await ensure_stream(js, three)
    for exc, action in ((created.value, "create"), (updated.value, "update")):
        text = str(exc)
        assert not isinstance(exc, StreamNotFound)
        assert text.startswith(f"cannot {action} stream CRON with replicas=3")
        assert "not clustered" in text
        assert "set nats.replicas to 1" in text
    # a configured replicas of 1 is fine and kept
    one = await ensure_stream(js, StreamSpec("CRON", "cron.", 300.0, 1000, 1))
    assert one.replicas == 1


async def test_read_stream_of_a_missing_stream(nc: NATS) -> None:
    with pytest.raises(StreamNotFound, match="stream CRON does not exist"):
        await read_stream(nc.jetstream(), SPEC)


async def test_two_sidecars_ensure_the_stream_at_the_same_moment(nats_server: NatsServer) -> None:
    conns = [await nats.connect(nats_server.url) for _ in range(4)]
    try:
        specs = [StreamSpec(f"S{i}", f"s{i}.", 300.0, 1000, None) for i in range(10)]
        # same settings on both sides
        both = [(spec, c) for spec in specs for c in conns[:2]]
        states = await asyncio.gather(*(ensure_stream(c.jetstream(), spec) for spec, c in both))
        for (spec, _), state in zip(both, states, strict=True):
            assert (state.name, state.subjects) == (spec.name, (spec.subject,))
            assert state.history_size == 1000
        # different history sizes: the loser of the create race takes the update path
        racing = [StreamSpec(f"R{i}", f"r{i}.", 300.0, 1000 + i, None) for i in range(10)]
        other = [StreamSpec(f"R{i}", f"r{i}.", 300.0, 5000, None) for i in range(10)]
        await asyncio.gather(
            *(ensure_stream(conns[2].jetstream(), s) for s in racing),
            *(ensure_stream(conns[3].jetstream(), s) for s in other),
        )
        for a, b in zip(racing, other, strict=True):
            state = await read_stream(conns[0].jetstream(), a)
            assert state.subjects == (a.subject,)
            assert state.history_size in (a.history_size, b.history_size)
    finally:
        for c in conns:
            await c.close()


@pytest.mark.parametrize(
    ("nats_history", "job_histories", "effective"),
    [
        (1000, [None, None], 1000),
        (100, [500, None], 500),
        (100, [500, 2500], 2500),
        (3000, [500, 2500], 3000),
    ],
)
async def test_effective_history_size_reaches_the_stream(
    nc: NATS, nats_history: int, job_histories: list[int | None], effective: int
) -> None:
    jobs: list[dict[str, object]] = []
    for i, size in enumerate(job_histories):
        entry: dict[str, object] = {"name": f"job{i}", "schedule": "*/5 * * * *"}
        if size is not None:
            entry["history_size"] = size
        jobs.append(entry)
    config = parse_config({"nats": {"history_size": nats_history}, "jobs": jobs}, {})
    assert config.effective_history_size == effective
    await ensure_stream(nc.jetstream(), stream_spec(config))
    cfg = (await nc.jetstream().stream_info("CRON")).config
    assert cfg.max_msgs_per_subject == effective
