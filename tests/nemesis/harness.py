"""The system under test, each part in its own network namespace.

Three nats-servers form one JetStream cluster (routes over the bridge, stores
in the run's directory); five sidecars (`python -m sidecar run`) each reach
every server over the bridge and their own app over a unix socket. Unix
sockets are not network-namespaced, so an app stays reachable whatever is cut:
"a sidecar cut from NATS but not from its app" is a firewall rule, nothing more.

The apps are one asyncio loop in a thread of the test process, one socket per
sidecar; every request is written at once, as one JSON line, to the history
(``apps.jsonl``) with its arrival time on the host's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.nemesis.net import Network
from tests.nemesis.operator import operated_job
from tests.power import (
    Cut,
    Snapshot,
    Snapshots,
    count_syncs,
    only_child,
    stop_and_wait,
    traced,
)
from tests.support import ROOT, nats_server_binary, sidecar_env, wait_for, write_config

CLIENT_PORT = 4222
MONITOR_PORT = 8222
ROUTE_PORT = 6222
METRICS_PORT = 9464
STREAM = "CRON"

# Every request the apps record carries these (X-Anarchon-*).
RECORDED = (
    "Job",
    "Slot",
    "Attempt",
    "Fence",
    "Run-Id",
    "Instance",
    "Scheduled-At",
    "Trigger",
    "After-Run",
)


def _get_json(url: str, timeout: float = 1.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read() or b"{}")


@dataclass
class Proc:
    """A process started inside a namespace (`ip netns exec` execs in place: same pid)."""

    name: str
    host: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    stopped: bool = False  # SIGSTOPped by the nemesis

    def spawn(self, net: Network, argv: list[str], env: dict[str, str] | None = None) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                net.exec_prefix(self.host) + argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
            )
        self.stopped = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            self.stopped = True
        elif sig == signal.SIGCONT:
            self.stopped = False

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.stopped = False

    def terminate(self, timeout: float) -> None:
        """SIGCONT (it may be stopped), SIGTERM, and SIGKILL after `timeout`."""
        if not self.alive:
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self.stopped = False


class NatsNode(Proc):
    def __init__(self, name: str, workdir: Path, routes: list[str], power: bool = False) -> None:
        super().__init__(name, name, workdir / f"{name}.log")
        self.store = workdir / name
        self.routes = routes
        self.sync_always = False
        # Under strace, so that a power cut can put back what was fsynced (tests/power.py).
        self.power = power
        self.snapshots = Snapshots(self.store)
        self.trace_logs: list[Path] = []

    def config_text(self, sync_always: bool) -> str:
        routes = ", ".join(self.routes)
        sync = ", sync_interval: always" if sync_always else ""
        return (
            f"server_name: {self.name}\n"
            f"listen: 0.0.0.0:{CLIENT_PORT}\n"
            f"http: 0.0.0.0:{MONITOR_PORT}\n"
            f"jetstream {{ store_dir: {str(self.store)!r}{sync} }}\n"
            f"cluster {{ name: NEMESIS, listen: 0.0.0.0:{ROUTE_PORT}, routes: [{routes}] }}\n"
        )

    def start(self, net: Network, sync_always: bool | None = None) -> None:
        """Start (or restart: the same store, and the same fsync setting as before)."""
        if sync_always is not None:
            self.sync_always = sync_always
        self.store.mkdir(parents=True, exist_ok=True)
        conf = self.store.parent / f"{self.name}.conf"
        conf.write_text(self.config_text(self.sync_always))
        argv = [nats_server_binary(), "-c", str(conf)]
        if self.power:
            trace = self.store.parent / f"{self.name}.strace.{len(self.trace_logs)}"
            self.trace_logs.append(trace)
            argv = traced(argv, trace)
        self.spawn(net, argv)

    # Under strace the process started is strace: signals go to the server itself.

    def _server_pid(self) -> int | None:
        if not self.alive:
            return None
        assert self.proc is not None
        if not self.power:
            return self.proc.pid
        try:
            return only_child(self.proc.pid)
        except (OSError, ValueError):
            return None

    def signal(self, sig: int) -> None:
        if not self.power:
            super().signal(sig)
            return
        pid = self._server_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if sig == signal.SIGSTOP:
            self.stopped = True
        elif sig == signal.SIGCONT:
            self.stopped = False

    def kill(self) -> None:
        if self.power and (pid := self._server_pid()) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        super().kill()

    def terminate(self, timeout: float) -> None:
        if not self.power:
            super().terminate(timeout)
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.stopped = False

    # A power cut: mark() a moment, then cut() (tests/power.py says what it models).

    def syncs(self) -> int:
        return count_syncs(self.trace_logs[-1]) if self.trace_logs else 0

    def mark(self) -> float:
        pid = self._server_pid()
        assert self.power and pid is not None, f"{self.name}: not running under strace"
        stop_and_wait(pid)
        try:
            return self.snapshots.take(self.syncs()).taken_at
        finally:
            os.kill(pid, signal.SIGCONT)

    def stop_for_cut(self) -> Snapshot:
        """First step of a cut: stopped, and the store as it is now."""
        pid = self._server_pid()
        assert pid is not None, f"{self.name}: not running"
        stop_and_wait(pid)
        return self.snapshots.take(self.syncs())

    def cut(self, now: Snapshot) -> Cut:
        """Killed while stopped, the store put back to what was fsynced (not started)."""
        self.kill()
        return self.snapshots.lose_unsynced(now)


class SidecarNode(Proc):
    def __init__(self, name: str, workdir: Path, config: dict[str, Any]) -> None:
        super().__init__(name, name, workdir / f"{name}.log")
        self.config = config
        self.config_path = write_config(workdir / f"{name}.yaml", config)
        self.offset = 0.0  # ANARCHON_CLOCK_OFFSET of the running process

    def start(self, net: Network, offset: float = 0.0, failpoints: str = "") -> None:
        extra = {"ANARCHON_CLOCK_OFFSET": f"{offset:.3f}"} if offset else {}
        if failpoints:  # the claim-kill fault (faults.py)
            extra["ANARCHON_FAILPOINTS"] = failpoints
        env = sidecar_env(extra)
        with self.log_path.open("a") as log:
            log.write(
                f"----- nemesis: start with clock offset {offset:+.3f}s at {time.time():.3f}"
                f"{' failpoints ' + failpoints if failpoints else ''}\n"
            )
        self.spawn(net, [sys.executable, "-m", "sidecar", "run", "-c", str(self.config_path)], env)
        self.offset = offset


@dataclass
class Apps:
    """One app per sidecar on a unix socket; every request logged to `history`."""

    sockets: dict[str, str]
    history: Path
    delay: dict[str, float] = field(default_factory=dict)  # per path
    count: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runners: list[web.AppRunner] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _handler(self, app_name: str, out: Any) -> Any:
        async def handle(request: web.Request) -> web.Response:
            at = time.time()
            await request.read()
            rec = {"app": app_name, "at": at, "path": request.path}
            for key in RECORDED:
                rec[key.lower().replace("-", "_")] = request.headers.get(f"X-Anarchon-{key}")
            with self._lock:
                out.write(json.dumps(rec) + "\n")
                out.flush()
                self.count += 1
            await asyncio.sleep(self.delay.get(request.path, 0.0))
            return web.Response(text="ok")

        return handle

    def start(self) -> None:
        ready = threading.Event()
        errors: list[BaseException] = []
        self._loop = asyncio.new_event_loop()
        out = self.history.open("a")

        async def setup() -> None:
            for name, path in self.sockets.items():
                app = web.Application()
                app.router.add_route("*", "/{tail:.*}", self._handler(name, out))
                runner = web.AppRunner(app, handle_signals=False, access_log=None)
                await runner.setup()
                await web.UnixSite(runner, path).start()
                self._runners.append(runner)

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(setup())
            except BaseException as exc:  # reported by start()
                errors.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            out.close()

        self._thread = threading.Thread(target=run, daemon=True, name="nemesis-apps")
        self._thread.start()
        if not ready.wait(10) or errors:
            raise RuntimeError(f"apps did not start: {errors}")

    def stop(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        async def cleanup() -> None:
            for runner in self._runners:
                await runner.cleanup()

        if self._thread is not None and self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(10)
        loop.close()


# The run_on: every job and the job run after `lease` (job_configs).
EVERY_JOB = "each"
CHAINED_JOB = "then"


def job_configs(max_late: str, candidates: int = 0) -> list[dict[str, Any]]:
    """`tick` every second, `lease` every 2 s whose app takes 2 s (leases), `locked`
    every 2 s with ``overlap: skip`` (its runs hold ``lock.locked``: a claim-kill
    lands on a lock job's winner too), `each` on every sidecar every 2 s (run_on:
    every), `then` after each final run of `lease`.

    With `candidates` (``NEMESIS_CANDIDATES``), tick, lease and locked claim with
    ``claim.candidates``.
    """
    claim = {"claim": {"candidates": candidates, "fallback": "1s"}} if candidates else {}
    jobs: list[dict[str, Any]] = [
        {"name": "tick", "schedule": "* * * * * *", "jitter": "300ms", "max_late": max_late},
        {
            "name": "lease",
            "schedule": "*/2 * * * * *",
            "jitter": "300ms",
            "max_late": max_late,
            "retry": {"max": 1, "backoff": "1s"},
            "on_lost": "rerun",
        },
        {
            "name": LOCKED,
            "schedule": "*/2 * * * * *",
            "jitter": "300ms",
            "max_late": max_late,
            "overlap": "skip",
            "retry": {"max": 1, "backoff": "1s"},
            "on_lost": "rerun",
        },
    ]
    jobs = [{**job, **claim} for job in jobs]
    # Issue 50's kinds, checked by check_every and check_chain (checker.py): `each`
    # runs every slot on every sidecar, `then` once per final run of `lease`
    # (retried and rerun after a loss: it must still follow each slot once).
    # Neither takes claim.candidates (run_on: every refuses it; a chain has no slot).
    jobs.append(
        {
            "name": EVERY_JOB,
            "schedule": "*/2 * * * * *",
            "run_on": "every",
            "catchup": "all",
            "jitter": "300ms",
            "max_late": max_late,
        }
    )
    jobs.append(
        {
            "name": CHAINED_JOB,
            "after": {"job": "lease", "on": "always"},
            "jitter": "300ms",
            "max_late": max_late,
        }
    )
    return jobs


# The lock job: checked for what runs (doubles, late, unclaimed, claim kills), not
# for misses: a slot whose lock a frozen or killed runner still holds is skipped.
LOCKED = "locked"


LEASE_APP_DELAY = 2.0
LEASE_TTL = 3.0


class System:
    """The cluster, the sidecars, the apps and the network they share."""

    def __init__(
        self,
        workdir: Path,
        sidecars: int = 5,
        max_late: float = 4.0,
        candidates: int = 0,
        power: bool = False,
    ) -> None:
        self.workdir = workdir
        self.node_names = ["n1", "n2", "n3"]
        self.sidecar_names = [f"s{i}" for i in range(1, sidecars + 1)]
        self.net = Network(self.node_names + self.sidecar_names)
        self.max_late = max_late
        routes = [f"nats-route://{self.net.addresses[n]}:{ROUTE_PORT}" for n in self.node_names]
        self.nodes = {n: NatsNode(n, workdir, routes, power) for n in self.node_names}
        servers = [f"nats://{self.net.addresses[n]}:{CLIENT_PORT}" for n in self.node_names]
        appdir = workdir / "apps"
        appdir.mkdir(parents=True, exist_ok=True)
        sockets = {s: str(appdir / f"{s}.sock") for s in self.sidecar_names}
        self.jobs = job_configs(f"{int(max_late * 1000)}ms", candidates)
        # The job the operator pauses, skips and backfills (tests/nemesis/operator.py).
        self.jobs.append(operated_job(f"{int(max_late * 1000)}ms"))
        self.sidecars = {
            s: SidecarNode(
                s,
                workdir,
                {
                    "instance_id": s,
                    "shutdown_grace": "3s",
                    "nats": {
                        "servers": servers,
                        "replicas": 3,
                        "history_size": 1000,
                        "lease_ttl": f"{int(LEASE_TTL)}s",
                    },
                    "metrics": {"listen": f"0.0.0.0:{METRICS_PORT}"},
                    "target": {"url": f"unix://{sockets[s]}", "timeout": "10s"},
                    "jobs": self.jobs,
                },
            )
            for s in self.sidecar_names
        }
        self.apps = Apps(sockets, workdir / "apps.jsonl", {"/jobs/lease": LEASE_APP_DELAY})

    # ------------------------------------------------------------------ lifecycle

    def start(self, sync_always: bool = False) -> None:
        self.net.create()
        self.apps.start()
        for node in self.nodes.values():
            node.start(self.net, sync_always)
        for name in self.node_names:
            self.wait_node(name, 30)
        wait_for(
            lambda: all(self.node_healthy(n) for n in self.node_names),
            60,
            interval=0.2,
            what="NATS cluster healthy",
        )
        for sc in self.sidecars.values():
            sc.start(self.net)
        for name in self.sidecar_names:
            self.wait_sidecar(name, 60)

    def stop(self) -> None:
        """Every process gone and the network removed; safe to call twice."""
        for sc in self.sidecars.values():
            sc.terminate(8)
        for node in self.nodes.values():
            node.terminate(8)
        self.apps.stop()
        self.net.destroy()

    # ------------------------------------------------------------------ probes

    def monitor(self, node: str, path: str, timeout: float = 1.0) -> Any:
        return _get_json(f"http://{self.net.addresses[node]}:{MONITOR_PORT}{path}", timeout)

    def node_healthy(self, node: str) -> bool:
        try:
            return bool(self.monitor(node, "/healthz").get("status") == "ok")
        except (OSError, ValueError):
            return False

    def wait_node(self, node: str, timeout: float) -> None:
        def up() -> bool:
            proc = self.nodes[node]
            if not proc.alive:
                raise AssertionError(f"nats-server {node} exited:\n{proc.log_path.read_text()}")
            try:
                self.monitor(node, "/healthz?js-enabled-only=true")
                return True
            except (OSError, ValueError):
                return False

        wait_for(up, timeout, interval=0.1, what=f"nats-server {node}")

    def sidecar_ready(self, name: str) -> bool:
        url = f"http://{self.net.addresses[name]}:{METRICS_PORT}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                return bool(resp.status == 200)
        except (OSError, ValueError):
            return False

    def wait_sidecar(self, name: str, timeout: float) -> None:
        def ready() -> bool:
            sc = self.sidecars[name]
            if not sc.alive:
                raise AssertionError(f"sidecar {name} exited:\n{sc.log_path.read_text()[-3000:]}")
            return self.sidecar_ready(name)

        wait_for(ready, timeout, interval=0.2, what=f"sidecar {name} ready")

    def stream_leader(self) -> str | None:
        """The stream's leader as the running, unpaused nodes report it (majority of answers)."""
        votes: dict[str, int] = {}
        for name, node in self.nodes.items():
            if not node.alive or node.stopped:
                continue
            try:
                jsz = self.monitor(name, "/jsz?streams=true")
            except (OSError, ValueError):
                continue
            for account in jsz.get("account_details") or []:
                for detail in account.get("stream_detail") or []:
                    if detail.get("name") == STREAM:
                        leader = (detail.get("cluster") or {}).get("leader")
                        if leader:
                            votes[leader] = votes.get(leader, 0) + 1
        return max(votes, key=lambda k: votes[k]) if votes else None

    def raft_groups(self) -> dict[str, str]:
        """Stream name -> its Raft group's name, as any node reports it (the nodes'
        logs name a group, not its stream, when its leader steps down)."""
        groups: dict[str, str] = {}
        for name in self.node_names:
            try:
                jsz = self.monitor(name, "/jsz?streams=true&raft=true")
            except (OSError, ValueError):
                continue
            for account in jsz.get("account_details") or []:
                for detail in account.get("stream_detail") or []:
                    if detail.get("stream_raft_group"):
                        groups.setdefault(detail["name"], detail["stream_raft_group"])
        return groups

    def operator_config(self) -> Path:
        """The config the operator's commands read: the sidecars' NATS and jobs."""
        any_sidecar = next(iter(self.sidecars.values()))
        config = {**any_sidecar.config, "instance_id": "operator"}
        config.pop("metrics", None)
        return write_config(self.workdir / "operator.yaml", config)

    def client_url(self, node: str) -> str:
        return f"nats://{self.net.addresses[node]}:{CLIENT_PORT}"

    def pid_of(self, name: str) -> int | None:
        proc = (self.nodes.get(name) or self.sidecars[name]).proc
        return proc.pid if proc is not None else None


def environment_report() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
