"""The nemesis's power cuts (``NEMESIS_POWER=1``): drawn only when asked, and
read by the checker as the nodes being down from the cut to the restart.

The cut itself (strace, snapshots, the store put back) is exercised by
tests/reliability/test_power_loss.py on one server, and by nemesis runs with
``NEMESIS_POWER=1`` (figures in docs/RELIABILITY.md).
"""

from __future__ import annotations

from tests.nemesis.checker import touches
from tests.nemesis.faults import POWER, PROCESS, plan

NODES = ["n1", "n2", "n3"]
SIDECARS = ["s1", "s2", "s3", "s4", "s5"]


def test_power_cuts_only_when_asked_and_a_seed_keeps_its_schedule() -> None:
    for seed in range(1, 40):
        without = plan(seed, 120, NODES, SIDECARS)
        # Without power cuts the draws are those of before they existed.
        assert not [f for f in without if f.kind in POWER], seed
    drawn = {f.kind for seed in range(1, 40) for f in plan(seed, 120, NODES, SIDECARS, power=True)}
    assert set(POWER) <= drawn
    assert set(PROCESS) <= drawn
    for seed in range(1, 40):
        for f in plan(seed, 120, NODES, SIDECARS, power=True):
            if f.kind == "power-all":
                assert f.target == "n1,n2,n3"
            elif f.kind == "power-node":
                assert f.target in NODES


def test_checker_reads_a_power_cut_as_its_nodes_down() -> None:
    record = {
        "kind": "power-all",
        "target": "n1,n2,n3",
        "nodes": ["n1", "n2", "n3"],
        "start": 100.0,
        "end": 101.0,
        "leader": "n2",
    }
    (touch,) = touches([record], set(NODES))
    assert touch.nodes == frozenset(NODES)
    assert touch.cluster and touch.leader_hit
    (one,) = touches(
        [{**record, "kind": "power-node", "target": "n3", "nodes": ["n3"]}], set(NODES)
    )
    assert one.nodes == frozenset({"n3"}) and not one.leader_hit
