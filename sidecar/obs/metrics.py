"""Prometheus metrics of docs/METRICS.md, on a registry that the caller injects.

No global registry: tests create as many sidecars in one process as they like
and read values with ``registry.get_sample_value``. Every name is prefixed
``anarchon_``; the only labels are ``job`` (bounded by the config), ``status``
and ``reason`` (fixed sets) and ``version``. The per-job series are the lean
ones of ``sidecar.obs.metric_series``, and a job has none until it has
something to say (docs/METRICS.md, "Series per job"): at 100,000 jobs a
series each is megabytes at every scrape.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from fnmatch import fnmatchcase

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics
from prometheus_client.utils import INF, floatToGoString

from sidecar import __version__
from sidecar.obs.metric_series import (
    ByJobHistogram,
    CounterSeries,
    HistogramSeries,
    Labelled,
    QuietAtOne,
    ShownGauge,
)

PREFIX = "anarchon"

# Claims are one JetStream round trip: sub-millisecond to seconds.
ACK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Trigger requests: milliseconds to the 30 s default timeout and beyond.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# Start delay: the drawn jitter (default up to 2 s) plus the claim.
DELAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60)

# What hostile input from NATS was refused (hostile_input_total{what}).
HOSTILE_KINDS = (
    "due_key",
    "backfill_key",
    "value",
    "at_key",
    "job",
    "lock_key",
    "buffer_key",
    "stop_key",
    "conc_key",
    "unknown_key",
    "result",
)

# The ``_created`` series double every counter for no use here.
disable_created_metrics()  # type: ignore[no-untyped-call]
NOTIFY_EVENTS = ("failing", "recovered", "lost", "auto_paused", "anomaly")
# A job's next-run time is exposed once its next slot is this close (or once it
# claimed a slot here): a yearly job waiting for its day costs no series.
NEXT_RUN_HORIZON = 3600.0


def shown(
    items: list[tuple[tuple[str, ...], ShownGauge]],
) -> list[tuple[tuple[str, ...], ShownGauge]]:
    """The series of a ShownGauge metric that left their quiet value."""
    return [(key, series) for key, series in items if series.shown]


class NextRun(ShownGauge):
    """The next-run gauge: exposed once it is set to, or a scrape finds it at, a slot
    within NEXT_RUN_HORIZON (``soon``, the Metrics' clock), or from the job's first
    claim; then for good (a job whose last slot came and went shows its 0)."""

    __slots__ = ("soon",)

    def __init__(self, soon: Callable[[float], bool]) -> None:
        super().__init__()
        self.soon = soon

    def set(self, value: float) -> None:
        self.value = float(value)
        self.shown = self.shown or self.soon(self.value)


class Metrics:
    """Every metric of docs/METRICS.md; attribute names are the metric names without prefix."""

    def __init__(
        self,
        registry: CollectorRegistry,
        per_job_histograms: tuple[str, ...] = (),
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``per_job_histograms``: globs of the jobs whose histograms have a series of
        their own (``metrics.per_job_histograms``); ``wall``: the clock's Unix time."""
        self.registry = registry
        self.wall = wall
        job = ("job",)

        def per_job(name: str) -> bool:
            return any(fnmatchcase(name, glob) for glob in per_job_histograms)

        def counter(
            name: str,
            doc: str,
            labels: tuple[str, ...] = job,
            on_new: Callable[[tuple[str, ...]], None] | None = None,
        ) -> Labelled[CounterSeries]:
            return Labelled(
                registry, "counter", f"{PREFIX}_{name}", doc, labels, CounterSeries, on_new
            )

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> ByJobHistogram:
            bounds = (*buckets, INF)
            les = tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]
            new = functools.partial(HistogramSeries, bounds, les)
            return ByJobHistogram(registry, f"{PREFIX}_{name}", doc, new, per_job)

        def job_gauge(
            name: str, doc: str, new: Callable[[], ShownGauge] = ShownGauge
        ) -> Labelled[ShownGauge]:
            full = f"{PREFIX}_{name}"
            return Labelled(registry, "gauge", full, doc, job, new, shown=shown)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, labels, namespace=PREFIX, registry=registry)

        first = self._first_claim
        self.claims_won_total = counter("claims_won", "Claims this instance won.", on_new=first)
        self.claims_lost_total = counter(
            "claims_lost", "Claims another instance won.", on_new=first
        )
        # Per sidecar: per job it counted what claims_lost does (the losers' acks).
        self.claim_duplicate_acks_total = Counter(
            "claim_duplicate_acks",
            "Claim acks flagged duplicate (own retries included).",
            namespace=PREFIX,
            registry=registry,
        )
        self.claims_skipped_total = counter(
            "claims_skipped", "Slots not claimed, by reason.", ("job", "reason")
        )
        self.claim_errors_total = counter(
            "claim_errors", "Claims that got no definite answer (timeout, no stream)."
        )
        # claim.candidates (sidecar/fleet/candidates.py): slots left to their candidates.
        self.claims_deferred_total = counter(
            "claims_deferred",
            "Slots this instance left to their claim candidates, by outcome.",
            ("job", "outcome"),
        )
        self.claim_ack_seconds = histogram(
            "claim_ack_seconds", "Time from publishing a claim to its ack.", ACK_BUCKETS
        )
        self.runs_total = counter("runs", "Finished runs, by status.", ("job", "status"))
        self.run_duration_seconds = histogram(
            "run_duration_seconds", "Time of the trigger request to the app.", RUN_BUCKETS
        )
        self.run_start_delay_seconds = histogram(
            "run_start_delay_seconds",
            "Time from the slot's scheduled instant to the trigger request's start.",
            DELAY_BUCKETS,
        )
        self.runs_in_progress = job_gauge("runs_in_progress", "Trigger requests running now.")
        self.job_next_run_timestamp_seconds: Labelled[ShownGauge] = Labelled(
            registry,
            "gauge",
            f"{PREFIX}_job_next_run_timestamp_seconds",
            "Unix time of the job's next slot.",
            job,
            functools.partial(NextRun, self._soon),
            shown=self._next_run_shown,
        )
        self.job_last_success_timestamp_seconds = job_gauge(
            "job_last_success_timestamp_seconds",
            "Unix time at which the last successful run on this instance finished.",
        )
        self.stream_messages = gauge("stream_messages", "Messages in the stream.")
        self.stream_bytes = gauge("stream_bytes", "Bytes in the stream.")
        self.stream_history_size = gauge(
            "stream_history_size", "Per-subject message limit of the stream (effective history)."
        )
        self.stream_duplicate_window_seconds = gauge(
            "stream_duplicate_window_seconds", "Duplicate window of the stream."
        )
        self.stream_replicas = gauge("stream_replicas", "Replicas of the stream.")
        self.stream_covers_job = job_gauge(
            "stream_covers_job",
            "1 while the stream's duplicate window and history hold the job's claims for "
            "jitter + max_late; 0 while its slots are skipped (reason stream). Exposed "
            "once the stream did not hold them.",
            QuietAtOne,
        )
        self.job_paused = job_gauge("job_paused", "1 while the job is paused (state bucket).")
        self.job_paused_until_timestamp_seconds = job_gauge(
            "job_paused_until_timestamp_seconds",
            "Unix time a timed pause ends (pause --until); 0 when not paused or paused "
            "until resumed.",
        )
        self.job_skips_pending = job_gauge(
            "job_skips_pending", "Slots of the job that `skip` chose and that are still ahead."
        )
        self.job_backfill_pending = job_gauge(
            "job_backfill_pending", "Slots of a backfill of the job not run yet (running included)."
        )
        self.job_at_pending = job_gauge(
            "job_at_pending", "One-off runs of the job queued by `at` and not yet claimed."
        )
        self.runs_skipped_total = counter(
            "runs_skipped",
            "Slots won but not run, by reason (overlap: a run of the job was still alive; "
            "late: frozen past slot + max_late before the request went out; bucket: the job "
            "needs a lease and the state bucket cannot hold one; concurrency: every slot of "
            "its shared concurrency limit stayed held).",
            ("job", "reason"),
        )
        self.runs_lost_total = counter(
            "runs_lost",
            "Runs this instance recorded as lost (their lease expired, or was never made).",
        )
        self.runs_replaced_total = counter(
            "runs_replaced",
            "Runs of this instance stopped for a newer slot (overlap: replace): the app was "
            "sent the cancel request, the run recorded failed (replaced).",
        )
        self.cancel_requests_failed_total = counter(
            "cancel_requests_failed",
            "Cancel requests (overlap: replace) the app did not answer with 2xx.",
        )
        self.runs_buffered_total = counter(
            "runs_buffered",
            "Slots this instance kept to run after the running one (overlap: buffer_one).",
        )
        # jobs[].concurrency (sidecar/run/concurrency.py): summed over the fleet and the
        # jobs sharing a key, the key's slots held now (each slot is held by one run).
        self.concurrency_slots_held = job_gauge(
            "concurrency_slots_held",
            "Slots of the job's shared concurrency limit (jobs[].concurrency) its runs "
            "hold on this instance now.",
        )
        # run_on: every (sidecar/run/everymissed.py): every live sidecar counts each
        # miss, so the fleet's number is the max over instances, not the sum.
        self.every_slots_missed_total = counter(
            "every_slots_missed",
            "Slots of a run_on: every job that an instance of it missed (no claim within "
            "max_late), as this instance judged them; max over instances. reason: stopped "
            "(it had exited cleanly: a rollout, a scale-down) or away (it died, froze, "
            "lost NATS, or how it left is not known here).",
            ("job", "reason"),
        )
        # jobs[].after (sidecar/run/chains.py): each final run of the job followed,
        # once for the fleet, by whether it fired this job's run.
        self.chain_links_total = counter(
            "chain_links",
            "Final runs of the job this one runs after: outcome fired (this instance won "
            "the chained run's claim) or not_fired (it ended otherwise than `on` asks; "
            "counted by the instance that ran it).",
            ("job", "outcome"),
        )
        self.attempts_due_total = counter(
            "attempts_due", "Further attempts this instance made due, by reason.", ("job", "reason")
        )
        self.retries_exhausted_total = counter(
            "retries_exhausted",
            "Failed or lost attempts after which no attempt was left (retry.max reached).",
        )
        self.lease_renewal_failures_total = counter(
            "lease_renewal_failures", "Run lease renewals that failed (the run went on)."
        )
        self.fleet_instances = gauge(
            "fleet_instances", "Live instances seen in the state bucket (this one included)."
        )
        self.fleet_config_mismatch = gauge(
            "fleet_config_mismatch", "1 while live instances run a job with different settings."
        )
        self.hostile_input_total = Counter(
            "hostile_input",
            "Values read from NATS that this instance refused: due_key (a due attempt that "
            "the job's schedule, retry budget and the stream do not back), backfill_key (a "
            "backfill.<job> value the backfill command would not write), value (a number "
            "out of range, e.g. an absurd slot), at_key (an entry of a one-off run that the "
            "`at` command would not have written), job (a job.<name> key of the state "
            "bucket that is not a valid job), lock_key (a lock.<job> held without the TTL "
            "a sidecar writes; conc_key: the same of a conc.<key>.<n> slot), buffer_key / "
            "stop_key (a buffer.<job> or stop.<job> key that no stored claim of the job "
            "backs), unknown_key (a key of no family the sidecar knows), result (a message on a "
            "followed job's results that is no result of it: a chain does not act on it).",
            ("what",),
            namespace=PREFIX,
            registry=registry,
        )
        for what in HOSTILE_KINDS:
            self.hostile_input_total.labels(what=what)
        self.state_bucket_ok = gauge(
            "state_bucket_ok",
            "1 while the state bucket has the settings leases need (history 1, per-message "
            "TTLs, a marker TTL); 0 while jobs that need leases are not claimed.",
        )
        self.state_bucket_checks_total = Counter(
            "state_bucket_checks",
            "Checks of the state bucket's settings (start, reconnect, change seen).",
            namespace=PREFIX,
            registry=registry,
        )
        self.state_bucket_fixed_total = Counter(
            "state_bucket_fixed",
            "Times this instance set the state bucket's history back to 1, or created the "
            "bucket again after it was deleted.",
            namespace=PREFIX,
            registry=registry,
        )
        self.nats_permission_denied_total = Counter(
            "nats_permission_denied",
            "Permissions violations the NATS server reported to this instance, by operation.",
            ("operation",),
            namespace=PREFIX,
            registry=registry,
        )
        for op in ("publish", "subscribe"):
            self.nats_permission_denied_total.labels(operation=op)
        self.stream_raised_total = Counter(
            "stream_raised",
            "Times this instance raised the stream back to what its config needs after "
            "someone lowered it.",
            namespace=PREFIX,
            registry=registry,
        )
        self.nats_connected = gauge("nats_connected", "1 while connected to NATS, else 0.")
        self.nats_reconnects_total = Counter(
            "nats_reconnects", "Reconnections to NATS.", namespace=PREFIX, registry=registry
        )
        # Telling people (sidecar/after/aftermath.py).
        self.pings_total = counter(
            "pings", "Pings sent by this instance, by kind and outcome.", ("job", "kind", "outcome")
        )
        self.notifications_total = Counter(
            "notifications",
            "Notifications this instance sent (exactly one sidecar sends each event), "
            "by event and outcome (sent, failed).",
            ("event", "outcome"),
            namespace=PREFIX,
            registry=registry,
        )
        self.runs_anomalous_total = counter(
            "runs_anomalous",
            "Runs outside the job's expect: kind short (succeeded faster than min) or long "
            "(ended slower than max).",
            ("job", "kind"),
        )
        self.runs_overdue = job_gauge(
            "runs_overdue", "Runs on this instance still running past the job's expect.max."
        )
        self.job_consecutive_failures = job_gauge(
            "job_consecutive_failures", "Consecutive failed or lost runs, fleet-wide."
        )
        self.job_auto_paused = job_gauge(
            "job_auto_paused", "1 while the job is paused by pause_after (fleet-wide)."
        )
        self.build_info = gauge("build_info", "Always 1; the version as a label.", ("version",))
        self.build_info.labels(version=__version__).set(1)
        for event in NOTIFY_EVENTS:  # at 0 from the start: a fixed set
            for outcome in ("sent", "failed"):
                self.notifications_total.labels(event=event, outcome=outcome)

    def _first_claim(self, key: tuple[str, ...]) -> None:
        """A job's first claim here (won or lost): its series that the alert rules
        count with increase() start at 0 now, so that the first failure, loss or
        exhausted retry counts (a series born at 1 has no increase), and its next
        run is shown from now on."""
        (job,) = key
        for metric in (
            self.claims_won_total,
            self.claims_lost_total,
            self.runs_lost_total,
            self.retries_exhausted_total,
        ):
            metric.add(job)
        self.runs_total.add(job, "failed")
        self.job_next_run_timestamp_seconds.labels(job=job).shown = True

    def _soon(self, next_run: float) -> bool:
        return 0 < next_run <= self.wall() + NEXT_RUN_HORIZON

    def _next_run_shown(
        self, items: list[tuple[tuple[str, ...], ShownGauge]]
    ) -> list[tuple[tuple[str, ...], ShownGauge]]:
        limit = self.wall() + NEXT_RUN_HORIZON
        out = []
        for key, series in items:
            if not series.shown and 0 < series.value <= limit:
                series.shown = True  # the job has something to say from now on
            if series.shown:
                out.append((key, series))
        return out
