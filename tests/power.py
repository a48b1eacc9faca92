"""A power loss for a nats-server: the store goes back to what was fsynced.

A process killed with SIGKILL loses nothing it wrote: the kernel's page cache
still holds it. A power cut (or a kernel crash) loses every write that was
not fsynced. This models that, with what the server really did rather than
what it is said to do:

- the server runs under ``strace``, which logs every fsync-family system call
  it makes (``fsync``, ``fdatasync``, ``sync_file_range``, ``syncfs``,
  ``sync``), so the test knows how many it made;
- its store is best on a tmpfs (``/dev/shm``), so a snapshot is a fast copy;
  each snapshot is taken with the server stopped (SIGSTOP), so it is one
  moment of the store;
- a *mark* takes a snapshot: a moment the disk might be left at;
- the *cut* stops the server, takes one more snapshot, kills it (SIGKILL) and
  puts back the **oldest snapshot after which the server made no fsync**: the
  oldest state a power cut can leave (the disk holds at least what was
  fsynced, and possibly anything written later). Then the server starts again
  on that store.

With ``sync_interval: always`` the server fsyncs every write before it
acknowledges it, so the cut's own snapshot is put back and nothing
acknowledged is lost. With the default (every 2 minutes) and a stream younger
than that, no fsync falls between an earlier mark and the cut, so the mark's
snapshot is put back and everything acknowledged after it is gone: what
Jepsen's NATS 2.12.1 analysis found. What the model leaves out: fsyncs are
per file, and one fsync here counts for the whole store; a real disk may also
keep part of the unsynced writes (a state between two snapshots).

Used by tests/reliability/test_power_loss.py (one server) and the nemesis's
``power-node`` and ``power-all`` faults (tests/nemesis/faults.py).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import NatsServer, nats_server_binary, port_open, wait_for

SYNC_CALLS = "fsync,fdatasync,sync_file_range,syncfs,sync"
SYNC_LINE = re.compile(r"\b(fsync|fdatasync|sync_file_range|syncfs|sync)\(")
TMPFS = Path("/dev/shm")


def strace_binary() -> str | None:
    return shutil.which("strace")


def traced(argv: list[str], trace_log: Path) -> list[str]:
    """`argv` run under strace, its fsync-family calls logged to `trace_log`."""
    strace = strace_binary()
    assert strace, "strace is needed to see the server's fsyncs"
    return [strace, "-f", "-qq", "-ttt", "-e", f"trace={SYNC_CALLS}", "-o", str(trace_log), *argv]


def count_syncs(trace_log: Path) -> int:
    if not trace_log.exists():
        return 0
    return len(SYNC_LINE.findall(trace_log.read_text()))


def only_child(pid: int) -> int:
    """The one child of `pid` (strace's tracee)."""
    (child,) = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(child)


def is_stopped(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    state = re.search(r"^State:\s+(\S)", status, re.M)
    return bool(state and state.group(1) in "tT")


def stop_and_wait(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: is_stopped(pid), 5, interval=0.005, what=f"process {pid} stopped")


def tmpfs_dir(fallback: Path, name: str) -> Path:
    """A fresh directory on a tmpfs (``/dev/shm``), else under `fallback`."""
    base = TMPFS if TMPFS.is_dir() and os.access(TMPFS, os.W_OK) else fallback
    path = base / f"anarchon-power-{os.getpid()}-{name}-{time.monotonic_ns()}"
    path.mkdir(parents=True)
    return path


@dataclass
class Snapshot:
    path: Path
    taken_at: float
    syncs: int  # fsync-family calls the server had made when it was taken


@dataclass
class Cut:
    """What one power cut did to one server."""

    at: float
    restored_from: float  # the time of the snapshot put back
    syncs_since_mark: int  # fsync-family calls between the last mark and the cut


@dataclass
class Snapshots:
    """Snapshots of one server's store directory (taken while the server is stopped)."""

    store: Path
    taken: list[Snapshot] = field(default_factory=list)

    def take(self, syncs: int) -> Snapshot:
        target = self.store.parent / f"{self.store.name}.snap{len(self.taken)}"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(self.store, target, symlinks=True)
        snap = Snapshot(target, time.time(), syncs)
        self.taken.append(snap)
        return snap

    def lose_unsynced(self, now: Snapshot) -> Cut:
        """Put back the oldest snapshot with as many fsyncs as `now`; forget them all."""
        assert len(self.taken) >= 2, "mark first: a power cut goes back to a snapshot"
        mark = self.taken[-2]
        durable = next(s for s in self.taken if s.syncs == now.syncs)
        shutil.rmtree(self.store)
        shutil.copytree(durable.path, self.store, symlinks=True)
        self.clear()  # the next start's fsyncs are counted afresh
        return Cut(now.taken_at, durable.taken_at, now.syncs - mark.syncs)

    def clear(self) -> None:
        for snap in self.taken:
            shutil.rmtree(snap.path, ignore_errors=True)
        self.taken = []


class PowerLossServer(NatsServer):
    """A NatsServer run under strace, whose power can be cut."""

    def __init__(self, store_dir: Path, sync_interval: str | None = None, name: str = "n") -> None:
        super().__init__(store_dir, name=name)
        # None: nats-server's default (2 minutes); "always": fsync before every ack.
        self.sync_interval = sync_interval
        self.snapshots = Snapshots(store_dir / "js")
        self.trace_logs: list[Path] = []

    def config_text(self) -> str:
        sync = f"sync_interval: {self.sync_interval}" if self.sync_interval else ""
        return (
            f"server_name: {self.name}\n"
            f"listen: 127.0.0.1:{self.port}\n"
            f"http: 127.0.0.1:{self.monitor_port}\n"
            f"jetstream {{ store_dir: {str(self.store_dir / 'js')!r}\n  {sync}\n}}\n"
        )

    def start(self, timeout: float = 10.0) -> None:
        conf = self.store_dir / f"{self.name}.conf"
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf.write_text(self.config_text())
        trace = self.store_dir / f"{self.name}.strace.{len(self.trace_logs)}"
        self.trace_logs.append(trace)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                traced([self.binary or nats_server_binary(), "-c", str(conf)], trace),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: port_open(self.port), timeout, what=f"nats-server on {self.port}")
        wait_for(self.jetstream_ready, timeout, what="JetStream ready")

    @property
    def server_pid(self) -> int:
        assert self.proc is not None
        return only_child(self.proc.pid)

    def syncs(self) -> int:
        """fsync-family calls the server made since it was last started."""
        return count_syncs(self.trace_logs[-1]) if self.trace_logs else 0

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the server itself (not strace) and wait for both."""
        if self.proc and self.proc.poll() is None:
            try:
                pid = self.server_pid
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, sig)
            except (ProcessLookupError, ValueError, OSError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def mark(self) -> Snapshot:
        """A moment the disk may be left at: the store copied with the server stopped."""
        pid = self.server_pid
        stop_and_wait(pid)
        try:
            return self.snapshots.take(self.syncs())
        finally:
            os.kill(pid, signal.SIGCONT)

    def power_cut(self, down_s: float = 0.5) -> Cut:
        """Stop, kill, put back the oldest snapshot no fsync came after, start again."""
        stop_and_wait(self.server_pid)
        now = self.snapshots.take(self.syncs())
        self.stop(signal.SIGKILL)  # while stopped: nothing more is written
        cut = self.snapshots.lose_unsynced(now)
        time.sleep(down_s)
        self.start()
        return cut

    def cleanup(self) -> None:
        self.stop(signal.SIGKILL)
        self.snapshots.clear()
