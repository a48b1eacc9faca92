"""The instants at the ends of the range are usage errors on the command line (exit 2,
no traceback): ``pause --until``, ``backfill --from/--to`` and the eighth
``skip --count 1000`` of a yearly job overflowed once (the parsing itself:
tests/config/test_instants.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support import NatsServer, RecordingApp, base, cli_config, job, run_cli

EDGES = ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"]
LAST = "9999-12-31T23:59:59.999Z"  # the last instant in range: accepted


def test_edge_times_are_usage_errors_on_the_command_line(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("yearly", schedule="0 0 1 1 *")])
    cfg = cli_config(tmp_path, config)
    for until in EDGES:
        done = run_cli("pause", "yearly", "-c", cfg, "--until", until)
        assert done.returncode == 2, done.stderr
        assert "out of range" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("pause", "yearly", "-c", cfg, "--until", LAST)
    assert done.returncode == 0 and "9999-12-31" in done.stdout, done.stderr
    for edge in EDGES:
        for args in (("--from", edge, "--to", "2026-01-01T00:00:00Z"), ("--from", edge)):
            done = run_cli("backfill", "yearly", "-c", cfg, *args, "--to", edge)
            assert done.returncode == 2, done.stderr
            assert "Traceback" not in done.stderr
    # About 8,000 years of a yearly job are left: the eighth 1,000 does not fit.
    codes = []
    for _ in range(9):
        done = run_cli("skip", "yearly", "-c", cfg, "--count", "1000")
        assert "Traceback" not in done.stderr, done.stderr
        codes.append(done.returncode)
        if done.returncode:
            break
    assert codes[-1] == 2 and set(codes[:-1]) == {0}, codes
    assert "fewer than 1000 runs" in done.stderr
