"""The start of the app's answer as a result record keeps it: pure.

A run's result record may carry the first ``answer.bytes`` bytes of the app's
answer and its content type (docs/TRIGGER.md, "The app's answer in
history"), as optional fields that other implementations ignore:

- ``answer``: the kept bytes as text when they are UTF-8 (a character cut by
  the limit is left out whole), else base64 with ``answer_base64: true``;
- ``answer_type``: the answer's ``Content-Type``, at most ``MAX_TYPE``
  characters;
- ``answer_cut: true``: more followed than was kept.

Never more than ``MAX_ANSWER_BYTES`` bytes are kept, so a record stays far
below any stream's message size (sidecar/store/streamfit.py): JSON escapes a
byte into at most six characters, base64 four thirds. The values of the
request's headers named by ``answer.redact`` are replaced by ``[redacted]``
before anything of the answer is kept (``redact``), by the trigger itself, so
the error message and pings never see them either.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_ANSWER_BYTES", "MAX_ANSWER_BYTES", "Excerpt", "excerpt", "redact"]

# jobs[].answer.bytes when unset, and its hard cap.
DEFAULT_ANSWER_BYTES = 512
MAX_ANSWER_BYTES = 8192
# A Content-Type longer than this is cut (a real one is a few dozen characters).
MAX_TYPE = 200
REDACTED = b"[redacted]"
# The largest a record's answer fields can be, JSON-escaped: every byte of the
# excerpt as ``\u00XX`` (six characters), the type likewise, and the names.
MAX_RECORD_GROWTH = 6 * MAX_ANSWER_BYTES + 6 * MAX_TYPE + 100


@dataclass(frozen=True)
class Excerpt:
    """What a result record keeps of an answer."""

    text: str  # UTF-8 text, or base64 when `binary`
    content_type: str | None
    binary: bool = False
    cut: bool = False  # the answer went on after what was kept

    def fields(self) -> dict[str, Any]:
        """The record's optional fields (absent ones left out)."""
        out: dict[str, Any] = {"answer": self.text}
        if self.content_type:
            out["answer_type"] = self.content_type
        if self.binary:
            out["answer_base64"] = True
        if self.cut:
            out["answer_cut"] = True
        return out


def redact(body: bytes, secrets: Iterable[str]) -> bytes:
    """`body` with every occurrence of each non-empty secret replaced by ``[redacted]``,
    the longest first (one secret may contain another)."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        body = body.replace(secret.encode(), REDACTED)
    return body


def utf8_start(kept: bytes, cut: bool) -> str | None:
    """`kept` as text; when `cut`, a last character the cut split is left out. None:
    not UTF-8 (binary)."""
    try:
        return kept.decode()
    except UnicodeDecodeError as exc:
        # Only a character split by the cut itself is forgiven: at most three
        # bytes of a started sequence at the very end.
        if not (cut and exc.end == len(kept) and len(kept) - exc.start <= 3):
            return None
        try:
            return kept[: exc.start].decode()
        except UnicodeDecodeError:
            return None


def content_type_of(value: str | None) -> str | None:
    """The Content-Type as kept: stripped, at most MAX_TYPE characters; None if empty."""
    if value is None:
        return None
    value = value.strip()[:MAX_TYPE]
    return value or None


def excerpt(body: bytes, limit: int, content_type: str | None) -> Excerpt | None:
    """What a record keeps of an answer whose (already redacted) start is `body`
    (longer than MAX_ANSWER_BYTES when the answer was): its first `limit` bytes (at
    most MAX_ANSWER_BYTES). None: nothing to keep (`limit` 0, or no body and no type)."""
    limit = min(limit, MAX_ANSWER_BYTES)
    ctype = content_type_of(content_type)
    if limit <= 0 or (not body and ctype is None):
        return None
    kept = body[:limit]
    cut = len(body) > limit
    text = utf8_start(kept, cut)
    if text is None:
        return Excerpt(base64.b64encode(kept).decode(), ctype, binary=True, cut=cut)
    return Excerpt(text, ctype, cut=cut)


def excerpt_bytes(answer: str, binary: bool) -> bytes:
    """The kept bytes of a record's excerpt (for display); b"" if base64 is broken."""
    if not binary:
        return answer.encode()
    try:
        return base64.b64decode(answer, validate=True)
    except ValueError:
        return b""
