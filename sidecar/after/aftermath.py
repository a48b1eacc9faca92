"""What follows a run's ending: pings, fleet-wide health, notifications, auto-pause,
duration anomalies and the run's span. One hook for every place a run ends.

``started`` is called by the runner as it triggers (``/start`` ping, the
overdue timer of ``expect.max``); ``marked`` adds the anomaly to a result
record before it is published; ``after_outcome`` is called by the one sidecar
that recorded the outcome (the runner, or the sidecar whose ``lost`` record
was stored) once it is published. None of them waits for the network: pings,
webhooks and the health update run as background tasks with bounded retries,
which the daemon's drain waits for (bounded). A skipped slot sends nothing.

Exactly once for the fleet: a ping comes only from the recording sidecar,
and JetStream stores one result per run and one ``lost`` record per attempt,
so each is sent by one sidecar. A notification's event is decided by the
compare-and-set on ``health.<job>`` (sidecar/after/health.py) and sent only after
its sender created ``event.<job>.<run>.<event>``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sidecar.after.notices import anomaly_of, event_payload, ping_body, trigger_kind
from sidecar.config.fields import format_duration
from sidecar.core.clock import Clock, rfc3339
from sidecar.core.errors import KeyHeld
from sidecar.core.tasks import TaskSet
from sidecar.core.wire import RAN_STATUSES, SUCCEEDED, ResultRecord, new_token
from sidecar.store.kv import Keys

# The code of pings and notifications (sidecar/obs/outbound.py, the health
# count, signing) and of spans (sidecar/obs/tracing.py) is imported where it
# is first used: a config without ping, notify, pause_after or tracing never
# loads it.
if TYPE_CHECKING:
    from sidecar.config.alerting import NotifyConfig
    from sidecar.config.load import Config, JobConfig
    from sidecar.fleet.member import Fleet
    from sidecar.obs.metrics import Metrics
    from sidecar.obs.outbound import Outbox
    from sidecar.obs.tracing import SpanExporter

log = logging.getLogger(__name__)

AUTO_BY = "auto"


class Aftermath:
    """The hook of run/job_loop.py, run/lease.py (lost runs) and ops/streamops.py (run-now)."""

    def __init__(
        self,
        config: Config,
        metrics: Metrics | None,
        clock: Clock,
        keys: Callable[[], Keys | None],
        signing_secret: bytes | None = None,
        fleet: Fleet | None = None,
        exporter: SpanExporter | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.keys = keys
        self.secret = signing_secret
        self.fleet = fleet
        self.exporter = exporter
        self._outbox = outbox
        if outbox is None and (config.notify or any(job.ping for job in config.jobs)):
            # Made now, not by the first run's /start ping: its import would
            # delay that run's trigger.
            self._outbox = self.outbox
            from sidecar.obs import tracing  # noqa: F401 (each ping's rid)
        self.tasks = TaskSet("an aftermath task", say=False)
        self._starts: dict[str, asyncio.Task[bool]] = {}  # a run's /start ping, by token
        self._overdue: dict[str, tuple[asyncio.TimerHandle, list[bool]]] = {}
        # The job set (sidecar/config/jobset.py), the file's jobs without a fleet (tests).
        self._jobs: Mapping[str, JobConfig] = (
            fleet.jobs if fleet is not None else {job.name: job for job in config.jobs}
        )
        if fleet is not None:
            fleet.key_listeners.append(self._key_changed, "health.", "paused.")

    @property
    def outbox(self) -> Outbox:
        """The sender of pings and notifications, made by the first."""
        if self._outbox is None:
            from sidecar.obs.outbound import Outbox

            self._outbox = Outbox()
        return self._outbox

    # ------------------------------------------------------------------ the hook

    def started(self, job: JobConfig, token: str, started_at: float) -> None:
        """The runner triggers: ``/start`` ping, and the overdue timer of expect.max."""
        ping = job.ping
        if ping is not None and ping.start:
            self._starts[token] = self._ping(job, f"{ping.url}/start", token, b"", "start")
        if job.expect is not None and job.expect.max is not None and self.metrics is not None:
            fired = [False]
            gauge = self.metrics.runs_overdue.labels(job=job.name)

            def overdue() -> None:
                fired[0] = True
                gauge.inc()
                log.warning(
                    "job %s run %s: still running after expect.max %s",
                    job.name,
                    token,
                    format_duration(job.expect.max if job.expect and job.expect.max else 0),
                )

            delay = max(0.0, started_at + job.expect.max - self.clock.wall())
            handle = asyncio.get_running_loop().call_later(delay, overdue)
            self._overdue[token] = (handle, fired)

    def marked(self, job: JobConfig, record: ResultRecord) -> ResultRecord:
        """The record with its anomaly (expect), before it is published."""
        anomaly = anomaly_of(job, record.status, record.duration_ms)
        if anomaly is None:
            return record
        from dataclasses import replace

        return replace(record, anomaly=anomaly)

    def after_outcome(
        self,
        job: JobConfig,
        record: ResultRecord,
        answer: bytes = b"",
        trigger: str | None = None,
    ) -> None:
        """A run's outcome is recorded (by this sidecar): tell whoever should know."""
        overdue = self._overdue.pop(record.token, None)
        if overdue is not None:
            handle, fired = overdue
            handle.cancel()
            if fired[0] and self.metrics is not None:
                self.metrics.runs_overdue.labels(job=job.name).dec()
        start = self._starts.pop(record.token, None)
        if record.status not in RAN_STATUSES:
            return  # skipped: nothing ran, nobody is told
        kind = trigger_kind(record.manual, record.attempt, trigger)
        if record.anomaly and self.metrics is not None:
            self.metrics.runs_anomalous_total.labels(job=job.name, kind=record.anomaly).inc()
        ping = job.ping
        if ping is not None:
            ok = record.status == SUCCEEDED
            self._ping(
                job,
                ping.url if ok else f"{ping.url}/fail",
                record.token,
                ping_body(record, kind, answer),
                "success" if ok else "fail",
                after=start,
            )
        if self.exporter is not None:
            self._export(job, record, kind)
        if self.config.notify or job.pause_after is not None:
            # The fleet-wide count is kept only where something reads it: one
            # read and one compare-and-set per run on the state bucket.
            self.tasks.spawn(self._follow(job, record, kind))

    async def drain(self) -> None:
        """Let the health updates and the sends queued so far finish, bounded."""
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=5.0)
        if self._outbox is not None:
            await self._outbox.drain()
        if self.exporter is not None:
            await self.exporter.drain()

    # ------------------------------------------------------------------ pings

    def _ping(
        self,
        job: JobConfig,
        url: str,
        token: str,
        body: bytes,
        kind: str,
        after: asyncio.Task[bool] | None = None,
    ) -> asyncio.Task[bool]:
        from sidecar.obs.tracing import run_uuid

        target = f"{url}?rid={run_uuid(token)}"
        metrics = self.metrics
        if metrics is not None:
            # Its series at 0 from the job's first ping of the kind, before its
            # outcome (after retries), so that AnarchonPingsFailing's increase()
            # sees the first failure; none for a job that never pinged (docs/METRICS.md).
            for outcome in ("sent", "failed"):
                metrics.pings_total.add(job.name, kind, outcome)

        def done(sent: bool) -> None:
            if metrics is not None:
                outcome = "sent" if sent else "failed"
                metrics.pings_total.labels(job=job.name, kind=kind, outcome=outcome).inc()

        headers = {"Content-Type": "text/plain; charset=utf-8"}
        return self.outbox.send(f"job {job.name}: {kind} ping", target, body, headers, done, after)

    # ------------------------------------------------------------------ health, events

    async def _follow(self, job: JobConfig, record: ResultRecord, kind: str) -> None:
        from sidecar.after.health import EVENT_TTL, apply, claim_event, health_key

        run = record.token
        events: tuple[str, ...] = ()
        health: dict[str, Any] = {}
        keys = self.keys()
        if keys is None:
            if job.pause_after is not None or self.config.notify:
                log.warning(
                    "job %s: the state bucket is not open; run %s not counted for "
                    "notifications or pause_after",
                    job.name,
                    run,
                )
        else:
            try:
                health, events = await apply(keys, job.name, record.status, run, job.pause_after)
            except Exception as exc:
                key = health_key(job.name)
                log.error("job %s: run %s not counted in %s: %r", job.name, run, key, exc)
        paused = "auto_paused" in events and keys is not None
        if paused and keys is not None and not await self._auto_pause(keys, job, health):
            events = tuple(e for e in events if e != "auto_paused")
        if record.anomaly:
            events = (*events, "anomaly")
        if not events or not self.config.notify:
            return
        for event in events:
            if keys is not None and keys.bucket.ttl:
                try:
                    if not await claim_event(keys, job.name, run, event, EVENT_TTL):
                        log.info("job %s: %s of run %s was sent already", job.name, event, run)
                        continue
                except Exception as exc:
                    log.warning("job %s: %s not sent: %r", job.name, event, exc)
                    continue
            payload = event_payload(event, job, record, kind, health, self.config.instance_id)
            for target in self.config.notify:
                if event in target.events:
                    self._notify(target, event, payload)

    async def _auto_pause(self, keys: Keys, job: JobConfig, health: dict[str, Any]) -> bool:
        """Pause the job fleet-wide (``paused.<job>``); False when it was paused already."""
        count = health.get("failures", job.pause_after)
        value = {
            "by": AUTO_BY,
            "at": rfc3339(self.clock.wall()),
            "reason": f"auto: {count} consecutive failures",
            "token": new_token(),  # not taken for a manual pause's owner (Keys.create)
        }
        try:
            await keys.create(f"paused.{job.name}", value, None)
        except KeyHeld:
            log.info("job %s: %d consecutive failures; paused already", job.name, count)
            return False
        except Exception as exc:
            log.error("job %s: auto-pause after %s failures not stored: %r", job.name, count, exc)
            return False
        log.error(
            "job %s paused on every sidecar: %s consecutive failed or lost runs "
            "(pause_after: %d); `anarchon-sidecar resume %s` resumes it",
            job.name,
            count,
            job.pause_after or 0,
            job.name,
        )
        return True

    def _notify(self, target: NotifyConfig, event: str, payload: dict[str, Any]) -> None:
        from sidecar.after.signing import SIGNATURE_HEADER, signature
        from sidecar.config.alerting import mask_url

        if target.format == "slack":
            data = json.dumps({"text": payload["message"]}).encode()
        else:
            data = json.dumps(payload, separators=(",", ":")).encode()
        secret = self.secret
        metrics = self.metrics

        def headers(body: bytes) -> dict[str, str]:
            fields = {"Content-Type": "application/json", "X-Anarchon-Event": event}
            if secret is not None:
                fields[SIGNATURE_HEADER] = signature(secret, int(time.time()), body)
            return fields

        def done(sent: bool) -> None:
            if metrics is not None:
                outcome = "sent" if sent else "failed"
                metrics.notifications_total.labels(event=event, outcome=outcome).inc()
            if sent:
                where = mask_url(target.url)
                log.info("notification %s of job %s sent to %s", event, payload["job"], where)

        self.outbox.send(f"notification {event}", target.url, data, headers, done)

    # ------------------------------------------------------------------ spans

    def _export(self, job: JobConfig, record: ResultRecord, kind: str) -> None:
        from sidecar.core.clock import parse_rfc3339
        from sidecar.obs.tracing import RunSpan, span_attributes

        assert self.exporter is not None
        try:
            start = parse_rfc3339(record.started_at)
            end = parse_rfc3339(record.finished_at)
        except ValueError:
            return
        attrs = span_attributes(
            job.name,
            record.slot,
            record.attempt,
            kind,
            record.status,
            job.schedule.expr,
            rfc3339(record.slot / 1000),
            record.instance,
            record.http_status,
        )
        if record.anomaly:
            attrs["anarchon.anomaly"] = record.anomaly
        span = RunSpan(
            record.token,
            f"{job.name} run",
            start,
            end,
            record.status == SUCCEEDED,
            attrs,
            record.error,
        )
        self.exporter.export(span)

    # ------------------------------------------------------------------ gauges

    def _key_changed(self, key: str) -> None:
        """Fleet-wide gauges from the watched bucket: failures in a row, auto-pauses."""
        if self.fleet is None or self.metrics is None:
            return
        keys = self.fleet.view.keys
        names = (
            self._jobs
            if key == ""
            else [key.split(".", 1)[1]]
            if key.startswith(("health.", "paused."))
            else []
        )
        for name in names:
            if name not in self._jobs:
                continue
            health = keys.get(f"health.{name}")
            failures = health.value.get("failures", 0) if health is not None else 0
            # A zero still at zero is left alone: the start's read of the bucket
            # would otherwise give 2,000 series of 1,000 jobs their own zero.
            counted = self.metrics.job_consecutive_failures
            number = isinstance(failures, int) and not isinstance(failures, bool)
            if number and (failures or counted.written(name)):
                counted.labels(job=name).set(failures)
            paused = keys.get(f"paused.{name}")
            auto = paused is not None and paused.value.get("by") == AUTO_BY
            if auto or self.metrics.job_auto_paused.written(name):
                self.metrics.job_auto_paused.labels(job=name).set(1 if auto else 0)
