"""The instants at the ends of the range are HTTP 400 on the page's API, never a
dropped connection: the page's pause and skip overflowed once (the parsing
itself: tests/config/test_instants.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.admin.test_page import TOKEN, request
from tests.support import NatsServer, RecordingApp, base, job, sidecars, wait_for

EDGES = ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"]
LAST = "9999-12-31T23:59:59.999Z"  # the last instant in range: accepted


def test_edge_times_are_400_on_the_page_api(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"alice:{TOKEN}\n")
    config = base(nats_server, http_app, [job("yearly", schedule="0 0 1 1 *", jitter="1s")])
    config["admin"] = {"token_file": str(token_file)}
    good = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    with sidecars(tmp_path, [("s0", config, {})]) as procs:
        for until in EDGES:
            body = json.dumps({"until": until}).encode()
            code, _, answer = request(procs[0], "/api/v1/jobs/yearly/pause", "POST", body, good)
            assert code == 400, answer
            assert b"out of range" in answer
        body = json.dumps({"until": LAST}).encode()
        code, _, answer = request(procs[0], "/api/v1/jobs/yearly/pause", "POST", body, good)
        # Float seconds hold that far ahead to some 30 us: the last millisecond may show .998.
        assert code == 200, answer
        assert json.loads(answer)["pause"]["until"].startswith("9999-12-31T23:59:59.99"), answer
        codes = []
        for _ in range(9):
            body = json.dumps({"count": 1000}).encode()
            code, _, answer = request(procs[0], "/api/v1/jobs/yearly/skip", "POST", body, good)
            codes.append(code)
            if code != 200:
                break
        assert codes[-1] == 400 and set(codes[:-1]) == {200}, (codes, answer)
        assert b"fewer than 1000 runs" in answer
        wait_for(lambda: procs[0].get("/readyz")[0] == 200, 5, what="still ready")
    assert "OverflowError" not in procs[0].log() and "Traceback" not in procs[0].log()
