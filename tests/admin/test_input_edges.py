"""Reasons and ids through the fleet page's API on three sidecars (issue 48): a reason
longer than 200 characters or one with control or bidi characters, and a job id
of bidi overrides, are refused (400 naming the limit), nothing done, nothing kept."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    base,
    cli_config,
    job,
    run_cli,
    sidecars,
)

TOKEN = "s3cret-token-for-input-edges-0123"
RTL = "\u202e"  # RIGHT-TO-LEFT OVERRIDE


def post(sc: Sidecar, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(sc.base_url + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_api_refuses_long_or_hidden_reasons_and_ids(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"alice:{TOKEN}\n")
    config = base(nats_server, http_app, [job("a", schedule="0 0 1 1 *")])
    config["admin"] = {"token_file": str(token_file)}
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        acts = [
            ("pause", {"reason": "x" * 201}, "at most 200 characters, got 201"),
            ("pause", {"reason": f"db{RTL}noitargim"}, "U+202E"),
            ("skip", {"reason": "two\nlines"}, "U+000A"),
            ("at", {"time": "2h", "reason": "x" * 1000}, "at most 200 characters, got 1000"),
            ("at", {"time": "\u0663\u0660m"}, "neither an RFC 3339 time"),  # Arabic-Indic 30
            ("skip", {"count": "\u0663"}, "count: a whole number"),
            ("pause", {"until": "9999-12-31T23:59:59.999Z", "reason": "ok"}, None),
        ]
        for i, (action, form, fragment) in enumerate(acts):
            code, answer = post(procs[i % 3], f"/api/v1/jobs/a/{action}", form)
            if fragment is None:  # the last instant the sidecar names: a pause may last
                assert code == 200, (action, answer)
                post(procs[i % 3], "/api/v1/jobs/a/resume", {})
                continue
            assert code == 400, (action, answer)
            assert fragment in answer["error"], (action, answer)
            assert answer["done"] is False, answer
        # Nothing was done: not paused, no one-off queued, no skip.
        status = json.loads(run_cli("status", "-c", cfg, "--json").stdout)
        row = next(j for j in status["jobs"] if j["name"] == "a")
        assert not row.get("paused") and not row.get("at_pending"), row
        # A job of the state bucket with an id of bidi overrides: refused, not stored.
        dyn = {"name": "dyn", "schedule": "0 0 1 1 *", "id": f"tenant{RTL}7"}
        code, answer = post(procs[1], "/api/v1/bucket-jobs/dyn/add", dyn)
        assert code == 400 and answer["key"] == "job.id", answer
        code, answer = post(procs[2], "/api/v1/bucket-jobs/dyn/remove", {"id": f"x{RTL}"})
        assert code == 400 and answer["key"] == "id", answer
        listed = run_cli("job", "list", "-c", cfg)
        assert "dyn" not in listed.stdout, listed.stdout
