"""A power loss for a nats-server: the store goes back to what was fsynced.

A process killed with SIGKILL loses nothing it wrote: the kernel's page cache
still holds it. A power cut (or a kernel crash) loses every write that was
not fsynced. This models that, with what the server really did rather than
what it is said to do:

- the server runs under ``strace``, which logs every fsync-family system call
  it makes (``fsync``, ``fdatasync``, ``sync_file_range``, ``syncfs``,
  ``sync``), so the test knows how many it made and when;
- its store is on a tmpfs (``/dev/shm`` when there is one), so a snapshot is
  a fast copy; each snapshot is taken with the server stopped (SIGSTOP), so
  it is one moment of the store;
- ``mark()`` takes a snapshot: a moment the disk might be left at;
- ``power_cut()`` stops the server, takes one more snapshot, kills it
  (SIGKILL) and puts back the **oldest snapshot after which the server made no
  fsync**: the oldest state a power cut can leave (the disk holds at least
  what was fsynced, and possibly anything written later). Then it starts the
  server again on that store.

With ``sync_interval: always`` the server fsyncs every write before it
acknowledges it, so the snapshot of the cut itself is the one put back and
nothing acknowledged is lost. With the default (every 2 minutes) and a stream
younger than that, no fsync falls between an earlier mark and the cut, so the
mark's snapshot is put back and everything acknowledged after it is gone: what
Jepsen's NATS 2.12.1 analysis found. What the model leaves out: fsyncs are
per file, and one fsync here counts for the whole store; a real disk may also
keep a part of the unsynced writes (any of the snapshots in between).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support import NatsServer, nats_server_binary, port_open, wait_for

SYNC_CALLS = "fsync,fdatasync,sync_file_range,syncfs,sync"
SYNC_LINE = re.compile(r"\b(fsync|fdatasync|sync_file_range|syncfs|sync)\(")
TMPFS = Path("/dev/shm")


def strace_binary() -> str | None:
    return shutil.which("strace")


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
    """What one power cut did."""

    at: float
    restored_from: float  # the time of the snapshot put back
    syncs_since_mark: int  # fsync-family calls between the last mark and the cut
    down_s: float


class PowerLossServer(NatsServer):
    """A NatsServer run under strace, whose power can be cut."""

    def __init__(self, store_dir: Path, sync_interval: str | None = None, name: str = "n") -> None:
        super().__init__(store_dir, name=name)
        # None: nats-server's default (2 minutes); "always": fsync before every ack.
        self.sync_interval = sync_interval
        self.snapshots: list[Snapshot] = []
        self.trace_logs: list[Path] = []
        self._server_pid: int | None = None

    # -- running under strace ------------------------------------------------

    def config_text(self) -> str:
        sync = f"sync_interval: {self.sync_interval}" if self.sync_interval else ""
        return (
            f"server_name: {self.name}\n"
            f"listen: 127.0.0.1:{self.port}\n"
            f"http: 127.0.0.1:{self.monitor_port}\n"
            f"jetstream {{ store_dir: {str(self.store_dir / 'js')!r}\n  {sync}\n}}\n"
        )

    def start(self, timeout: float = 10.0) -> None:
        strace = strace_binary()
        assert strace, "strace is needed to see the server's fsyncs"
        conf = self.store_dir / f"{self.name}.conf"
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf.write_text(self.config_text())
        trace = self.store_dir / f"{self.name}.strace.{len(self.trace_logs)}"
        self.trace_logs.append(trace)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    *(strace, "-f", "-qq", "-ttt", "-e", f"trace={SYNC_CALLS}", "-o", str(trace)),
                    *(self.binary or nats_server_binary(), "-c", str(conf)),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._server_pid = None
        wait_for(lambda: port_open(self.port), timeout, what=f"nats-server on {self.port}")
        wait_for(self.jetstream_ready, timeout, what="JetStream ready")

    @property
    def server_pid(self) -> int:
        """The nats-server process (strace's child)."""
        if self._server_pid is None:
            assert self.proc is not None
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            (pid,) = children.read_text().split()
            self._server_pid = int(pid)
        return self._server_pid

    def syncs(self) -> int:
        """fsync-family calls the server made since it was last started."""
        if not self.trace_logs or not self.trace_logs[-1].exists():
            return 0
        return len(SYNC_LINE.findall(self.trace_logs[-1].read_text()))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.kill(self.server_pid, signal.SIGCONT)
                os.kill(self.server_pid, sig)
            except (ProcessLookupError, ValueError, OSError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        self._server_pid = None

    # -- the fault -------------------------------------------------------------

    def _stopped(self) -> bool:
        status = Path(f"/proc/{self.server_pid}/status").read_text()
        state = re.search(r"^State:\s+(\S)", status, re.M)
        return bool(state and state.group(1) in "tT")

    def _snapshot(self) -> Snapshot:
        """With the server stopped: copy the store as it is now."""
        target = self.store_dir.parent / f"{self.store_dir.name}.snap{len(self.snapshots)}"
        shutil.copytree(self.store_dir / "js", target / "js", symlinks=True)
        snap = Snapshot(target, time.time(), self.syncs())
        self.snapshots.append(snap)
        return snap

    def mark(self) -> Snapshot:
        """A moment the disk may be left at: the store copied with the server stopped."""
        os.kill(self.server_pid, signal.SIGSTOP)
        try:
            wait_for(self._stopped, 5, interval=0.005, what="nats-server stopped")
            return self._snapshot()
        finally:
            os.kill(self.server_pid, signal.SIGCONT)

    def power_cut(self, down_s: float = 0.5) -> Cut:
        """Stop, kill, put back the oldest snapshot no fsync came after, start again."""
        assert self.snapshots, "mark() first: a power cut goes back to a snapshot"
        mark = self.snapshots[-1]
        os.kill(self.server_pid, signal.SIGSTOP)
        wait_for(self._stopped, 5, interval=0.005, what="nats-server stopped")
        now = self._snapshot()
        at = now.taken_at
        # SIGKILL while stopped: nothing more is written.
        self.stop(signal.SIGKILL)
        durable = next(s for s in self.snapshots if s.syncs == now.syncs)
        shutil.rmtree(self.store_dir / "js")
        shutil.copytree(durable.path / "js", self.store_dir / "js", symlinks=True)
        for snap in self.snapshots:
            shutil.rmtree(snap.path, ignore_errors=True)
        # The next start's fsyncs are counted afresh: older snapshots no longer compare.
        self.snapshots = []
        time.sleep(down_s)
        self.start()
        return Cut(
            at=at,
            restored_from=durable.taken_at,
            syncs_since_mark=now.syncs - mark.syncs,
            down_s=time.time() - at,
        )

    def cleanup(self) -> None:
        self.stop(signal.SIGKILL)
        for snap in self.snapshots:
            shutil.rmtree(snap.path, ignore_errors=True)
