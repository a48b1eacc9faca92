"""What anyone can make a sidecar say is said once, not once per request or retry.

A malformed ``admin.token_file`` was warned about on every POST (anyone who
reaches the admin port could flood the log); now once per change of the
file. A NATS user without the permissions was told twice and then buried
under ``cannot open state bucket ... TimeoutError()`` warnings; now one line
names the subject and the permissions file, /readyz stays 503 and the metric
counts, and nothing more is said until something changes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.admin.test_page import TOKEN, request
from tests.support import NatsServer, RecordingApp, Sidecar, base, job, sidecars, wait_for


def test_a_malformed_token_file_is_warned_about_once_per_change(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"alice:{TOKEN}\n")
    config = base(nats_server, http_app, [job("a", schedule="0 0 1 1 *")])
    config["admin"] = {"token_file": str(token_file)}
    good = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    body = json.dumps({"reason": "x"}).encode()

    def post_many(proc: Sidecar, n: int) -> set[int]:
        codes = set()
        for _ in range(n):
            codes.add(request(proc, "/api/v1/jobs/a/pause", "POST", body, good)[0])
            codes.add(request(proc, "/api/v1/jobs/a/resume", "POST", b"", good)[0])
        return codes

    def warnings(proc: Sidecar) -> list[str]:
        return [x for x in proc.log().splitlines() if "admin.token_file: keeping" in x]

    with sidecars(tmp_path, [("s0", config, {})]) as procs:
        token_file.write_text("short\n")  # malformed: the tokens read before are kept
        assert post_many(procs[0], 20) <= {200, 409}
        wait_for(lambda: warnings(procs[0]), 5, what="the warning")
        assert len(warnings(procs[0])) == 1, warnings(procs[0])
        token_file.write_text("a b:0123456789abcdef0\n")  # another change, still malformed
        assert post_many(procs[0], 20) <= {200, 409}
        wait_for(lambda: len(warnings(procs[0])) == 2, 5, what="the second warning")
        token_file.write_text(f"alice:{TOKEN}\nbob:another-token-of-sixteen+\n")
        assert post_many(procs[0], 5) <= {200, 409}
        token_file.unlink()  # gone: said once too
        assert post_many(procs[0], 20) <= {200, 409}
        time.sleep(0.5)
        log = procs[0].log()
    assert len([x for x in log.splitlines() if "admin.token_file: keeping" in x]) == 3, log
    assert "admin.token_file changed: 2 token(s)" in log
    assert TOKEN not in log


def test_missing_permissions_are_said_once_naming_the_subject_and_the_file(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    # The user may publish claims and results, and nothing of the JetStream API.
    nats_server.stop()
    nats_server.extra_conf = (
        "authorization { users = [{user: anarchon, password: pw, permissions: {"
        ' publish: {allow: ["cron.>", "_INBOX.>"]}, subscribe: {allow: [">"]}}}] }\n'
    )
    nats_server.start()
    config = base(nats_server, http_app, [job("a")])
    config["nats"]["user"] = "anarchon"
    proc = Sidecar(tmp_path, "s0", config, {"ANARCHON_NATS_PASSWORD": "pw"}).start()
    try:

        def refused() -> float:
            try:
                return (
                    proc.metric("anarchon_nats_permission_denied_total", {"operation": "publish"})
                    or 0
                )
            except OSError:
                return 0

        # Both the stream and the bucket refused, each tried again and again (20 s).
        wait_for(lambda: refused() >= 6, 40, what="the refusals repeated")
        code, body = proc.get("/readyz")
    finally:
        proc.terminate()
    assert code == 503, body
    assert "permissions violation" in body and "deploy/nats/permissions.conf" in body, body
    assert "$JS.API.STREAM.INFO." in body, body
    log = proc.log()
    said = [x for x in log.splitlines() if "NATS refused" in x]
    assert len(said) == 1, said
    assert "$JS.API.STREAM.INFO." in said[0] and "deploy/nats/permissions.conf" in said[0]
    for noise in ("cannot open state bucket", "stream not available", "TimeoutError"):
        assert noise not in log, (noise, log)
    # The job's slots kept from their claim: said once for the reason, not per slot
    # (nor once a minute: tests/run/test_skip_said.py moves a clock past that).
    skipped = [x for x in log.splitlines() if "job a slot " in x and " skipped: " in x]
    assert len(skipped) <= 1, skipped
