"""Prometheus metrics of SPEC.md, on a registry that the caller injects.

No global registry: tests create as many sidecars in one process as they like
and read values with ``registry.get_sample_value``. Every name is prefixed
``anarchon_``; the only labels are ``job`` (bounded by the config), ``status``
and ``reason`` (fixed sets) and ``version``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from sidecar import __version__

PREFIX = "anarchon"

# Claims are one JetStream round trip: sub-millisecond to seconds.
ACK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Trigger requests: milliseconds to the 30 s default timeout and beyond.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# Start delay: the drawn jitter (default up to 2 s) plus the claim.
DELAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60)

SKIP_REASONS = ("late", "disconnected", "shutdown")

# The ``_created`` series double every counter for no use here.
disable_created_metrics()  # type: ignore[no-untyped-call]
RUN_STATUSES = ("succeeded", "failed")


class Metrics:
    """Every metric of SPEC.md; attribute names are the metric names without prefix."""

    def __init__(self, registry: CollectorRegistry, jobs: tuple[str, ...] = ()) -> None:
        self.registry = registry
        job = ("job",)

        def counter(name: str, doc: str, labels: tuple[str, ...] = job) -> Counter:
            return Counter(name, doc, labels, namespace=PREFIX, registry=registry)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, labels, namespace=PREFIX, registry=registry)

        self.claims_won_total = counter("claims_won", "Claims this instance won.")
        self.claims_lost_total = counter("claims_lost", "Claims another instance won.")
        self.claim_duplicate_acks_total = counter(
            "claim_duplicate_acks", "Claim acks flagged duplicate (own retries included)."
        )
        self.claims_skipped_total = counter(
            "claims_skipped", "Slots not claimed, by reason.", ("job", "reason")
        )
        self.claim_errors_total = counter(
            "claim_errors", "Claims that got no definite answer (timeout, no stream)."
        )
        self.claim_ack_seconds = Histogram(
            "claim_ack_seconds",
            "Time from publishing a claim to its ack.",
            job,
            namespace=PREFIX,
            registry=registry,
            buckets=ACK_BUCKETS,
        )
        self.runs_total = counter("runs", "Finished runs, by status.", ("job", "status"))
        self.run_duration_seconds = Histogram(
            "run_duration_seconds",
            "Time of the trigger request to the app.",
            job,
            namespace=PREFIX,
            registry=registry,
            buckets=RUN_BUCKETS,
        )
        self.run_start_delay_seconds = Histogram(
            "run_start_delay_seconds",
            "Time from the slot's scheduled instant to the trigger request's start.",
            job,
            namespace=PREFIX,
            registry=registry,
            buckets=DELAY_BUCKETS,
        )
        self.runs_in_progress = gauge("runs_in_progress", "Trigger requests running now.", job)
        self.job_next_run_timestamp_seconds = gauge(
            "job_next_run_timestamp_seconds", "Unix time of the job's next slot.", job
        )
        self.job_last_success_timestamp_seconds = gauge(
            "job_last_success_timestamp_seconds",
            "Unix time at which the last successful run on this instance finished.",
            job,
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
        self.nats_connected = gauge("nats_connected", "1 while connected to NATS, else 0.")
        self.nats_reconnects_total = Counter(
            "nats_reconnects", "Reconnections to NATS.", namespace=PREFIX, registry=registry
        )
        self.build_info = gauge("build_info", "Always 1; the version as a label.", ("version",))
        self.build_info.labels(version=__version__).set(1)
        for name in jobs:
            self.add_job(name)

    def add_job(self, job: str) -> None:
        """Create the job's labelled series at zero so that rates and alerts see them."""
        for c in (
            self.claims_won_total,
            self.claims_lost_total,
            self.claim_duplicate_acks_total,
            self.claim_errors_total,
        ):
            c.labels(job=job)
        for reason in SKIP_REASONS:
            self.claims_skipped_total.labels(job=job, reason=reason)
        for status in RUN_STATUSES:
            self.runs_total.labels(job=job, status=status)
        self.claim_ack_seconds.labels(job=job)
        self.run_duration_seconds.labels(job=job)
        self.run_start_delay_seconds.labels(job=job)
        self.runs_in_progress.labels(job=job)
        self.job_next_run_timestamp_seconds.labels(job=job)
        self.job_last_success_timestamp_seconds.labels(job=job)
