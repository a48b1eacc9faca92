"""Every input edge of the command line a clean error (issue 48): exit 2, a sentence
naming the limit, no traceback, before anything is connected to or written."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support import run_cli, write_config

ARABIC_30 = "\u0663\u0660"  # ٣٠: int() and \d read it as 30


def _config(tmp_path: Path) -> str:
    config = {
        "instance_id": "cli",
        "nats": {"servers": "nats://127.0.0.1:1"},  # nothing listens: never reached
        "target": {"url": "http://127.0.0.1:1"},
        "jobs": [{"name": "J", "schedule": "0 * * * *"}],
    }
    return str(write_config(tmp_path / "cli.yaml", config))


def _all(
    cases: list[tuple[list[str], str]],
) -> list[tuple[list[str], str, subprocess.CompletedProcess[str]]]:
    with ThreadPoolExecutor(4) as pool:
        done = [pool.submit(run_cli, *args) for args, _ in cases]
        return [
            (args, fragment, f.result()) for (args, fragment), f in zip(cases, done, strict=True)
        ]


def _usage_error(args: list[str], fragment: str, done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    assert fragment in done.stderr, (args, done.stderr)
    assert "Traceback" not in done.stderr, (args, done.stderr)


def test_times_out_of_range_exit_2_naming_the_limit(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    cases = [
        # The last instant the sidecar names: the schedule has no slot after it (it
        # was a ScheduleError traceback, exit 1).
        (["at", "J", "-c", cfg, "9999-12-31T23:59:59.999Z"], "more than 366 days ahead"),
        (["at", "J", "-c", cfg, "10000-01-01T00:00:00Z"], "9999-12-31T23:59:59.999Z"),
        (["at", "J", "-c", cfg, "876000h"], "at most 87600h"),
        (["pause", "J", "-c", cfg, "--until", "876000h"], "at most 87600h"),
        (["pause", "J", "-c", cfg, "--until", "0001-01-01T00:00:00+14:00"], "out of range"),
        (["backfill", "J", "-c", cfg, "--from", "876000h"], "at most 87600h"),
        (["backfill", "J", "-c", cfg, "--from", "1969-12-31T00:00:00Z"], "out of range"),
        (["backfill", "J", "-c", cfg, "--from", "2h", "--to", "9999-12-31T23:59:59Z"], "future"),
    ]
    for args, fragment, done in _all(cases):
        _usage_error(args, fragment, done)


def test_durations_and_times_take_ascii_digits_only(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    neither = "neither an RFC 3339 time"
    cases = [
        # `at J` with Arabic-Indic 30m queued a run 30 minutes ahead.
        (["at", "J", "-c", cfg, f"{ARABIC_30}m"], neither),
        (["at", "J", "-c", cfg, f"+{ARABIC_30}m"], neither),
        (["pause", "J", "-c", cfg, "--until", f"{ARABIC_30}m"], neither),
        (["backfill", "J", "-c", cfg, "--from", f"{ARABIC_30}m"], neither),
        (["run-now", "J", "-c", cfg, "--timeout", f"{ARABIC_30}s"], "not a duration"),
        (["run-now", "J", "-c", cfg, "--timeout", ARABIC_30], "not a duration"),
        # Counts too: click's int() read them.
        (["skip", "J", "-c", cfg, "--count", "\u0663"], "whole number in ASCII digits"),
        (["history", "J", "-c", cfg, "--limit", ARABIC_30], "whole number in ASCII digits"),
    ]
    for args, fragment, done in _all(cases):
        _usage_error(args, fragment, done)


def test_files_are_read_up_to_a_cap(tmp_path: Path) -> None:
    """`job add /dev/zero` read for ever (and so did a config or a secret file there)."""
    cfg = _config(tmp_path)
    secret = {
        "nats": {"servers": "nats://127.0.0.1:1", "password_file": "/dev/zero", "user": "u"},
        "target": {"url": "http://127.0.0.1:1"},
        "jobs": [{"name": "J", "schedule": "0 * * * *"}],
    }
    secret_cfg = str(write_config(tmp_path / "secret.yaml", secret))
    cases = [
        (["job", "add", "/dev/zero", "-c", cfg], "/dev/zero: larger than 64 KiB"),
        (["job", "update", "/dev/zero", "-c", cfg], "/dev/zero: larger than 64 KiB"),
        (["check", "-c", "/dev/zero"], "/dev/zero: larger than 16 MiB"),
        (["check", "-c", secret_cfg], "nats.password_file: /dev/zero: larger than 1 MiB"),
    ]
    for args, fragment, done in _all(cases):
        _usage_error(args, fragment, done)
    # Standard input too: one byte past the cap is refused, whatever follows.
    piped = run_cli("job", "add", "-", "-c", cfg, input="#" * (64 << 10) + "\n", timeout=30)
    _usage_error(["job", "add", "-"], "standard input: larger than 64 KiB", piped)


RTL = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: "a<RLO>lave" reads "aeval"


def test_reasons_ids_and_names_are_bounded(tmp_path: Path) -> None:
    """`--reason` took 100 kB; an id of bidi overrides was stored, then shown."""
    cfg = _config(tmp_path)
    job = tmp_path / "job.yaml"
    job.write_text("name: dyn\nschedule: '0 * * * *'\n")
    long = "x" * 201
    cases = [
        (["pause", "J", "-c", cfg, "--reason", long], "at most 200 characters, got 201"),
        (["skip", "J", "-c", cfg, "--reason", long], "at most 200 characters"),
        (["at", "J", "-c", cfg, "2h", "--reason", "x" * 100_000], "at most 200 characters"),
        (["at", "J", "-c", cfg, "2h", "--reason", f"ok{RTL}kcab"], "U+202E"),
        (["pause", "J", "-c", cfg, "--reason", "two\nlines"], "U+000A"),
        (["job", "add", str(job), "-c", cfg, "--id", f"t{RTL}1"], "job.id: no control, bidi"),
        (["job", "add", str(job), "-c", cfg, "--id", "i" * 201], "job.id"),
        (["job", "remove", "dyn", "-c", cfg, "--id", f"t{RTL}1"], "--id: no control, bidi"),
        (["job", "remove", f"d{RTL}yn", "-c", cfg], "is not a job name"),
        (["history", f"J{RTL}", "-c", cfg], "\\u202e"),  # named, escaped: not reordered
    ]
    for args, fragment, done in _all(cases):
        _usage_error(args, fragment, done)
        assert RTL not in done.stderr, (args, done.stderr)
