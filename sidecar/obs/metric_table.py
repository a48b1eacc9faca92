"""The table of the metrics of docs/METRICS.md: each one's kind, name, help, labels
and buckets, in the order /metrics writes them. ``sidecar.obs.metrics`` makes them.

The names, help texts, labels and buckets are what dashboards, the alert rules
(deploy/prometheus) and docs/METRICS.md read: change them as a wire change
(CHANGELOG.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

from sidecar.obs.metric_series import QuietAtOne, ShownGauge

PREFIX = "anarchon"
JOB = ("job",)

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
NOTIFY_EVENTS = ("failing", "recovered", "lost", "auto_paused", "anomaly")

# counter, gauge: prometheus_client's, for the sidecar as a whole (few series).
# job_counter, job_gauge, job_histogram: the lean per-job series (metric_series),
# labelled ``job`` first; a job_gauge is a ShownGauge (exposed once it moved), a
# job_histogram has a series of its own only for the jobs metrics.per_job_histograms
# lists. next_run: the job gauge of the next slot's time (NextRun).
Kind = Literal["counter", "gauge", "job_counter", "job_gauge", "job_histogram", "next_run"]


class Spec(NamedTuple):
    """One metric: exposed as ``anarchon_<name>``, made as the attribute ``Metrics.<name>``."""

    kind: Kind
    name: str  # counters end with _total, as exposed
    doc: str
    labels: tuple[str, ...] = ()  # the job kinds: JOB unless given
    buckets: tuple[float, ...] = ()  # job_histogram
    series: Callable[[], ShownGauge] = ShownGauge  # job_gauge: its quiet value's class
    at_start: tuple[tuple[str, ...], ...] = ()  # counter: label sets exposed at 0 from the start
    first_claim: bool = False  # job_counter: a job's first series is its first claim here

    @property
    def labelnames(self) -> tuple[str, ...]:
        return self.labels or (JOB if self.kind.startswith(("job_", "next_")) else ())


# Every metric, in the order /metrics writes them (the registry's: registration).
METRICS: tuple[Spec, ...] = (
    Spec("job_counter", "claims_won_total", "Claims this instance won.", first_claim=True),
    Spec("job_counter", "claims_lost_total", "Claims another instance won.", first_claim=True),
    # Per sidecar: per job it counted what claims_lost does (the losers' acks).
    Spec(
        "counter",
        "claim_duplicate_acks_total",
        "Claim acks flagged duplicate (own retries included).",
    ),
    Spec("job_counter", "claims_skipped_total", "Slots not claimed, by reason.", ("job", "reason")),
    Spec(
        "job_counter",
        "claim_errors_total",
        "Claims that got no definite answer (timeout, no stream).",
    ),
    # claim.candidates (sidecar/fleet/candidates.py): slots left to their candidates.
    Spec(
        "job_counter",
        "claims_deferred_total",
        "Slots this instance left to their claim candidates, by outcome.",
        ("job", "outcome"),
    ),
    Spec(
        "job_histogram",
        "claim_ack_seconds",
        "Time from publishing a claim to its ack.",
        buckets=ACK_BUCKETS,
    ),
    Spec("job_counter", "runs_total", "Finished runs, by status.", ("job", "status")),
    Spec(
        "job_histogram",
        "run_duration_seconds",
        "Time of the trigger request to the app.",
        buckets=RUN_BUCKETS,
    ),
    Spec(
        "job_histogram",
        "run_start_delay_seconds",
        "Time from the slot's scheduled instant to the trigger request's start.",
        buckets=DELAY_BUCKETS,
    ),
    Spec("job_gauge", "runs_in_progress", "Trigger requests running now."),
    Spec("next_run", "job_next_run_timestamp_seconds", "Unix time of the job's next slot."),
    Spec(
        "job_gauge",
        "job_last_success_timestamp_seconds",
        "Unix time at which the last successful run on this instance finished.",
    ),
    Spec("gauge", "stream_messages", "Messages in the stream."),
    Spec("gauge", "stream_bytes", "Bytes in the stream."),
    Spec(
        "gauge",
        "stream_history_size",
        "Per-subject message limit of the stream (effective history).",
    ),
    Spec("gauge", "stream_duplicate_window_seconds", "Duplicate window of the stream."),
    Spec("gauge", "stream_replicas", "Replicas of the stream."),
    Spec(
        "job_gauge",
        "stream_covers_job",
        "1 while the stream's duplicate window and history hold the job's claims for "
        "jitter + max_late; 0 while its slots are skipped (reason stream). Exposed "
        "once the stream did not hold them.",
        series=QuietAtOne,
    ),
    Spec("job_gauge", "job_paused", "1 while the job is paused (state bucket)."),
    Spec(
        "job_gauge",
        "job_paused_until_timestamp_seconds",
        "Unix time a timed pause ends (pause --until); 0 when not paused or paused until resumed.",
    ),
    Spec(
        "job_gauge",
        "job_skips_pending",
        "Slots of the job that `skip` chose and that are still ahead.",
    ),
    Spec(
        "job_gauge",
        "job_backfill_pending",
        "Slots of a backfill of the job not run yet (running included).",
    ),
    Spec(
        "job_gauge",
        "job_at_pending",
        "One-off runs of the job queued by `at` and not yet claimed.",
    ),
    Spec(
        "job_counter",
        "runs_skipped_total",
        "Slots won but not run, by reason (overlap: a run of the job was still alive; "
        "late: frozen past slot + max_late before the request went out; bucket: the job "
        "needs a lease and the state bucket cannot hold one; concurrency: every slot of "
        "its shared concurrency limit stayed held).",
        ("job", "reason"),
    ),
    Spec(
        "job_counter",
        "runs_lost_total",
        "Runs this instance recorded as lost (their lease expired, or was never made).",
    ),
    Spec(
        "job_counter",
        "runs_replaced_total",
        "Runs of this instance stopped for a newer slot (overlap: replace): the app was "
        "sent the cancel request, the run recorded failed (replaced).",
    ),
    Spec(
        "job_counter",
        "cancel_requests_failed_total",
        "Cancel requests (overlap: replace) the app did not answer with 2xx.",
    ),
    Spec(
        "job_counter",
        "runs_buffered_total",
        "Slots this instance kept to run after the running one (overlap: buffer_one).",
    ),
    # jobs[].concurrency (sidecar/run/concurrency.py): summed over the fleet and the
    # jobs sharing a key, the key's slots held now (each slot is held by one run).
    Spec(
        "job_gauge",
        "concurrency_slots_held",
        "Slots of the job's shared concurrency limit (jobs[].concurrency) its runs "
        "hold on this instance now.",
    ),
    # run_on: every (sidecar/run/everymissed.py): every live sidecar counts each
    # miss, so the fleet's number is the max over instances, not the sum.
    Spec(
        "job_counter",
        "every_slots_missed_total",
        "Slots of a run_on: every job that an instance of it missed (no claim within "
        "max_late), as this instance judged them; max over instances. reason: stopped "
        "(it had exited cleanly: a rollout, a scale-down) or away (it died, froze, "
        "lost NATS, or how it left is not known here).",
        ("job", "reason"),
    ),
    # jobs[].after (sidecar/run/chains.py): each final run of the job followed,
    # once for the fleet, by whether it fired this job's run.
    Spec(
        "job_counter",
        "chain_links_total",
        "Final runs of the job this one runs after: outcome fired (this instance won "
        "the chained run's claim) or not_fired (it ended otherwise than `on` asks; "
        "counted by the instance that ran it).",
        ("job", "outcome"),
    ),
    Spec(
        "job_counter",
        "attempts_due_total",
        "Further attempts this instance made due, by reason.",
        ("job", "reason"),
    ),
    Spec(
        "job_counter",
        "retries_exhausted_total",
        "Failed or lost attempts after which no attempt was left (retry.max reached).",
    ),
    Spec(
        "job_counter",
        "lease_renewal_failures_total",
        "Run lease renewals that failed (the run went on).",
    ),
    Spec(
        "gauge",
        "fleet_instances",
        "Live instances seen in the state bucket (this one included).",
    ),
    Spec(
        "gauge",
        "fleet_config_mismatch",
        "1 while live instances run a job with different settings.",
    ),
    Spec(
        "counter",
        "hostile_input_total",
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
        at_start=tuple((what,) for what in HOSTILE_KINDS),
    ),
    Spec(
        "gauge",
        "state_bucket_ok",
        "1 while the state bucket has the settings leases need (history 1, per-message "
        "TTLs, a marker TTL); 0 while jobs that need leases are not claimed.",
    ),
    Spec(
        "counter",
        "state_bucket_checks_total",
        "Checks of the state bucket's settings (start, reconnect, change seen).",
    ),
    Spec(
        "counter",
        "state_bucket_fixed_total",
        "Times this instance set the state bucket's history back to 1, or created the "
        "bucket again after it was deleted.",
    ),
    Spec(
        "counter",
        "nats_permission_denied_total",
        "Permissions violations the NATS server reported to this instance, by operation.",
        ("operation",),
        at_start=(("publish",), ("subscribe",)),
    ),
    Spec(
        "counter",
        "stream_raised_total",
        "Times this instance raised the stream back to what its config needs after "
        "someone lowered it.",
    ),
    Spec("gauge", "nats_connected", "1 while connected to NATS, else 0."),
    Spec("counter", "nats_reconnects_total", "Reconnections to NATS."),
    # Telling people (sidecar/after/aftermath.py).
    Spec(
        "job_counter",
        "pings_total",
        "Pings sent by this instance, by kind and outcome.",
        ("job", "kind", "outcome"),
    ),
    Spec(
        "counter",
        "notifications_total",
        "Notifications this instance sent (exactly one sidecar sends each event), "
        "by event and outcome (sent, failed).",
        ("event", "outcome"),
        # At 0 from the start: a fixed set.
        at_start=tuple((e, o) for e in NOTIFY_EVENTS for o in ("sent", "failed")),
    ),
    Spec(
        "job_counter",
        "runs_anomalous_total",
        "Runs outside the job's expect: kind short (succeeded faster than min) or long "
        "(ended slower than max).",
        ("job", "kind"),
    ),
    Spec(
        "job_gauge",
        "runs_overdue",
        "Runs on this instance still running past the job's expect.max.",
    ),
    Spec("job_gauge", "job_consecutive_failures", "Consecutive failed or lost runs, fleet-wide."),
    Spec("job_gauge", "job_auto_paused", "1 while the job is paused by pause_after (fleet-wide)."),
    Spec("gauge", "build_info", "Always 1; the version as a label.", ("version",)),
)
