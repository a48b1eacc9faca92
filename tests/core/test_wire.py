"""The wire module: ids, keys and subjects as docs/ and SECURITY.md name them; one
transient list; the compare-and-set conflict codes; compact JSON and safe decode."""

from __future__ import annotations

import json

import pytest
from nats.errors import ConnectionReconnectingError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)

from sidecar.core import wire


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("backup", 1700000000000, "t0k", False, 1), "backup:1700000000000"),  # the reference's
        (("backup", 1700000000000, "t0k", False, 2), "backup:1700000000000:a2"),
        (("backup", 1700000000000, "t0k", True, 1), "backup:manual:t0k"),
        (("backup", 1700000000000, "t0k", True, 3), "backup:manual:t0k"),
    ],
)
def test_claim_msg_ids(args: tuple[str, int, str, bool, int], expected: str) -> None:
    assert wire.claim_msg_id(*args) == expected


def test_subjects_keys_and_ids() -> None:
    assert wire.claims_subject("anarchon.", "backup") == "anarchon.backup.claims"
    assert wire.results_subject("anarchon.", "backup") == "anarchon.backup.results"
    assert wire.kv_subject("CRON_STATE", "paused.backup") == "$KV.CRON_STATE.paused.backup"
    assert wire.kv_stream("CRON_STATE") == "KV_CRON_STATE"
    assert wire.msg_get_subject("$JS.hub.API", "CRON") == "$JS.hub.API.STREAM.MSG.GET.CRON"
    assert wire.lost_msg_id("backup", 5, 2) == "backup:5:2:lost"
    assert wire.run_key("backup", 5, 1) == "run.backup.5"
    assert wire.run_key("backup", 5, 3) == "run.backup.5.3"
    assert wire.lock_key("backup") == "lock.backup"
    assert wire.due_key("backup", 5, 2) == "due.backup.5.2"
    assert wire.paused_key("backup") == "paused.backup"
    assert wire.skip_key("backup") == "skip.backup"
    assert wire.since_key("backup") == "since.backup"
    assert wire.health_key("backup") == "health.backup"
    assert wire.instance_key("web-1") == "instance.web-1"
    assert wire.event_key("backup", "tok", "failing") == "event.backup.tok.failing"


def test_the_modules_that_name_the_wire_use_it() -> None:
    from sidecar.after import signing
    from sidecar.run import claim, trigger
    from sidecar.store import state
    from sidecar.when import attempts

    assert claim.MSG_ID == wire.MSG_ID == "Nats-Msg-Id"
    assert claim.TRANSIENT is wire.TRANSIENT
    assert attempts.claim_msg_id is wire.claim_msg_id
    assert signing.SIGNATURE_HEADER == "X-Anarchon-Signature"
    assert wire.TRIGGERS == (
        "scheduled",
        "catchup",
        "manual",
        "retry",
        "rerun",
        "backfill",
        "at",
        "after",
    )
    assert trigger.traceparent is wire.traceparent
    assert attempts.DUE_REASONS == (wire.RETRY, wire.LOST)  # one "retry", one "lost"
    assert state.decode is wire.decode


@pytest.mark.parametrize(
    "exc",
    [
        NatsTimeoutError(),
        TimeoutError(),
        NoRespondersError(),
        NoStreamResponseError(),
        ServiceUnavailableError(),
        ConnectionReconnectingError(),
    ],
)
def test_transient_errors(exc: BaseException) -> None:
    assert isinstance(exc, wire.TRANSIENT)


@pytest.mark.parametrize(
    "exc",
    [
        NotFoundError(),
        BadRequestError(),
        APIError(err_code=wire.ERR_STREAM_NAME_IN_USE),
        ValueError("not ours"),
    ],
)
def test_refusals_are_not_transient(exc: BaseException) -> None:
    assert not isinstance(exc, wire.TRANSIENT)


@pytest.mark.parametrize(
    ("exc", "conflict"),
    [
        (KeyWrongLastSequenceError(), True),
        (APIError(err_code=10071), True),
        (BadRequestError(err_code=10164), True),  # an R3 bucket's answer
        (APIError(err_code=wire.ERR_STREAM_NOT_FOUND), False),
        (APIError(), False),
        (RuntimeError("wrong last sequence"), False),  # text alone is not a code
    ],
)
def test_cas_conflict(exc: BaseException, conflict: bool) -> None:
    assert wire.cas_conflict(exc) is conflict


def test_compact_json_and_safe_decode() -> None:
    value = {"by": "ops", "at": "2026-01-01T00:00:00Z", "n": [1, 2]}
    data = wire.compact(value)
    assert data == b'{"by":"ops","at":"2026-01-01T00:00:00Z","n":[1,2]}'
    assert wire.decode(data) == value
    deep = b"[" * 100_000 + b"]" * 100_000
    for hostile in (None, b"", b"not json", b"[1,2]", b'"text"', b"\xff\xfe", deep):
        assert wire.decode(hostile) == {}
    assert json.loads(wire.compact({"job": 'a"b'})) == {"job": 'a"b'}
