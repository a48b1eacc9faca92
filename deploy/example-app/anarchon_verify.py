"""Verify X-Anarchon-Signature v2/v3 in a Python app (standard library only).

v3 also binds X-Anarchon-Trigger and X-Anarchon-Previous-Scheduled-At. A
request with a v3= entry is checked by v3; one without is checked by v2 and
refused when it carries either of those two headers (never believed unsigned).

Copy ``Verifier`` into your app. One instance per process, shared by every
request (it remembers the runs it accepted, for the replay rule)::

    verifier = Verifier([secret])                # during a rotation: [current, next]
    # per request, before acting on it:
    verifier.verify(method, raw_target, header_pairs, body)   # raises SignatureError

``raw_target`` is the request target exactly as received, path and query,
undecoded (``BaseHTTPRequestHandler.path``, WSGI ``RAW_URI`` or
``REQUEST_URI``, ASGI ``raw_path`` + ``b"?"`` + ``query_string``).
``header_pairs`` are the received headers as (name, value) pairs, repeats
included (``handler.headers.items()``, ASGI ``headers``), so that a signed
header sent twice is refused rather than merged.

``python verify.py vectors.json`` runs the test vectors and prints one line
per step: ``<case> <step> <result>`` (the repository's tests compare them).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
import threading
import time
from collections.abc import Iterable, Sequence

SIGNED = ("x-anarchon-job", "x-anarchon-slot", "x-anarchon-run-id")
OPTIONAL = {"x-anarchon-attempt": "1", "x-anarchon-fence": ""}
V3_ONLY = ("x-anarchon-trigger", "x-anarchon-previous-scheduled-at")
SIGNATURE = "x-anarchon-signature"


class SignatureError(Exception):
    """Refused; ``reason`` is ``malformed``, ``expired``, ``mismatch`` or ``replay``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Verifier:
    """Checks v2 signatures with any of ``secrets``; refuses replays within ``window`` s."""

    def __init__(self, secrets: Sequence[bytes], window: int = 300) -> None:
        if not secrets or not all(secrets):
            raise ValueError("at least one non-empty secret")
        self.secrets = list(secrets)
        self.window = window
        self._seen: dict[tuple[str, str], int] = {}  # (run id, attempt) -> forget after
        self._lock = threading.Lock()

    def verify(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        now: float | None = None,
    ) -> None:
        """Return if the request is signed, fresh and new; else raise SignatureError."""
        now = time.time() if now is None else now
        values: dict[str, list[str]] = {}
        for name, value in headers:
            values.setdefault(name.lower(), []).append(value.strip(" \t"))
        for name in (*SIGNED, *OPTIONAL, *V3_ONLY, SIGNATURE):
            if len(values.get(name, ())) > 1:
                raise SignatureError("malformed", f"{name} sent more than once")
        if SIGNATURE not in values:
            raise SignatureError("malformed", "no X-Anarchon-Signature")
        stamps, macs, macs_v3 = [], [], []
        for entry in values[SIGNATURE][0].split(","):
            key, _, value = entry.strip().partition("=")
            if key == "t":
                stamps.append(value)
            elif key == "v2":
                macs.append(value)
            elif key == "v3":
                macs_v3.append(value)
        if len(stamps) != 1 or not stamps[0].isascii() or not stamps[0].isdigit():
            raise SignatureError("malformed", "t= must appear once, as unix seconds")
        if not macs and not macs_v3:
            raise SignatureError("malformed", "no v2= entry")
        if not macs_v3 and any(name in values for name in V3_ONLY):
            raise SignatureError(
                "malformed", "X-Anarchon-Trigger or -Previous-Scheduled-At without v3="
            )
        missing = [name for name in SIGNED if name not in values]
        if missing:
            raise SignatureError("malformed", f"missing {', '.join(missing)}")
        t = int(stamps[0])
        if abs(now - t) > self.window:
            raise SignatureError("expired", f"t={t} is outside the {self.window}s window")
        field = {name: values[name][0] for name in SIGNED}
        field.update({name: values.get(name, [default])[0] for name, default in OPTIONAL.items()})
        lines = [
            "anarchon-v3" if macs_v3 else "anarchon-v2",
            stamps[0],  # exactly as in the header
            method,
            target,
            field["x-anarchon-job"],
            field["x-anarchon-slot"],
            field["x-anarchon-run-id"],
            field["x-anarchon-attempt"] or "1",
            field["x-anarchon-fence"],
            hashlib.sha256(body).hexdigest(),
        ]
        if macs_v3:
            lines += [values.get(name, [""])[0] for name in V3_ONLY]
            macs = macs_v3
        if any("\n" in line or "\r" in line for line in lines):
            raise SignatureError("malformed", "CR or LF in a signed field")
        message = "\n".join(lines).encode()
        expected = [hmac.new(s, message, hashlib.sha256).hexdigest() for s in self.secrets]
        # Every pair compared in constant time; no early exit on the first match.
        matched = False
        for given in macs:
            for want in expected:
                matched |= hmac.compare_digest(want.encode(), given.encode())
        if not matched:
            raise SignatureError(
                "mismatch", f"no {'v3' if macs_v3 else 'v2'}= entry matches a secret"
            )
        # The replay rule, only for requests that passed the checks above.
        key = (field["x-anarchon-run-id"], field["x-anarchon-attempt"] or "1")
        with self._lock:
            for old in [k for k, until in self._seen.items() if until < now]:
                del self._seen[old]
            if key in self._seen:
                raise SignatureError("replay", f"run {key[0]} attempt {key[1]} already accepted")
            self._seen[key] = t + self.window


def run_vectors(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        vectors = json.load(fh)
    for case in vectors["verify"]:
        verifier = Verifier([s.encode() for s in case["secrets"]], case["window"])
        for i, step in enumerate(case["steps"]):
            req = step["request"]
            try:
                pairs = [(name, value) for name, value in req["headers"]]
                verifier.verify(
                    req["method"], req["target"], pairs, req["body"].encode(), step["now"]
                )
                result = "ok"
            except SignatureError as exc:
                result = exc.reason
            print(f"{case['name']} {i} {result}")


if __name__ == "__main__":
    run_vectors(sys.argv[1])
