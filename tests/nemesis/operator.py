"""The nemesis's operator: the calendar commands at random moments while faults run.

One job, ``ops`` (every 2 s, ``jitter: 1s``), is operated on: pause, ``pause
--until``, resume, ``resume --catchup``, skip, unskip and backfill, each through
the CLI's own calls (sidecar/admin/oneshot.py, sidecar/admin/ops.py: one NATS connection
per command, as the command line makes), at a random moment every 0.3 to 3 s,
seeded like the faults. What was asked, when, and what the command answered
goes to ``ops.jsonl``; the checker (tests/nemesis/checker.py, ``check_operated``)
then requires every slot of ``ops`` to end as one run or one skip record.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

from sidecar.admin import oneshot, ops
from sidecar.config.load import Config, Secrets, load_config
from sidecar.core.clock import parse_rfc3339

OPERATED = "ops"
ACTIONS = ("pause", "pause-until", "resume", "resume-catchup", "skip", "unskip", "backfill")
# A command that gets no answer in this long is given up (and logged so).
COMMAND_TIMEOUT = 8.0


def operated_job(max_late: str) -> dict[str, Any]:
    return {"name": OPERATED, "schedule": "*/2 * * * * *", "jitter": "1s", "max_late": max_late}


class Operator:
    """Issues the commands in a thread of its own until stopped."""

    def __init__(self, config_path: Path, log_path: Path, seed: int) -> None:
        self.config: Config = load_config(str(config_path), {})
        self.secrets = Secrets()
        self.log_path = log_path
        self.rng = random.Random(seed ^ 0x0FA7E)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.count = 0
        self._last = ""

    def start(self, until: float) -> None:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run(until)), daemon=True, name="nemesis-operator"
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(COMMAND_TIMEOUT + 5)

    async def _run(self, until: float) -> None:
        with self.log_path.open("a") as out:
            while not self._stop.is_set() and time.time() < until:
                await asyncio.sleep(self.rng.uniform(0.3, 3.0))
                action = self.next_action()
                at = time.time()
                try:
                    detail = await asyncio.wait_for(self._do(action), COMMAND_TIMEOUT)
                    ok = True
                except Exception as exc:  # NATS cut off by a fault: the command failed
                    detail, ok = repr(exc)[:300], False
                rec = {"action": action, "at": at, "done": time.time(), "ok": ok, "detail": detail}
                out.write(json.dumps(rec) + "\n")
                out.flush()
                self.count += 1

    def next_action(self) -> str:
        """Any command; after a pause, a resume (half of them --catchup) is likelier,
        so that catch-ups of paused slots happen in a one-minute run too."""
        if self._last in ("pause", "pause-until") and self.rng.random() < 0.6:
            action = self.rng.choice(("resume", "resume-catchup", "resume-catchup"))
        else:
            action = self.rng.choice(ACTIONS)
        self._last = action
        return action

    async def _do(self, action: str) -> Any:
        c, s, job = self.config, self.secrets, self.config.job(OPERATED)
        now = time.time()
        if action == "pause":
            done = await oneshot.pause(c, s, OPERATED, "nemesis", "operator", True)
            return done.value
        if action == "pause-until":
            until = now + self.rng.uniform(0.5, 6.0)
            done = await oneshot.pause(c, s, OPERATED, "nemesis", "operator", True, until)
            return done.value
        if action in ("resume", "resume-catchup"):
            was = await oneshot.resume(c, s, OPERATED, ops.resume_bound(job))
            if action == "resume-catchup" and was is not None:
                since = round(parse_rfc3339(str(was.get("at"))) * 1000)
                slots = ops.backfill_slots(job, since, round(time.time() * 1000))
                if slots:
                    await ops.backfill(c, s, job, slots, "operator", False, False, "catchup")
                return {"was": was, "catchup": slots}
            return {"was": was}
        if action == "skip":
            added, left = await ops.skip(c, s, job, self.rng.randint(1, 3), "operator", "")
            return {"added": added, "left": left}
        if action == "unskip":
            return {"left": await ops.unskip(c, s, OPERATED)}
        # backfill: a few past slots, run anew by the fleet (trigger backfill)
        end = round((now - self.rng.uniform(1.0, 10.0)) * 1000)
        slots = ops.backfill_slots(job, end - 6000, end)
        try:
            plan = await ops.backfill(c, s, job, slots, "operator", False, False)
        except ValueError as exc:  # another backfill (or catch-up) is under way
            return {"refused": str(exc)}
        return {"slots": plan.slots}
