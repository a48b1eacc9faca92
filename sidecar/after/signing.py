"""Signatures of trigger requests: ``X-Anarchon-Signature``.

Pure functions of the request and the secrets; no I/O, no clock (the caller
passes the time), so the test vectors of ``docs/signing/vectors.json`` can be
reproduced exactly.

``v2`` (README, "Verifying the signature") is an HMAC-SHA256 over a canonical
form of the whole request: the time, the method, the request target (path
and query, exactly as sent), the job, the slot, the run id, the attempt, the
fence and the SHA-256 of the body, one per line::

    anarchon-v2
    <t>
    <METHOD>
    <target>
    <job>
    <slot>
    <run id>
    <attempt>            "1" when X-Anarchon-Attempt is not sent
    <fence>              ""  when X-Anarchon-Fence is not sent
    <hex sha256(body)>

``v3`` is v2 with two more lines, binding why the request was sent
(``X-Anarchon-Trigger``) and the schedule's previous instant
(``X-Anarchon-Previous-Scheduled-At``)::

    anarchon-v3
    <the nine lines of v2 after its label>
    <trigger>            ""  when X-Anarchon-Trigger is not sent
    <previous>           ""  when X-Anarchon-Previous-Scheduled-At is not sent

Adding lines to v2 would have made every deployed v2 verifier refuse every
request, so v2 stays as it was and is still sent beside v3 (a verifier
written for v2 keeps working and ignores ``v3=``). A verifier that knows v3
checks v3, and accepts a v2-only request only when it carries neither of
those two headers (so they are never believed unsigned).

``v1`` (the first scheme, HMAC over ``"<t>.<body>"`` only) is still sent by
default so verifiers written for it keep working; ``target.signing_v1: false``
stops it. The two messages cannot collide: a v1 message starts with the
digits of ``t``, a v2 message with ``anarchon-v2``.

Rotation: one ``v2=`` entry per secret, the current one first, then the next
one (``target.signing_secret_next_file``). ``v1`` is only ever made with the
current secret, so a v1 verifier that keeps the first or the last ``v1=`` of
the header sees the same value.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.core.wire import SIGNATURE_HEADER as SIGNATURE_HEADER  # re-exported

if TYPE_CHECKING:
    from sidecar.config.load import Config, Secrets

V2_LABEL = "anarchon-v2"
V3_LABEL = "anarchon-v3"


@dataclass(frozen=True)
class SignedFields:
    """What a v2 signature binds, besides the time.

    ``attempt`` and ``fence`` must be the values of ``X-Anarchon-Attempt`` and
    ``X-Anarchon-Fence`` when those headers are sent; an unsent attempt is 1,
    an unsent fence the empty string (``None`` here).
    """

    method: str
    target: str
    job: str
    slot: int
    run_id: str
    body: bytes
    attempt: int = 1
    fence: int | None = None
    trigger: str | None = None  # X-Anarchon-Trigger (v3)
    previous: str | None = None  # X-Anarchon-Previous-Scheduled-At (v3)

    @property
    def has_v3(self) -> bool:
        """Whether a header only v3 binds is sent: then v3 is sent too."""
        return self.trigger is not None or self.previous is not None


def canonical_v2(timestamp: int, fields: SignedFields) -> bytes:
    """The message a v2 signature is the HMAC of (UTF-8, LF-separated, no final LF)."""
    return _canonical(V2_LABEL, timestamp, fields, ())


def canonical_v3(timestamp: int, fields: SignedFields) -> bytes:
    """v2's lines under the label ``anarchon-v3``, then the trigger and the previous instant."""
    extra = (fields.trigger or "", fields.previous or "")
    return _canonical(V3_LABEL, timestamp, fields, extra)


def _canonical(label: str, timestamp: int, fields: SignedFields, extra: tuple[str, ...]) -> bytes:
    lines = (
        label,
        str(timestamp),
        fields.method,
        fields.target,
        fields.job,
        str(fields.slot),
        fields.run_id,
        str(fields.attempt),
        "" if fields.fence is None else str(fields.fence),
        hashlib.sha256(fields.body).hexdigest(),
        *extra,
    )
    for line in lines:
        # HTTP cannot carry CR or LF in these; one here would make the form ambiguous.
        if "\n" in line or "\r" in line:
            raise ValueError("a signed field contains CR or LF")
    return "\n".join(lines).encode()


def mac_v1(secret: bytes, timestamp: int, body: bytes) -> str:
    """Hex HMAC-SHA256 of ``"<t>.<body>"``: binds the time and the body only."""
    return hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def mac_v2(secret: bytes, timestamp: int, fields: SignedFields) -> str:
    """Hex HMAC-SHA256 of ``canonical_v2``."""
    return hmac.new(secret, canonical_v2(timestamp, fields), hashlib.sha256).hexdigest()


def mac_v3(secret: bytes, timestamp: int, fields: SignedFields) -> str:
    """Hex HMAC-SHA256 of ``canonical_v3``."""
    return hmac.new(secret, canonical_v3(timestamp, fields), hashlib.sha256).hexdigest()


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The v1 header value alone: ``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``."""
    return f"t={timestamp},v1={mac_v1(secret, timestamp, body)}"


@dataclass(frozen=True)
class Signer:
    """Makes ``X-Anarchon-Signature`` values; never shows its secrets in ``repr``.

    ``secrets``: the current secret first, then (during a rotation) the next.
    ``v1``: also send the v1 entry, made with the current secret only.
    """

    secrets: tuple[bytes, ...] = field(repr=False)
    v1: bool = True

    def __post_init__(self) -> None:
        if not self.secrets or not all(self.secrets):
            raise ValueError("a Signer needs at least one non-empty secret")

    @classmethod
    def of(cls, current: bytes | None, nxt: bytes | None = None, v1: bool = True) -> Signer | None:
        """A signer for ``current`` (and ``nxt``), or None without a current secret."""
        if not current:
            return None
        secrets: Sequence[bytes] = (current,) if not nxt or nxt == current else (current, nxt)
        return cls(tuple(secrets), v1)

    def header(self, timestamp: int, fields: SignedFields) -> str:
        """``t=<t>[,v1=<hex>],v2=<hex>[,v2=<hex>][,v3=<hex>[,v3=<hex>]]``.

        v3 only when the fields carry a trigger or a previous instant.
        """
        parts = [f"t={timestamp}"]
        if self.v1:
            parts.append(f"v1={mac_v1(self.secrets[0], timestamp, fields.body)}")
        parts.extend(f"v2={mac_v2(secret, timestamp, fields)}" for secret in self.secrets)
        if fields.has_v3:
            parts.extend(f"v3={mac_v3(secret, timestamp, fields)}" for secret in self.secrets)
        return ",".join(parts)

    def describe(self) -> str:
        """What is sent, for the start log: ``v1+v2 keys=2`` (never a secret)."""
        return f"{'v1+v2+v3' if self.v1 else 'v2+v3'} keys={len(self.secrets)}"

    def __repr__(self) -> str:
        return f"Signer(secrets=<{len(self.secrets)} set>, v1={self.v1})"


def signer_for(config: Config, secrets: Secrets) -> Signer | None:
    """The signer of a config's ``target.signing_*`` settings; None without a secret."""
    return Signer.of(secrets.signing_secret, secrets.signing_secret_next, config.target.signing_v1)
