"""What `run` imports at start: what a default config does not use yet stays unloaded."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, sidecar_env

# Loaded by the fleet page's first request (sidecar/admin/lazy_page.py), by
# the one-shot commands, or by the first key of their kind in the state bucket
# (backfills, one-off runs: sidecar/run/onkey.py), or by the first due key, failed
# run of a job with retry.max or lost run to rerun (due attempts: sidecar/run/onkey.py
# DueOnFirstUse), or by the first slot caught up (the history's reader: sidecar/run/
# catchup.py), or by the first job that
# uses them (overlap: replace or buffer_one, max_runs), or by the first command
# other than `run` asked for (sidecar/cli/main.py LATER), or by the first job key
# of the state bucket (sidecar/admin/jobkeys.py), or by the first ping, notification,
# span or signed request (sidecar/after/aftermath.py, sidecar/cli/daemon.py
# signer_of), or by the first calendar file or the first ``calendars:`` entry
# (sidecar/config/calendars.py), never by the start of `run`.
NOT_AT_START = (
    "sidecar.admin.api",
    "sidecar.admin.page",
    "sidecar.admin.jobpage",
    "sidecar.admin.markup",
    "sidecar.admin.pagecache",
    "sidecar.admin.objects",
    "sidecar.admin.recent",
    "sidecar.admin.live",
    "sidecar.admin.sessions",
    "sidecar.admin.actions",
    "sidecar.admin.jobacts",
    "sidecar.ops.streamops",
    "sidecar.ops.skipops",
    "sidecar.admin.atacts",
    "sidecar.admin.skipwrite",
    "sidecar.ops.atops",
    "sidecar.ops.streamops",
    "sidecar.config.instants",
    "sidecar.cli.status_text",
    "sidecar.obs.otlp",
    "sidecar.run.backfill",
    "sidecar.run.backfillcheck",
    "sidecar.run.atruns",
    "sidecar.run.atqueue",
    "sidecar.run.overlap",
    "sidecar.run.keptslots",
    "sidecar.run.stoprequests",
    "sidecar.run.overlapcheck",
    "sidecar.run.runcap",
    "sidecar.run.retries",
    "sidecar.run.duecheck",
    "sidecar.store.runs",
    "sidecar.cli.commands",
    "sidecar.cli.calendar_commands",
    "sidecar.cli.job_commands",
    "sidecar.cli.output",
    "sidecar.cli.check_text",
    "sidecar.cli.calendar_text",
    "sidecar.admin.bucket_jobs",
    "sidecar.admin.jobcheck",
    "sidecar.admin.jobwrite",
    "sidecar.ops.jobops",
    "sidecar.obs.outbound",
    "sidecar.obs.tracing",
    "sidecar.after.health",
    "sidecar.after.signing",
    "sidecar.when.ics",
    "sidecar.when.shared",
)
# Outside the sidecar: loaded by the first text that needs them (sidecar/config/
# fields.py shown_text: unicodedata for a character beyond ASCII).
NOT_AT_START_ELSEWHERE = ("unicodedata",)

# What `run` imports (cli/main.py, then cli/daemon.py) and makes before it
# connects: the daemon of a default config (the page on) with 100 jobs.
PROGRAM = """
import json, sys
# As a plain install has it (bench/runtime.py): no aiohttp, which nats-py would
# import (and unicodedata with it) from the dev extra.
sys.modules["aiohttp"] = None
import sidecar.cli.main
from sidecar.cli.daemon import Daemon
from sidecar.config.load import Secrets, parse_config

jobs = [{"name": f"job-{i}", "schedule": f"{i % 60} * * * *"} for i in range(100)]
config = parse_config({"nats": {"servers": "nats://127.0.0.1:1"}, "jobs": jobs}, {})
daemon = Daemon(config, Secrets())
assert config.admin.page and daemon.page is not None and daemon.admin.app is daemon.page
# What Daemon.run makes for such a config (sidecar/run/wiring.py, the trigger's signer).
from sidecar.after.aftermath import Aftermath
from sidecar.cli.daemon import signer_of
from sidecar.core.clock import Clock
Aftermath(config, None, Clock(), lambda: None)
assert signer_of(config, Secrets()) is None
print(json.dumps(sorted(sys.modules)))
"""


def test_run_leaves_the_page_and_one_shot_code_unimported_until_used() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        env=sidecar_env(),
        cwd=ROOT,
        timeout=60,
        check=True,
    ).stdout
    loaded = set(json.loads(out))
    assert "sidecar.cli.daemon" in loaded and "sidecar.admin.lazy_page" in loaded
    # Each name still names a module: a renamed one fails here, not passes unseen.
    assert [m for m in NOT_AT_START if importlib.util.find_spec(m) is None] == []
    assert sorted(loaded & set(NOT_AT_START)) == []
    assert sorted(loaded & set(NOT_AT_START_ELSEWHERE)) == []


# `run -c F` as the Dockerfile, the chart and the Ansible role start it, up to
# its config's check (the file is missing: exit 2).
PARSE = """
import sys
from sidecar.cli.main import main
try:
    main(["run", *sys.argv[1:]], standalone_mode=False)
except SystemExit as exc:
    print(exc.code, "difflib" in sys.modules)
"""


def test_run_dash_c_does_not_load_clicks_guesses_and_a_typo_still_gets_one(tmp_path: Path) -> None:
    def python(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            env=sidecar_env(),
            cwd=ROOT,
            timeout=60,
        )

    missing = str(tmp_path / "missing.yaml")
    for args in (["-c", missing], [f"-c{missing}"], [f"--config={missing}"]):
        parsed = python("-c", PARSE, *args)
        assert parsed.stdout.split() == ["2", "False"], (args, parsed)
        assert "missing.yaml: no such file" in parsed.stderr, args
    typo = python("-m", "sidecar", "run", "--confg", "x.yaml")
    assert typo.returncode == 2
    assert "No such option '--confg'. Did you mean '--config'?" in typo.stderr
    unknown = python("-m", "sidecar", "run", "-x")
    assert unknown.returncode == 2 and "No such option '-x'." in unknown.stderr
