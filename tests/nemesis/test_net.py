"""The nemesis network on its own: a cut is a real black hole, and nothing is left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.nemesis.net import Network, _links, available

UNAVAILABLE = available()
# Skipped where it cannot run (not root, no iptables); under CI that is a failure.
pytestmark = pytest.mark.skipif(
    UNAVAILABLE is not None and not os.environ.get("CI"), reason=str(UNAVAILABLE)
)

CONNECT = """
import socket, sys
s = socket.socket()
s.settimeout(1.0)
try:
    s.connect((sys.argv[1], 7777))
    print("connected")
except OSError as exc:
    print("failed", type(exc).__name__)
"""


def connect(net: Network, src: str, dst: str) -> str:
    argv = [*net.exec_prefix(src), sys.executable, "-c", CONNECT, net.addresses[dst]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout.strip()


def names(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return [n for n in out + _links() if n.startswith(prefix + "-")]


def test_cut_drops_both_ways_and_heals_and_destroy_removes_everything() -> None:
    assert UNAVAILABLE is None, f"CI must run the nemesis: {UNAVAILABLE}"
    net = Network(["a", "b", "c"])
    listener: subprocess.Popen[bytes] | None = None
    try:
        net.create()
        serve = (
            "import socket,time;s=socket.socket();s.bind(('0.0.0.0',7777));s.listen();"
            "time.sleep(60)"
        )
        listener = subprocess.Popen([*net.exec_prefix("b"), sys.executable, "-c", serve])
        # The listener may take a moment to bind: wait for it, with a deadline.
        for _ in range(50):
            if connect(net, "a", "b") == "connected":
                break
        assert connect(net, "a", "b") == "connected"
        net.cut({"a": ["b"]})
        assert connect(net, "a", "b") == "failed TimeoutError"  # dropped, not refused
        assert connect(net, "c", "b") == "connected"  # only the named link is cut
        net.cut({})
        assert connect(net, "a", "b") == "connected"
    finally:
        if listener is not None:
            listener.kill()
            listener.wait(10)
        net.destroy()
    assert names(net.prefix) == []
