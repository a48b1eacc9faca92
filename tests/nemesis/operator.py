"""The nemesis's operator: the calendar commands at random moments while faults run.

One job, ``ops`` (every 2 s, ``jitter: 1s``), is operated on: pause, ``pause
--until``, resume, ``resume --catchup``, skip, unskip and backfill, each through
the CLI's own calls (sidecar/ops/streamops.py, sidecar/ops/skipops.py: one NATS connection
per command, as the command line makes), at a random moment every 0.3 to 3 s,
seeded like the faults. What was asked, when, and what the command answered
goes to ``skipops.jsonl``; the checker (tests/nemesis/checker.py, ``check_operated``)
then requires every slot of ``ops`` to end as one run or one skip record.

It also queues one-off runs of ``ops`` (``at``, sidecar/ops/atops.py: an
instant 1.5 to 5 s ahead, off the schedule) and cancels some (``cancel-at``,
most often right after an ``at``: the next to come, at a moment from 0.3 s
before its instant to 0.8 s after, the race a cancel can lose), and
adds, updates and removes a job of the state bucket, ``rt`` (``job-add``,
``job-update``, ``job-remove``, sidecar/ops/jobops.py). What each was
asked with (the instant, the job's settings) goes to ``params`` in
``skipops.jsonl`` before the command is sent, so a command that got no answer is
still known; the checker's ``check_at`` and ``check_runtime`` judge them.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

from sidecar.admin import skipwrite
from sidecar.config.load import Config, Secrets, load_config
from sidecar.core.clock import parse_rfc3339
from sidecar.ops import skipops, streamops
from sidecar.when.backfillrange import backfill_slots

OPERATED = "ops"
ACTIONS = ("pause", "pause-until", "resume", "resume-catchup", "skip", "unskip", "backfill")
AT_ACTIONS = ("at", "cancel-at")
JOB_ACTIONS = ("job-add", "job-update", "job-remove")
# The job of the state bucket the operator adds, updates and removes.
RUNTIME = "rt"
RUNTIME_PERIOD_S = 2
# A command that gets no answer in this long is given up (and logged so).
COMMAND_TIMEOUT = 8.0


def operated_job(max_late: str) -> dict[str, Any]:
    return {"name": OPERATED, "schedule": "*/2 * * * * *", "jitter": "1s", "max_late": max_late}


def runtime_job(max_late: str, version: int) -> dict[str, Any]:
    """The job of the state bucket (`job add FILE`'s content); `version` > 0 for an update."""
    return {
        "name": RUNTIME,
        "id": "nemesis/rt",
        "schedule": f"*/{RUNTIME_PERIOD_S} * * * * *",
        "jitter": "500ms" if version % 2 == 0 else "1s",
        "max_late": max_late,
        "request": {"path": f"/jobs/{RUNTIME}", "body": f'{{"version": {version}}}'},
    }


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
        self._params: dict[str, Any] = {}
        self._queued: list[int] = []  # one-offs queued here, not known cancelled
        self._live = False  # whether `rt` was last added (as far as the answers said)
        self._version = 0

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
                self._params = {}
                at = time.time()
                try:
                    detail = await asyncio.wait_for(self._do(action), COMMAND_TIMEOUT)
                    ok = True
                except Exception as exc:  # NATS cut off by a fault: the command failed
                    detail, ok = repr(exc)[:300], False
                rec = {
                    "action": action,
                    "at": at,
                    "done": time.time(),
                    "ok": ok,
                    "detail": detail,
                    "params": self._params,
                }
                out.write(json.dumps(rec) + "\n")
                out.flush()
                self.count += 1

    def next_action(self) -> str:
        """Any command; after a pause, a resume (half of them --catchup) is likelier,
        so that catch-ups of paused slots happen in a one-minute run too. The first
        adds ``rt``; then a calendar command (40%), a one-off (40%) or a change of
        ``rt`` (20%: added when it is not, else updated or removed)."""
        pick = self.rng.random()
        if self.count == 0:
            action = "job-add"
        elif self._last == "at" and self.rng.random() < 0.6:
            action = "cancel-at"  # the one just queued, around its instant
        elif self._last in ("pause", "pause-until") and self.rng.random() < 0.6:
            action = self.rng.choice(("resume", "resume-catchup", "resume-catchup"))
        elif pick < 0.4:
            action = self.rng.choice(ACTIONS)
        elif pick < 0.8:
            ahead = [x for x in self._queued if x / 1000 > time.time() - 0.5]
            action = "cancel-at" if ahead and self.rng.random() < 0.6 else "at"
        elif not self._live:
            action = "job-add"
        else:
            action = self.rng.choice(("job-update", "job-remove"))
        self._last = action
        return action

    async def _do(self, action: str) -> Any:
        c, s, job = self.config, self.secrets, self.config.job(OPERATED)
        now = time.time()
        if action in AT_ACTIONS:
            return await self._at(action, job, now)
        if action in JOB_ACTIONS:
            return await self._job(action)
        if action == "pause":
            done = await streamops.pause(c, s, OPERATED, "nemesis", "operator", True)
            return done.value
        if action == "pause-until":
            until = now + self.rng.uniform(0.5, 6.0)
            done = await streamops.pause(c, s, OPERATED, "nemesis", "operator", True, until)
            return done.value
        if action in ("resume", "resume-catchup"):
            was = await streamops.resume(c, s, OPERATED, skipops.resume_bound(job))
            if action == "resume-catchup" and was is not None:
                since = round(parse_rfc3339(str(was.get("at"))) * 1000)
                slots = backfill_slots(job.schedule, since, round(time.time() * 1000))
                if slots:
                    await skipops.backfill(c, s, job, slots, "operator", False, False, "catchup")
                return {"was": was, "catchup": slots}
            return {"was": was}
        if action == "skip":
            added, left = await skipwrite.skip(c, s, job, self.rng.randint(1, 3), "operator", "")
            return {"added": added, "left": left}
        if action == "unskip":
            return {"left": await skipops.unskip(c, s, OPERATED)}
        # backfill: a few past slots, run anew by the fleet (trigger backfill)
        end = round((now - self.rng.uniform(1.0, 10.0)) * 1000)
        slots = backfill_slots(job.schedule, end - 6000, end)
        try:
            plan = await skipops.backfill(c, s, job, slots, "operator", False, False)
        except ValueError as exc:  # another backfill (or catch-up) is under way
            return {"refused": str(exc)}
        return {"slots": plan.slots}

    async def _at(self, action: str, job: Any, now: float) -> Any:
        from sidecar.ops import atops

        c, s = self.config, self.secrets
        if action == "at":
            slot = round((now + self.rng.uniform(1.5, 5.0)) * 1000)
            if job.schedule.next_slot(slot - 1) == slot:  # an instant of the schedule: refused
                slot += 1
            self._params = {"job": OPERATED, "slot": slot}
            done = await atops.cli_queue(c, s, job, slot, "operator", "nemesis")
            self._queued.append(slot)
            return {"slot": slot, "new": done.new}
        # The next one to come, cancelled at a moment around its instant (from
        # 0.3 s before to 0.8 s after: the sidecars read the key again at the
        # instant plus their jitter, then claim): a cancel racing the claim.
        ahead = [x for x in self._queued if x / 1000 > now - 0.5] or self._queued
        slot = min(ahead)
        self._queued.remove(slot)
        self._params = {"job": OPERATED, "slot": slot}
        wait = slot / 1000 + self.rng.uniform(-0.3, 0.8) - time.time()
        if 0 < wait < 5:
            await asyncio.sleep(wait)
        gone, late = await atops.cli_cancel(c, s, OPERATED, {slot}, "operator")
        return {"slot": slot, "gone": [r.slot for r in gone], "too_late": [r.slot for r in late]}

    async def _job(self, action: str) -> Any:
        from sidecar.admin.jobwrite import prepare
        from sidecar.core.errors import BucketJobRefused, SidecarError
        from sidecar.ops import jobops

        c, s = self.config, self.secrets
        max_late = f"{round(c.job(OPERATED).max_late * 1000)}ms"
        try:
            if action == "job-remove":
                self._params = {"job": RUNTIME}
                done = await jobops.remove(c, s, RUNTIME, None)
                self._live = False
            else:
                self._version += action == "job-update"
                data = runtime_job(max_late, self._version)
                self._params = {"job": RUNTIME, "definition": data}
                spec, value = prepare(c, data, None, "operator")
                if action == "job-add":
                    done = await jobops.add(c, s, spec, value)
                else:
                    done = await jobops.update(c, s, spec, value, False)
                self._live = True
        except BucketJobRefused as exc:
            # add: it is there (other settings); update, remove: it is not there.
            self._live = action == "job-add" or not exc.missing
            return {"what": "refused", "why": str(exc)[:200]}
        except SidecarError as exc:  # no definite answer: live or not, as may be
            raise RuntimeError(str(exc)) from exc
        return {"what": done.what, "revision": done.revision}
