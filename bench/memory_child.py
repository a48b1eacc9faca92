"""A real sidecar (``anarchon-sidecar run``) in this process, traced by tracemalloc.

``python -m bench.memory_child CONFIG READY_URL SNAPSHOT`` starts tracemalloc
before anything of the sidecar is imported, runs the sidecar's own entry point,
and from a thread waits for ``READY_URL`` to answer 200, waits 2 s (as
``bench.footprint`` does before reading RSS), collects garbage, dumps a
tracemalloc snapshot to ``SNAPSHOT`` with the process's RSS beside it
(``SNAPSHOT.rss``), and stops the sidecar with SIGTERM. Standard library and
the sidecar only: it runs in the runtime-only venv (``bench.memory``).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import tracemalloc
import urllib.request

FRAMES = 30


def rss_kib() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def watch(url: str, out: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.01)
    time.sleep(2)
    gc.collect()
    tracemalloc.take_snapshot().dump(out)
    with open(out + ".rss", "w") as f:
        f.write(f"{rss_kib()} {tracemalloc.get_traced_memory()[0]}\n")
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    config, url, out = sys.argv[1:4]
    tracemalloc.start(FRAMES)
    threading.Thread(target=watch, args=(url, out), daemon=True).start()
    from sidecar.__main__ import entry

    sys.argv = ["anarchon-sidecar", "run", "-c", config]
    entry()


if __name__ == "__main__":
    main()
