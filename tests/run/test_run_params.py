"""Run parameters on the wire: the rendered request is the one sent and signed.

One Trigger against a raw recording server (the request target exactly as
sent), and three real sidecar processes on a real nats-server calling a real
HTTP app (tests/receivers.py), which checks every slot came once with its own
run id and slot in the path, query, a header and the JSON body, and that the
signature verifies over the rendered request with the documented verifier;
and the cancel request of ``overlap: replace`` rendered with the stopped run's values.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sidecar.after.signing import Signer
from sidecar.config.load import parse_config
from sidecar.core.clock import Clock
from sidecar.run.trigger import Trigger, Why
from tests.after.test_signing import RawApp, python_verifier
from tests.receivers import Receiver, receiver
from tests.support import (
    NatsServer,
    RecordingApp,
    Request,
    base,
    cli_config,
    job,
    run_cli,
    sidecars,
    wait_for,
)

SECRET = b"params-secret"
REQUEST: dict[str, Any] = {
    "path": "/jobs/{job}/{slot}",
    "query": {"at": "{scheduled_at}", "run": "{run_id}", "by": "{instance}"},
    "headers": {
        "Content-Type": "application/json",
        "X-Run": "{run_id}",
        "X-Try": "{attempt}/{trigger}",
    },
    "body": '{"slot": {slot}, "at": "{scheduled_at}", "run": "{run_id}", "note": "{{slot}}"}',
}


def rfc3339_of(slot: int) -> str:
    """The slot as X-Anarchon-Scheduled-At writes it, computed here independently."""
    return datetime.fromtimestamp(slot // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + (
        f"{slot % 1000:03d}Z"
    )


async def test_trigger_sends_and_signs_the_rendered_request() -> None:
    raw = RawApp()
    slot, token = 1_796_227_910_000, "0123456789abcdef0123456789abcdef"
    async with raw as url:
        config = parse_config(
            {
                "target": {"url": url},
                "jobs": [{"name": "p", "schedule": "* * * * *", "request": REQUEST}],
            },
            {},
        )
        async with Trigger(Signer.of(SECRET), Clock(), "web-2") as trigger:
            result = await trigger.fire(
                config.jobs[0], slot, token, time.monotonic() + 20, attempt=2, why=Why("retry")
            )
    assert result.ok, result.error
    (sent,) = raw.requests
    at = rfc3339_of(slot)
    assert sent["target"] == f"/jobs/p/{slot}?at={at}&run={token}&by=web-2"
    headers = dict(sent["headers"])
    assert (headers["X-Run"], headers["X-Try"]) == (token, "2/retry")
    assert json.loads(sent["body"]) == {"slot": slot, "at": at, "run": token, "note": "{slot}"}
    verify = python_verifier()
    pairs = [tuple(p) for p in sent["headers"]]
    with pytest.raises(verify.SignatureError):  # not over the request as written
        verify.Verifier([SECRET]).verify(
            "POST", "/jobs/{job}/{slot}", pairs, sent["body"].encode(), time.time()
        )
    verify.Verifier([SECRET]).verify(
        "POST", sent["target"], pairs, sent["body"].encode(), time.time()
    )


@pytest.fixture
def app() -> Iterator[Receiver]:
    yield from receiver()


def test_three_sidecars_send_each_slot_rendered_once(
    tmp_path: Path, nats_server: NatsServer, app: Receiver
) -> None:
    secret = tmp_path / "signing"
    secret.write_bytes(SECRET)
    config = {
        "nats": {"servers": [nats_server.url]},
        "target": {"url": app.url, "timeout": "5s", "signing_secret_file": str(secret)},
        "jobs": [job("params", request=REQUEST)],
    }
    # A job added at run time is checked the same way, before anything is written.
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps(job("dyn", request={"path": "/d/{sloot}"})))
    added = run_cli("job", "add", str(bad), "-c", cli_config(tmp_path, config))
    assert added.returncode == 2, added
    assert "job.request.path: unknown placeholder {sloot}; known: {scheduled_at}" in added.stderr
    assert "Traceback" not in added.stderr

    def seen() -> set[str]:
        return {r.headers["X-Anarchon-Slot"] for r in app.received("/jobs/params/")}

    names = [f"web-{i}" for i in range(1, 4)]
    with sidecars(tmp_path, [(name, config, {}) for name in names]):
        wait_for(lambda: len(seen()) >= 5, 30, what="five slots of params")
    got = app.received("/jobs/params/")
    counts = Counter(r.headers["X-Anarchon-Slot"] for r in got)
    assert all(n == 1 for n in counts.values()), counts  # exactly once per slot
    verifier = python_verifier().Verifier([SECRET])
    for r in got:
        slot = int(r.headers["X-Anarchon-Slot"])
        run_id, instance = r.headers["X-Anarchon-Run-Id"], r.headers["X-Anarchon-Instance"]
        at = rfc3339_of(slot)
        assert r.headers["X-Anarchon-Scheduled-At"] == at
        assert instance in names
        assert r.target == f"/jobs/params/{slot}?at={at}&run={run_id}&by={instance}"
        assert (r.headers["X-Run"], r.headers["X-Try"]) == (run_id, "1/scheduled")
        assert r.json() == {"slot": slot, "at": at, "run": run_id, "note": "{slot}"}
        verifier.verify("POST", r.target, list(r.headers.items()), r.body, time.time())
    assert len({r.headers["X-Anarchon-Run-Id"] for r in got}) == len(got)


def test_the_cancel_request_of_replace_renders_its_path_with_the_stopped_runs_values(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """Only `cancel.path` has placeholders (the trigger's own path has none): the
    cancel request still goes out rendered, with the run id of the run it stops."""
    path = "/jobs/rep"
    http_app.delay[path] = 60.0  # only a cancel ends a run
    rep = job(
        "rep",
        schedule="*/3 * * * * *",
        max_late="2500ms",
        overlap="replace",
        cancel={"grace": "1s", "path": "/cancel/{job}/{run_id}/{attempt}/{trigger}"},
    )
    config = base(nats_server, http_app, [rep])

    def asked() -> list[Request]:
        return [r for r in http_app.requests if "X-Anarchon-Cancel" in r.headers]

    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]):
        wait_for(lambda: len(asked()) >= 2, 40, what="two cancel requests")
    started = {r.headers["X-Anarchon-Run-Id"] for r in http_app.requests_for(path)}
    for cancel in asked():
        token = cancel.headers["X-Anarchon-Cancel"]
        assert token in started
        assert cancel.path == f"/cancel/rep/{token}/1/cancel", cancel
