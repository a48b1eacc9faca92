"""``python -m bench`` (``make bench``): every benchmark in turn, then the table.

Each runs in a process of its own and writes ``bench/results/<name>.json``;
the whole takes about six minutes on 2 cores.
"""

from __future__ import annotations

import subprocess
import sys
import time

from tests.support import ROOT

BENCHMARKS = (
    "claim_latency",
    "leases",
    "fleet",
    "footprint",
    "history",
    "state_view",
    "page",
    "candidates",
)


def main() -> None:
    failed = []
    for name in BENCHMARKS:
        t0 = time.monotonic()
        print(f"== {name}", flush=True)
        code = subprocess.call([sys.executable, "-m", f"bench.{name}"], cwd=ROOT)
        print(f"   ({time.monotonic() - t0:.0f} s)", flush=True)
        if code:
            failed.append(name)
    print(flush=True)
    subprocess.call([sys.executable, "-m", "bench.report", *sys.argv[1:]], cwd=ROOT)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
