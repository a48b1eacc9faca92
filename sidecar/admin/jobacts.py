"""An act asked of a job by the fleet page or the API: checked, recorded, done.

``JobActs.act`` checks what is asked (the reason shown as it is, ``until`` and
``count`` parsed as the commands parse them) before anything is written,
records the act in ``actions.<job>`` (sidecar/admin/actions.py), does it
(pause, resume, skip, run-now, a one-off run or its cancel) and completes the
record; an act not done has its record taken back. Either way the answer says
which (``done``, ``recorded``). Who may ask (token, session, CSRF) is
sidecar/admin/api.py's business, before it calls here.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from sidecar.admin.actions import (
    ManualRuns,
    complete_action,
    drop_action,
    pause,
    record_action,
    resume,
    skip_detail,
)
from sidecar.admin.atacts import act as at_act
from sidecar.admin.skipwrite import skip as skip_runs
from sidecar.config.fields import MAX_REASON, shown_text, whole
from sidecar.config.instants import until_of
from sidecar.config.load import Config, Secrets
from sidecar.core.clock import rfc3339
from sidecar.core.errors import ConfigError, StreamError
from sidecar.when.pauses import MAX_SKIP

if TYPE_CHECKING:
    from sidecar.fleet.member import Fleet

log = logging.getLogger(__name__)

# What the page's forms and ``POST /api/v1/jobs/<job>/<action>`` may ask.
ACTIONS = ("run-now", "pause", "resume", "skip", "at", "cancel-at")


class JobActs:
    """The acts on the jobs of one sidecar (module doc)."""

    def __init__(self, config: Config, fleet: Fleet, job_secrets: Secrets | None) -> None:
        self.config = config
        self.fleet = fleet
        self.jobs = fleet.jobs  # the job set (sidecar/config/jobset.py)
        # ``skip`` writes with the CLI's own function, on its own connection.
        self.secrets = job_secrets
        # ``run-now``'s runs, once connected (``PageApp.attach``).
        self.runs: ManualRuns | None = None

    async def act(
        self, job: str, action: str, who: str, peer: str, form: dict[str, str], via: str
    ) -> tuple[int, dict[str, Any]]:
        """Check the request, record the act, do it; an act is either done and recorded,
        or neither, and the answer says which (``done``, ``recorded``)."""
        not_done = {"done": False, "recorded": False}
        bucket = self.fleet.bucket
        if bucket is None:
            return 503, {"error": "the state bucket is not open yet", **not_done}
        try:  # refused, not cut: a cut reason or a hidden character misleads who reads it
            reason = shown_text(form.get("reason", ""), "reason", MAX_REASON)
        except ConfigError as exc:
            return 400, {"error": str(exc), **not_done}
        until: str | None = None
        count = 1
        found = self.jobs.get(job)
        every = found is not None and found.run_on == "every"
        if every and action in ("run-now", "at"):  # once for the fleet: not per instance
            return 400, {"error": f"{action}: not for a job with run_on: every", **not_done}
        # What is asked is checked before anything is written.
        if action == "pause":
            asked = form.get("until", "").strip() or None
            if asked is not None:  # parsed as `pause --until` does: a time or a duration
                try:
                    until = rfc3339(until_of(asked, time.time()))
                except ValueError as exc:
                    return 400, {"error": f"until: {exc}", **not_done}
            intent = reason + (f" (until {until})" if until else "")
        elif action == "skip":
            if self.secrets is None:
                return 503, {"error": "skip is not available on this sidecar", **not_done}
            try:
                count = whole(form.get("count", "1") or "1")
            except ValueError:
                return 400, {"error": f"count: a whole number 1 to {MAX_SKIP}", **not_done}
            if not 1 <= count <= MAX_SKIP:
                return 400, {"error": f"count: must be 1 to {MAX_SKIP}, got {count}", **not_done}
            intent = f"skip {count} run(s)" + (f": {reason}" if reason else "")
        elif action == "run-now":
            if self.runs is None:
                return 503, {"error": "not connected to NATS yet", **not_done}
            intent = "run"
        elif action in ("at", "cancel-at"):  # one-off runs (sidecar/admin/atacts.py)
            asked = form.get("time", "").strip()
            intent = ("one-off run at " if action == "at" else "cancel one-off run(s) at ") + (
                asked[:64] + (f": {reason}" if reason and action == "at" else "")
            )
        else:
            intent = "resume"
        at = rfc3339(time.time())
        entry = {
            "id": secrets.token_hex(8),
            "at": at,
            "by": who,
            "action": action,
            "from": peer,
            "via": via,
            "instance": self.config.instance_id,
            "detail": intent,
        }
        try:
            await record_action(bucket.kv, job, entry)
        except StreamError as exc:
            return 503, {"error": f"not done: {exc}", **not_done}
        try:
            status, detail, answer = await self._do(job, action, who, reason, until, count, form)
        except Exception as exc:  # NATS away, a conflict: not done
            log.warning("fleet page: %s %s by %s not done: %r", action, job, who, exc)
            status, detail, answer = 503, intent, {"error": f"not done: {exc!r}"}
        if status != 200:
            try:
                await drop_action(bucket.kv, job, entry["id"])
            except StreamError as exc:
                log.warning("fleet page: the record of %s %s not taken back: %s", action, job, exc)
                answer["error"] += " (recorded as asked: its record could not be taken back)"
                return status, {**answer, "done": False, "recorded": True}
            return status, {**answer, **not_done}
        if detail != intent:
            try:
                await complete_action(bucket.kv, job, entry["id"], detail)
            except StreamError as exc:  # recorded as asked: the detail is what is missing
                log.warning("fleet page: detail of %s %s not recorded: %s", action, job, exc)
        log.info("fleet page: %s %s by %s from %s: %s", action, job, who, peer, detail)
        result = {"job": job, "action": action, "by": who, **answer, "at": at}
        return 200, {**result, "done": True, "recorded": True}

    async def _do(
        self,
        job: str,
        action: str,
        who: str,
        reason: str,
        until: str | None,
        count: int,
        form: dict[str, str],
    ) -> tuple[int, str, dict[str, Any]]:
        """Do the act: (status, the record's detail, the answer's fields)."""
        bucket = self.fleet.bucket
        assert bucket is not None
        if action in ("at", "cancel-at"):
            return await at_act(bucket.kv, self.jobs.job(job), action, form, who)
        if action == "pause":
            value = await pause(bucket.kv, job, who, reason, until)
            return 200, reason + (f" (until {until})" if until else ""), {"pause": value}
        if action == "resume":
            was = await resume(bucket.kv, job)
            if was is None:
                return 409, "", {"error": f"{job} was not paused"}
            return 200, f"paused by {was.get('by', '?')} at {was.get('at', '?')}", {}
        if action == "run-now":
            assert self.runs is not None
            token = await self.runs.start(job)
            return 200, f"run {token}", {"run_id": token}
        assert self.secrets is not None
        try:  # the same write as `anarchon-sidecar skip`
            added, left = await skip_runs(
                self.config, self.secrets, self.jobs.job(job), count, who, reason
            )
        except ValueError as exc:
            return 400, "", {"error": f"count: {exc}"}
        # The slots' ids (epoch ms), as ``skip.<job>`` holds them.
        return 200, skip_detail(added, reason), {"skipped": added, "skip_pending": left}
