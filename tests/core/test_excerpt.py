"""What a result record keeps of the app's answer: the cap, content types, binary
bodies, a UTF-8 character cut by the limit, redaction (sidecar/core/excerpt.py)."""

from __future__ import annotations

import base64
import dataclasses
import json

import pytest

from sidecar.core.excerpt import (
    DEFAULT_ANSWER_BYTES,
    MAX_ANSWER_BYTES,
    MAX_RECORD_GROWTH,
    MAX_TYPE,
    Excerpt,
    excerpt,
    excerpt_bytes,
    redact,
)
from sidecar.core.wire import ResultRecord, trace_id_of

EURO = "€".encode()  # three bytes: e2 82 ac
TEXT = "text/plain; charset=utf-8"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("body", "limit", "ctype", "expected"),
    [
        # Nothing asked, or nothing there.
        (b"hello", 0, "text/plain", None),
        (b"", 512, None, None),
        # An empty body with a type: the type is kept.
        (b"", 512, "text/plain", Excerpt("", "text/plain")),
        # Shorter than the limit: all of it, not cut.
        (
            b"done\n",
            512,
            "text/plain; charset=utf-8",
            Excerpt("done\n", "text/plain; charset=utf-8"),
        ),
        # Exactly the limit: all of it, not cut.
        (b"abcd", 4, None, Excerpt("abcd", None)),
        # Longer: the first bytes, cut.
        (b"abcdef", 4, None, Excerpt("abcd", None, cut=True)),
        # The cap holds whatever the limit says.
        (b"x" * 9000, 100_000, None, Excerpt("x" * MAX_ANSWER_BYTES, None, cut=True)),
        # A character cut by the limit is left out whole (1 or 2 of its 3 bytes kept).
        (b"ab" + EURO + b"cd", 3, None, Excerpt("ab", None, cut=True)),
        (b"ab" + EURO + b"cd", 4, None, Excerpt("ab", None, cut=True)),
        (b"ab" + EURO + b"cd", 5, None, Excerpt("ab€", None, cut=True)),
        # A four-byte character cut after three of its bytes.
        (b"a" + "😀".encode() + b"b", 4, None, Excerpt("a", None, cut=True)),
        # Not UTF-8: base64 of exactly the kept bytes.
        (
            b"\x89PNG\r\n\x1a\n\x00\x00",
            8,
            "image/png",
            Excerpt(base64.b64encode(b"\x89PNG\r\n\x1a\n").decode(), "image/png", True, True),
        ),
        # A truncated character at the end of a whole (not cut) body is not forgiven.
        (
            b"ab" + EURO[:2],
            512,
            None,
            Excerpt(base64.b64encode(b"ab" + EURO[:2]).decode(), None, True),
        ),
        # Invalid bytes in the middle are binary even when the end was cut.
        (b"a\xffbcdef", 4, None, Excerpt(b64(b"a\xffbc"), None, True, True)),
        # Valid UTF-8 with controls stays text (shown escaped by history and the page).
        (b"a\x00b\x1b[31m", 512, None, Excerpt("a\x00b\x1b[31m", None)),
        # A content type is stripped and capped; an empty one is none.
        (b"x", 512, "  text/csv ", Excerpt("x", "text/csv")),
        (b"x", 512, "   ", Excerpt("x", None)),
        (b"x", 512, "t/" + "a" * 500, Excerpt("x", ("t/" + "a" * 500)[:MAX_TYPE])),
    ],
)
def test_excerpt(body: bytes, limit: int, ctype: str | None, expected: Excerpt | None) -> None:
    assert excerpt(body, limit, ctype) == expected


def test_default_is_small_and_under_the_cap() -> None:
    assert 0 < DEFAULT_ANSWER_BYTES <= 1024 < MAX_ANSWER_BYTES <= 8192


@pytest.mark.parametrize(
    ("body", "secrets", "expected"),
    [
        (b"token abc123 echoed", ["abc123"], b"token [redacted] echoed"),
        (b"Bearer s3cr3t and s3cr3t", ["Bearer s3cr3t", "s3cr3t"], b"[redacted] and [redacted]"),
        (b"nothing here", ["abc"], b"nothing here"),
        (b"empty secret", [""], b"empty secret"),
        (b"caf\xc3\xa9 key", ["caf\u00e9"], b"[redacted] key"),
    ],
)
def test_redact(body: bytes, secrets: list[str], expected: bytes) -> None:
    assert redact(body, secrets) == expected


def test_record_fields_are_optional_and_bounded() -> None:
    """The answer's fields appear only when kept; a record of the worst excerpt (every
    byte escaped by JSON, the longest type) grows by at most MAX_RECORD_GROWTH."""
    plain = ResultRecord("j", 1, "t", "i", "succeeded", "a", "b", 1, 200, None)
    assert set(json.loads(plain.to_json())) == {
        "job", "slot", "token", "instance", "status", "started_at", "finished_at",
        "duration_ms", "http_status", "error", "manual", "trace_id",
    }  # fmt: skip
    worst = excerpt(b"\x01" * 20_000, MAX_ANSWER_BYTES, "\x01" * 1000)
    assert worst is not None and not worst.binary and worst.cut
    kept = ResultRecord("j", 1, "t", "i", "succeeded", "a", "b", 1, 200, None, excerpt=worst)
    data = json.loads(kept.to_json())
    assert data["answer"] == "\x01" * MAX_ANSWER_BYTES
    assert data["answer_cut"] is True and "answer_base64" not in data
    assert len(kept.to_json()) - len(plain.to_json()) <= MAX_RECORD_GROWTH
    binary = excerpt(b"\xff" * 20_000, MAX_ANSWER_BYTES, "application/octet-stream")
    assert binary is not None and binary.binary
    assert excerpt_bytes(binary.text, True) == b"\xff" * MAX_ANSWER_BYTES
    assert excerpt_bytes("not base64!", True) == b""


def test_a_record_is_the_json_of_its_fields_in_their_order() -> None:
    """``to_json`` reads the fields one by one (not ``dataclasses.asdict``): byte for
    byte what the JSON of ``asdict`` gave, with and without an answer, attempt,
    trigger and anomaly."""
    kept = excerpt(b'{"ok": "caf\xc3\xa9"}', MAX_ANSWER_BYTES, "application/json")
    records = [
        ResultRecord("j", 1, "t" * 32, "i", "succeeded", "a", "b", 1, 200, None),
        ResultRecord(
            "j\u00e9", 2, "t", "i", "failed", "a", "b", 7, None, 'no "answer"', True, 3,
            "retry", "long", kept,
        ),
    ]  # fmt: skip
    for record in records:
        data = dataclasses.asdict(record)
        del data["excerpt"]
        if record.excerpt is not None:
            data.update(record.excerpt.fields())
        for name in ("attempt", "trigger", "anomaly"):
            if data[name] in (None, 1):
                del data[name]
        data["trace_id"] = trace_id_of(record.token)
        assert record.to_json() == json.dumps(data, separators=(",", ":")).encode()
