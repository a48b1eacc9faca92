"""Render the table of the last run of each scenario from bench/results/reliability.json.

    python -m tests.reliability.report            # print the Markdown table
    python -m tests.reliability.report --write    # replace it in docs/RELIABILITY.md

The table sits between the markers ``<!-- reliability:begin -->`` and
``<!-- reliability:end -->`` of the doc.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tests.reliability.conftest import RESULTS, _fmt
from tests.support import ROOT

DOC = ROOT / "docs" / "RELIABILITY.md"
BEGIN = "<!-- reliability:begin -->"
END = "<!-- reliability:end -->"
# The order of the doc's sections.
ORDER = [
    "contention-fast",
    "contention",
    "clock-skew",
    "nats-restart",
    "cluster-failover",
    "cluster-10158",
    "lost-acks",
    "unanswered-claims",
    "app-faults",
    "hostile-messages",
    "config-fuzz",
    "thousand-jobs",
    "secrets",
    "forged-acks",
    "soak",
]


def latest(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The newest record of each scenario."""
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        out[record["scenario"]] = record
    return out


def table(records: list[dict[str, Any]]) -> str:
    last = latest(records)
    names = [n for n in ORDER if n in last] + sorted(set(last) - set(ORDER))
    lines = [
        "| scenario | set | outcome | figures | took | run at (UTC) |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        r = last[name]
        figures = " ".join(f"{k}={_fmt(v)}" for k, v in r["figures"].items())
        lines.append(
            f"| {name} | {'slow' if r.get('slow') else 'fast'} | {r.get('outcome', '?')} "
            f"| `{figures}` | {r.get('duration_s', '?')} s | {r.get('finished_at', '?')} |"
        )
    envs = sorted({(r.get("nats_server"), r.get("python"), r.get("cpus")) for r in last.values()})
    lines.append("")
    for server, python, cpus in envs:
        lines.append(f"nats-server {server}, Python {python}, {cpus} CPUs.")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"update {DOC.relative_to(ROOT)}")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    records = json.loads(args.results.read_text())
    text = table(records)
    if not args.write:
        print(text)
        return 0
    doc = DOC.read_text()
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest:
        print(f"{DOC}: no {BEGIN} marker", file=sys.stderr)
        return 1
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
