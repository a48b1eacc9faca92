"""Reliability scenarios: the sidecar under faults, with figures we publish.

Each scenario runs real nats-servers, real apps and real sidecar processes,
asserts its figures and records them (see ``conftest.py``) in
``bench/results/reliability.json``; ``python -m tests.reliability.report``
renders the table of ``docs/RELIABILITY.md`` from it.
"""
