"""A real sidecar (``anarchon-sidecar run``) in this process, traced by tracemalloc.

``python -m bench.memory_child CONFIG READY_URL SNAPSHOT`` starts tracemalloc
before anything of the sidecar is imported, runs the sidecar's own entry point,
and from a thread waits for ``READY_URL`` to answer 200, waits 2 s (as
``bench.footprint`` does before reading RSS; with a fourth argument GO, waits
first for the file GO to exist: ``bench.bucket_memory`` makes it once the
sidecar took up every job of the bucket), collects garbage, dumps a
tracemalloc snapshot to ``SNAPSHOT`` with the process's RSS beside it
(``SNAPSHOT.rss``), and stops the sidecar with SIGTERM (env ``MEMORY_SLICE``:
the bucket jobs' take-up slice, s). Standard library and the sidecar only: it
runs in the runtime-only venv (``bench.memory``).
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


def watch(url: str, out: str, go: str | None) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.01)
    while go is not None and not os.path.exists(go) and time.monotonic() < deadline + 600:
        time.sleep(0.05)
    time.sleep(2)
    gc.collect()
    tracemalloc.take_snapshot().dump(out)
    with open(out + ".rss", "w") as f:
        f.write(f"{rss_kib()} {tracemalloc.get_traced_memory()[0]}\n")
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    config, url, out = sys.argv[1:4]
    go = sys.argv[4] if len(sys.argv) > 4 else None
    tracemalloc.start(FRAMES)
    threading.Thread(target=watch, args=(url, out, go), daemon=True).start()
    if os.environ.get("MEMORY_SLICE"):
        # bench.bucket_memory: the tracer slows every allocation several times, and a
        # take-up slice of a job or two re-registers the job set each time; a longer
        # slice takes the jobs up in the batches an untraced sidecar makes.
        from sidecar.admin import bucket_jobs

        bucket_jobs.SLICE = float(os.environ["MEMORY_SLICE"])
    from sidecar.__main__ import entry

    sys.argv = ["anarchon-sidecar", "run", "-c", config]
    entry()


if __name__ == "__main__":
    main()
