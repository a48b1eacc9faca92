"""A real network for the nemesis: one network namespace per node, veth pairs on a bridge.

Every name this module creates starts with the run's prefix, ``nem<pid>``
(the test process's id), so that a run removes what it made, also after a
crash, and a later run removes what a killed run left behind
(`sweep_leftovers`: every ``nem<pid>`` whose process is gone).

Partitions are real: each namespace gets an iptables rule set that drops
packets from and to the peers it must not reach (both directions, both
ends: a silent black hole, as a cut cable or a dead switch port, not a
polite TCP reset). The host side of the bridge (``.1``) is never cut: the
test is the observer, like Jepsen's control node, and reads every node's
monitoring and the stream through it.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

PREFIX_RE = re.compile(r"^nem(\d+)-")


def _run(
    *cmd: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(cmd), capture_output=True, text=True, check=check, timeout=20, input=stdin
    )


def prefix_for(pid: int | None = None) -> str:
    return f"nem{pid if pid is not None else os.getpid()}"


def subnet_for(pid: int) -> str:
    """A /24 in 10.0.0.0/8 derived from the pid (two runs at once get different ones)."""
    return f"10.{200 + pid % 50}.{(pid // 50) % 250}"


@dataclass
class Network:
    """A bridge and one namespace per host name; `cut` sets who cannot reach whom."""

    hosts: list[str]
    prefix: str = field(default_factory=prefix_for)
    addresses: dict[str, str] = field(default_factory=dict)
    _created: bool = False

    def __post_init__(self) -> None:
        pid = int(self.prefix.removeprefix("nem"))
        net = subnet_for(pid)
        self.gateway = f"{net}.1"
        for i, host in enumerate(self.hosts, start=11):
            self.addresses[host] = f"{net}.{i}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def create(self) -> None:
        """The bridge, the namespaces and their links; lo up in each (apps and metrics use it)."""
        self._created = True
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for host in self.hosts:
            ns = self.ns(host)
            veth = f"{self.prefix}-{host}"  # the host end; names are ≤ 15 characters
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.addresses[host]}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def exec_prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program inside `host`'s namespace."""
        return ["ip", "netns", "exec", self.ns(host)]

    def cut(self, blocked: Mapping[str, Iterable[str]]) -> None:
        """Make exactly these links silent: `blocked[a]` holds the hosts `a` cannot reach.

        The relation is made symmetric. Every namespace's rules are replaced
        at once (iptables-restore), so one call moves from any partition to
        any other, and ``cut({})`` heals everything.
        """
        pairs: dict[str, set[str]] = {host: set() for host in self.hosts}
        for a, others in blocked.items():
            for b in others:
                if a != b:
                    pairs[a].add(b)
                    pairs[b].add(a)
        for host in self.hosts:
            rules = [
                "*filter",
                ":INPUT ACCEPT [0:0]",
                ":FORWARD ACCEPT [0:0]",
                ":OUTPUT ACCEPT [0:0]",
            ]
            for other in sorted(pairs[host]):
                ip = self.addresses[other]
                rules.append(f"-A INPUT -s {ip}/32 -j DROP")
                rules.append(f"-A OUTPUT -d {ip}/32 -j DROP")
            rules.append("COMMIT")
            _run(*self.exec_prefix(host), "iptables-restore", stdin="\n".join(rules) + "\n")

    def destroy(self) -> None:
        """Remove every namespace and link of this run's prefix (idempotent)."""
        remove_prefix(self.prefix)


def remove_prefix(prefix: str) -> None:
    """Delete every namespace and link whose name starts with ``prefix-``."""
    names = _run("ip", "netns", "list", check=False).stdout.split()
    for name in names:
        if name.startswith(prefix + "-"):
            _run("ip", "netns", "pids", name, check=False)
            for pid in _run("ip", "netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            _run("ip", "netns", "del", name, check=False)
    for link in _links():
        if link.startswith(prefix + "-"):
            _run("ip", "link", "del", link, check=False)


def _links() -> list[str]:
    out = _run("ip", "-o", "link", "show", check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def sweep_leftovers() -> list[str]:
    """Remove what runs whose process is gone left behind; returns the prefixes removed."""
    names = _run("ip", "netns", "list", check=False).stdout.split() + _links()
    dead: set[str] = set()
    for name in names:
        m = PREFIX_RE.match(name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            dead.add(f"nem{m.group(1)}")
    for prefix in sorted(dead):
        remove_prefix(prefix)
    return sorted(dead)


# Capability numbers of linux/capability.h that namespaces, links and rules need.
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21


def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def available() -> str | None:
    """Why the nemesis cannot run here, or None when it can.

    Root is not enough: a container's root (podman or docker without
    --privileged or --cap-add NET_ADMIN,SYS_ADMIN) cannot make namespaces or
    links. The capabilities are read, then a bridge is made and removed, as
    the nemesis would (seccomp or a read-only /sys can refuse it still).
    """
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    caps = _effective_caps()
    missing = [
        name
        for name, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN))
        if not caps >> bit & 1
    ]
    if missing:
        return (
            f"needs {' and '.join(missing)} (network admin rights; a container has them "
            "with --privileged or --cap-add NET_ADMIN --cap-add SYS_ADMIN)"
        )
    for tool in ("ip", "iptables-restore"):
        if _run("sh", "-c", f"command -v {tool}", check=False).returncode != 0:
            return f"needs {tool}"
    probe = f"nemprobe{os.getpid()}"[:15]
    made = _run("ip", "link", "add", probe, "type", "bridge", check=False)
    if made.returncode != 0:
        return f"cannot make a bridge ({made.stderr.strip() or made.returncode})"
    _run("ip", "link", "del", probe, check=False)
    return None
