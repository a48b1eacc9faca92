"""Beyond one cluster: a supercluster, and a hub with a leaf node of its own domain.

Real nats-servers on loopback: two clusters of two joined by gateways, and a
hub with a leaf node whose JetStream has its own domain. Sidecars on both
sides of each, a per-second job, and every slot must run exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import StreamConfig

from sidecar.core.clock import Clock
from sidecar.run.claim import Claimer, ClaimError
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    free_port,
    nats_server_binary,
    run_cli,
    wait_for,
)


class Server(NatsServer):
    """A NatsServer whose jetstream block can carry a domain."""

    def __init__(self, store: Path, name: str, extra: str = "", domain: str | None = None):
        super().__init__(store, name=name, extra_conf=extra)
        self.domain = domain

    def config_text(self) -> str:
        text = super().config_text()
        if self.domain:
            store = repr(str(self.store_dir / "js"))
            text = text.replace(
                f"jetstream {{ store_dir: {store} }}",
                f"jetstream {{ store_dir: {store}, domain: {self.domain} }}",
            )
        return text


def supercluster(work: Path) -> list[Server]:
    """C1 (a1, a2) and C2 (b1, b2), each a cluster, joined by gateways."""
    names = {"C1": ["a1", "a2"], "C2": ["b1", "b2"]}
    routes = {n: free_port() for ns in names.values() for n in ns}
    gateways = {c: free_port() for c in names}
    gw_list = ", ".join(f"{{name: {c}, urls: [nats://127.0.0.1:{gateways[c]}]}}" for c in names)
    servers = []
    for cluster, members in names.items():
        route_urls = ", ".join(f"nats-route://127.0.0.1:{routes[m]}" for m in members)
        for i, member in enumerate(members):
            # One gateway listener a cluster is enough for loopback tests.
            gw_port = gateways[cluster] if i == 0 else free_port()
            extra = (
                f"cluster {{ name: {cluster}, listen: 127.0.0.1:{routes[member]}, "
                f"routes: [{route_urls}] }}\n"
                f"gateway {{ name: {cluster}, listen: 127.0.0.1:{gw_port}, "
                f"gateways: [{gw_list}] }}\n"
            )
            servers.append(Server(work / member, member, extra))
    return servers


# How long all servers of a topology together may take to answer with JetStream.
STARTUP = 120.0


@contextlib.contextmanager
def running(servers: list[Server]) -> Iterator[list[Server]]:
    try:
        for server in servers:
            server.proc = None
            server.store_dir.mkdir(parents=True, exist_ok=True)
        # Start them all before waiting: a cluster needs its peers to elect.
        for server in servers:
            conf = server.store_dir / f"{server.name}.conf"
            conf.write_text(server.config_text())
            log = server.log_path.open("ab")
            server.proc = subprocess.Popen(
                [nats_server_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT
            )
            log.close()
        # Six servers electing on two loaded cores can take a while: one generous
        # deadline for all of them (they start together), but fail at once if one exits.
        deadline = time.monotonic() + STARTUP
        waiting = list(servers)
        while waiting:
            for server in list(waiting):
                assert server.proc is not None
                if server.proc.poll() is not None:
                    raise AssertionError(f"{server.name} exited: {server.log_path.read_text()}")
                if server.jetstream_ready():
                    waiting.remove(server)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(server.name for server in waiting)
                raise AssertionError(f"no JetStream on {names} after {STARTUP:g}s")
            time.sleep(0.2)
        yield servers
    finally:
        for server in servers:
            server.stop()


async def _until_stream_api(url: str, domain: str | None = None) -> None:
    """Wait until the JetStream API answers (a meta leader is elected)."""
    deadline = time.monotonic() + 40
    while True:
        try:
            nc = await nats.connect(url)
            try:
                await nc.jetstream(domain=domain).account_info()
                return
            finally:
                await nc.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


def job_config(url: str, app: RecordingApp, **nats_keys: Any) -> dict[str, Any]:
    return {
        "nats": {"servers": [url], **nats_keys},
        "target": {"url": app.url, "timeout": "5s"},
        "jobs": [{"name": "sync", "schedule": "* * * * * *", "jitter": "300ms", "max_late": "5s"}],
    }


def slots(app: RecordingApp) -> list[int]:
    return [int(r.headers["X-Anarchon-Slot"]) for r in app.requests_for("/jobs/sync")]


async def _stream_cluster(url: str, domain: str | None = None) -> tuple[str | None, str | None]:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream(domain=domain).stream_info("CRON")
        return (
            info.cluster.name if info.cluster else None,
            info.cluster.leader if info.cluster else None,
        )
    finally:
        await nc.close()


async def _stepdown(url: str) -> None:
    nc = await nats.connect(url)
    try:
        await nc.request("$JS.API.STREAM.LEADER.STEPDOWN.CRON", b"", timeout=5)
    finally:
        await nc.close()


@pytest.mark.timeout(360)
def test_a_supercluster_runs_each_slot_once_and_places_the_stream(
    tmp_path: Path, http_app: RecordingApp
) -> None:
    servers = supercluster(tmp_path)
    with running(servers):
        asyncio.run(_until_stream_api(servers[0].url))
        procs = []
        try:
            for i, server in enumerate(servers):  # one sidecar on every server, both sides
                cfg = job_config(server.url, http_app, replicas=2, placement={"cluster": "C2"})
                procs.append(Sidecar(tmp_path, f"s{i}", cfg, {}).start())
            for proc in procs:
                proc.wait_ready(60)
            cluster, leader = asyncio.run(_stream_cluster(servers[0].url))
            assert cluster == "C2" and leader in ("b1", "b2")
            start = time.time()
            wait_for(lambda: len(slots(http_app)) >= 6, 30, what="six runs")
            # A leader change inside C2 while C1's sidecars keep claiming.
            asyncio.run(_stepdown(servers[2].url))
            stepped = time.time()
            wait_for(
                lambda: [s for s in slots(http_app) if s / 1000 > stepped + 0.5],
                20,
                what="runs after the stepdown",
            )
            resumed = min(s / 1000 for s in slots(http_app) if s / 1000 > stepped)
            print(f"\nsupercluster: first slot after the stepdown {resumed - stepped:.2f}s later")
            wait_for(lambda: len([s for s in slots(http_app) if s / 1000 > stepped]) >= 4, 20)
            shown = run_cli("stream", "--json", "-c", str(procs[0].config_path))
            out = json.loads(shown.stdout)
            assert out["cluster"] == "C2" and out["replicas"] == 2 and out["domain"] is None
        finally:
            codes = [p.terminate() for p in procs]
        assert codes == [0] * len(procs)
    seen = Counter(slots(http_app))
    assert max(seen.values()) == 1, {s: n for s, n in seen.items() if n > 1}
    window = range((int(start) + 1) * 1000, (int(time.time()) - 2) * 1000, 1000)
    missed = [s for s in window if s not in seen]
    assert len(missed) <= 2, missed  # at most the slots of the leader change
    instances = {r.headers["X-Anarchon-Instance"] for r in http_app.requests_for("/jobs/sync")}
    assert len(instances) >= 2


@pytest.mark.timeout(420)
def test_a_leaf_site_shares_the_hubs_stream_with_nats_domain(
    tmp_path: Path, http_app: RecordingApp
) -> None:
    leaf_port = free_port()
    hub = Server(tmp_path / "hub", "hub", f"leafnodes {{ listen: 127.0.0.1:{leaf_port} }}\n", "hub")
    site = Server(
        tmp_path / "site",
        "site",
        f'leafnodes {{ remotes: [ {{ url: "nats-leaf://127.0.0.1:{leaf_port}" }} ] }}\n',
        "site",
    )
    with running([hub, site]):
        asyncio.run(_until_stream_api(hub.url, "hub"))
        wait_for(
            lambda: asyncio.run(_until_stream_api(site.url, "hub")) is None, 30, what="leaf up"
        )
        procs = [
            Sidecar(tmp_path, "hub-1", job_config(hub.url, http_app, domain="hub"), {}).start(),
            Sidecar(tmp_path, "site-1", job_config(site.url, http_app, domain="hub"), {}).start(),
            Sidecar(tmp_path, "site-2", job_config(site.url, http_app, domain="hub"), {}).start(),
        ]
        try:
            for proc in procs:
                proc.wait_ready(60)
            start = time.time()
            wait_for(lambda: len(slots(http_app)) >= 8, 30, what="eight runs")
            assert "JetStream answered: domain hub" in procs[1].log()
            assert "nats.domain is not set" not in procs[1].log()
        finally:
            codes = [p.terminate() for p in procs]
        assert codes == [0, 0, 0]
        seen = Counter(slots(http_app))
        assert max(seen.values()) == 1, seen
        instances = {r.headers["X-Anarchon-Instance"] for r in http_app.requests_for("/jobs/sync")}
        assert (instances & {"site-1", "site-2"} and "hub-1" in instances) or len(instances) >= 2
        window = range((int(start) + 1) * 1000, (int(time.time()) - 2) * 1000, 1000)
        missed = [s for s in window if s not in seen]
        # Every slot once; on a loaded 2-core machine one slot may miss its claim
        # window (counted by the sidecars, never run twice).
        assert len(missed) <= 1, missed
        # The hub goes away and comes back: the site's sidecars resume claiming.
        procs = [p.start() for p in procs[1:]]  # the two site sidecars again
        try:
            for proc in procs:
                proc.wait_ready(60)
            hub.stop()
            time.sleep(2)
            hub.start(30)
            back = time.time()
            wait_for(lambda: [s for s in slots(http_app) if s / 1000 > back], 90, what="runs again")
            resumed = min(s / 1000 for s in slots(http_app) if s / 1000 > back)
            print(f"\nleaf: first slot run {resumed - back:.2f}s after the hub was back")
        finally:
            assert [p.terminate() for p in procs] == [0, 0]
        assert max(Counter(slots(http_app)).values()) == 1
        # A site sidecar without nats.domain reaches the leaf's own JetStream: it says so.
        lone = Sidecar(
            tmp_path,
            "lone",
            {
                **job_config(site.url, http_app),
                "jobs": [{"name": "other", "schedule": "0 0 1 1 *"}],
            },
            {},
        ).start()
        try:
            wait_for(lambda: "nats.domain is not set" in lone.log(), 30, what="the warning")
            assert "has domain 'site'" in lone.log()
        finally:
            assert lone.terminate() == 0


async def _claim_with_expected_domain(url: str) -> str:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="CRON", subjects=["cron.>"]))
        claimer = Claimer(nc, js, "CRON", "cron.", "x", Clock(), domain="hub", check_domain=True)
        try:
            await claimer.claim("sync", 1_000, time.monotonic() + 5)
        except ClaimError as exc:
            return str(exc)
        return "won"
    finally:
        await nc.close()


def test_a_claim_stored_in_another_domain_is_not_run(tmp_path: Path) -> None:
    server = Server(tmp_path / "n", "n", domain="site")
    with running([server]):
        asyncio.run(_until_stream_api(server.url))
        why = asyncio.run(_claim_with_expected_domain(server.url))
    assert "stored in JetStream domain site, not hub; not run" in why
