"""Write vectors.json: ``python3 docs/signing/make_vectors.py > docs/signing/vectors.json``.

Computed here with hashlib and hmac directly, from the README's description
of the scheme, not with the sidecar's code, so that the sidecar reproducing
them (tests/after/test_signing.py) means something. Add a case here, regenerate,
and every verifier's test runs it.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import re
import sys
from collections.abc import Callable
from typing import Any

T = 1796227910
CUR = "current-secret-2026"
NXT = "next-secret-2027 ✓"
OTHER = "some-other-secret"
RUN = "5d8a0ddd930d5616b1e006bafbf38ed3"
SIG = "X-Anarchon-Signature"

Headers = list[list[str]]
Case = dict[str, Any]


def canonical(f: dict[str, Any], t: int, label: str = "anarchon-v2") -> str:
    attempt = "1" if f["attempt"] is None else str(f["attempt"])
    fence = "" if f["fence"] is None else str(f["fence"])
    digest = hashlib.sha256(f["body"].encode()).hexdigest()
    lines = [label, str(t), f["method"], f["target"], f["job"], str(f["slot"])]
    lines += [f["run_id"], attempt, fence, digest]
    if label == "anarchon-v3":
        lines += [f["trigger"] or "", f["previous"] or ""]
    return "\n".join(lines)


def has_v3(f: dict[str, Any]) -> bool:
    return f["trigger"] is not None or f["previous"] is not None


def mac(secret: str, message: str) -> str:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def sign(name: str, note: str, t: int, secrets: list[str], v1: bool, **fields: Any) -> Case:
    f = {"attempt": None, "fence": None, "trigger": None, "previous": None, **fields}
    message = canonical(f, t)
    parts = [f"t={t}"]
    if v1:
        parts.append("v1=" + mac(secrets[0], f"{t}." + f["body"]))
    parts += ["v2=" + mac(secret, message) for secret in secrets]
    if has_v3(f):
        parts += ["v3=" + mac(secret, canonical(f, t, "anarchon-v3")) for secret in secrets]
    headers = [
        ["X-Anarchon-Job", f["job"]],
        ["X-Anarchon-Slot", str(f["slot"])],
        ["X-Anarchon-Run-Id", f["run_id"]],
    ]
    if f["attempt"] is not None:
        headers.append(["X-Anarchon-Attempt", str(f["attempt"])])
    if f["fence"] is not None:
        headers.append(["X-Anarchon-Fence", str(f["fence"])])
    if f["trigger"] is not None:
        headers.append(["X-Anarchon-Trigger", f["trigger"]])
    if f["previous"] is not None:
        headers.append(["X-Anarchon-Previous-Scheduled-At", f["previous"]])
    headers.append([SIG, ",".join(parts)])
    order = ["method", "target", "job", "slot", "run_id", "attempt", "fence", "body"]
    if has_v3(f):
        order[-1:-1] = ["trigger", "previous"]
    request = {"method": f["method"], "target": f["target"], "headers": headers, "body": f["body"]}
    out = {
        "name": name,
        "note": note,
        "t": t,
        "secrets": secrets,
        "v1": v1,
        "fields": {key: f[key] for key in order},
        "canonical": message,
    }
    if has_v3(f):
        out["canonical_v3"] = canonical(f, t, "anarchon-v3")
    return {**out, "header": ",".join(parts), "request": request}


SIGNING = [
    sign(
        "v1-and-v2",
        "the default: v1 (current secret) and v2",
        T,
        [CUR],
        True,
        method="POST",
        target="/jobs/sync",
        job="sync",
        slot=1796227910000,
        run_id=RUN,
        body='{"full": false}',
    ),
    sign(
        "v2-only-empty-body-query",
        "target.signing_v1: false; the query is part of the target; empty body",
        T + 7,
        [CUR],
        False,
        method="GET",
        target="/jobs/heartbeat?region=eu&dry_run=1",
        job="heartbeat",
        slot=1796227915000,
        run_id="0123456789abcdef0123456789abcdef",
        body="",
    ),
    sign(
        "rotation",
        "current and next secret: one v2 entry each, current first; v1 with the current"
        " secret only",
        T,
        [CUR, NXT],
        True,
        method="POST",
        target="/jobs/sync",
        job="sync",
        slot=1796227910000,
        run_id=RUN,
        body='{"full": false}',
    ),
    sign(
        "attempt-and-fence",
        "X-Anarchon-Attempt and X-Anarchon-Fence sent (docs/TRIGGER.md); UTF-8 body;"
        " percent-encoding kept as is",
        T + 60,
        [CUR],
        False,
        method="PUT",
        target="/internal/report%2Fdaily?fmt=csv",
        job="nightly-report",
        slot=1796263800000,
        run_id="ffeeddccbbaa99887766554433221100",
        body="Grüße ✓",
        attempt=3,
        fence=4711,
    ),
    sign(
        "rotation-v2-only",
        "an explicit X-Anarchon-Attempt: 1 signs the same as none",
        T + 120,
        [CUR, NXT],
        False,
        method="DELETE",
        target="/jobs/cleanup",
        job="cleanup",
        slot=1796227800000,
        run_id="00112233445566778899aabbccddeeff",
        body="",
        attempt=1,
    ),
    sign(
        "v3-trigger-and-previous",
        "X-Anarchon-Trigger and X-Anarchon-Previous-Scheduled-At sent: v2 as before, and v3"
        " binding them too",
        T + 180,
        [CUR],
        True,
        method="POST",
        target="/jobs/sync",
        job="sync",
        slot=1796228100000,
        run_id="a1b2c3d4e5f60718293a4b5c6d7e8f90",
        body='{"full": false}',
        attempt=2,
        fence=812,
        trigger="retry",
        previous="2026-12-02T15:30:00.000Z",
    ),
    sign(
        "v3-rotation-first-slot",
        "rotation: one v2 and one v3 entry per secret; no previous instant (the schedule has"
        " none): the header is not sent and its line is empty",
        T + 240,
        [CUR, NXT],
        False,
        method="POST",
        target="/jobs/backfill",
        job="backfill",
        slot=1796227200000,
        run_id="0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        body="",
        trigger="backfill",
    ),
]
A, B, R, F, _, V3, V3R = SIGNING


def req(case: Case, headers: Callable[[Headers], Headers] | None = None, **changes: str) -> Case:
    """The case's request, with `changes` and its headers passed through `headers`."""
    request: Case = copy.deepcopy(case["request"])
    request.update(changes)
    if headers is not None:
        request["headers"] = headers(request["headers"])
    return request


def set_header(name: str, value: str | None) -> Callable[[Headers], Headers]:
    """Replace (or, with None, drop) a header; it moves before the last one."""

    def change(headers: Headers) -> Headers:
        out = [h for h in headers if h[0] != name]
        if value is not None:
            out.insert(len(out) - 1, [name, value])
        return out

    return change


def add_header(name: str, value: str) -> Callable[[Headers], Headers]:
    """Send `name` once more, before the signature."""
    return lambda headers: [*headers[:-1], [name, value], *headers[-1:]]


def signature_of(header: str) -> Callable[[Headers], Headers]:
    return set_header(SIG, header)


def step(now: int, request: Case, expect: str) -> Case:
    return {"now": now, "request": request, "expect": expect}


def case(name: str, secrets: list[str], steps: list[Case], note: str = "") -> Case:
    out: Case = {"name": name}
    if note:
        out["note"] = note
    out.update({"secrets": secrets, "window": 300, "steps": steps})
    return out


V1_ONLY = A["header"].split(",v2=")[0]
UPPER = V1_ONLY + ",v2=" + A["header"].split(",v2=")[1].upper()
RETRY = sign(
    "",
    "",
    T + 60,
    [CUR],
    False,
    method="PUT",
    target="/internal/report%2Fdaily?fmt=csv",
    job="nightly-report",
    slot=1796263800000,
    run_id="ffeeddccbbaa99887766554433221100",
    body="Grüße ✓",
    attempt=4,
    fence=4790,
)

VERIFY = [
    case(
        "accepts-then-refuses-replay",
        [CUR],
        [step(T + 1, A["request"], "ok"), step(T + 2, A["request"], "replay")],
        "the same run id and attempt twice within the window",
    ),
    case("window-edge-past", [CUR], [step(T + 7 + 300, B["request"], "ok")]),
    case("too-old", [CUR], [step(T + 7 + 301, B["request"], "expired")]),
    case("too-far-in-future", [CUR], [step(T + 7 - 301, B["request"], "expired")]),
    case(
        "expired-not-replay",
        [CUR],
        [step(T, A["request"], "ok"), step(T + 301, A["request"], "expired")],
        "after the window the request is refused for its time; it need not be remembered longer",
    ),
    case("rotation-old-secret", [CUR], [step(T, R["request"], "ok")]),
    case("rotation-new-secret", [NXT], [step(T, R["request"], "ok")]),
    case("rotation-both-secrets", [NXT, CUR], [step(T, R["request"], "ok")]),
    case("rotation-unknown-secret", [OTHER], [step(T, R["request"], "mismatch")]),
    case(
        "new-secret-before-rotation",
        [NXT],
        [step(T, A["request"], "mismatch")],
        "a verifier that already dropped the current secret refuses a sidecar that has no next one",
    ),
    case("other-path", [CUR], [step(T, req(A, target="/jobs/delete-everything"), "mismatch")]),
    case("query-added", [CUR], [step(T, req(A, target="/jobs/sync?full=1"), "mismatch")]),
    case("other-method", [CUR], [step(T, req(A, method="DELETE"), "mismatch")]),
    case(
        "other-job",
        [CUR],
        [step(T, req(A, set_header("X-Anarchon-Job", "cleanup")), "mismatch")],
    ),
    case(
        "other-slot",
        [CUR],
        [step(T, req(A, set_header("X-Anarchon-Slot", "1796227920000")), "mismatch")],
    ),
    case(
        "fresh-run-id",
        [CUR],
        [step(T, req(A, set_header("X-Anarchon-Run-Id", "f" * 32)), "mismatch")],
        "a new run id cannot be given to a captured request: the app's idempotency key is signed",
    ),
    case(
        "attempt-added",
        [CUR],
        [step(T, req(A, add_header("X-Anarchon-Attempt", "2")), "mismatch")],
    ),
    case(
        "attempt-1-added",
        [CUR],
        [step(T, req(A, add_header("X-Anarchon-Attempt", "1")), "ok")],
        "an absent attempt is 1",
    ),
    case(
        "attempt-removed",
        [CUR],
        [step(T + 60, req(F, set_header("X-Anarchon-Attempt", None)), "mismatch")],
    ),
    case("fence-added", [CUR], [step(T, req(A, add_header("X-Anarchon-Fence", "1")), "mismatch")]),
    case(
        "fence-changed",
        [CUR],
        [step(T + 60, req(F, set_header("X-Anarchon-Fence", "4712")), "mismatch")],
    ),
    case(
        "attempt-and-fence",
        [CUR],
        [step(T + 60, F["request"], "ok"), step(T + 61, F["request"], "replay")],
    ),
    case("other-body", [CUR], [step(T, req(A, body='{"full": true}'), "mismatch")]),
    case(
        "time-changed",
        [CUR],
        [step(T, req(A, signature_of(A["header"].replace(f"t={T}", f"t={T + 1}"))), "mismatch")],
    ),
    case(
        "v1-only",
        [CUR],
        [step(T, req(A, signature_of(V1_ONLY)), "malformed")],
        "a v2 verifier ignores v1 and needs a v2 entry",
    ),
    case("no-signature", [CUR], [step(T, req(A, set_header(SIG, None)), "malformed")]),
    case(
        "no-time",
        [CUR],
        [step(T, req(A, signature_of(A["header"].split(",", 1)[1])), "malformed")],
    ),
    case(
        "time-not-a-number",
        [CUR],
        [step(T, req(A, signature_of(A["header"].replace(f"t={T}", "t=17962279e1"))), "malformed")],
    ),
    case(
        "time-with-leading-zero",
        [CUR],
        [step(T, req(A, signature_of(A["header"].replace(f"t={T}", f"t=0{T}"))), "mismatch")],
        "t goes into the message exactly as written in the header",
    ),
    case(
        "uppercase-hex",
        [CUR],
        [step(T, req(A, signature_of(UPPER)), "mismatch")],
        "v2 is compared as 64 lowercase hex digits",
    ),
    case(
        "spaces-around-entries",
        [CUR],
        [step(T, req(A, signature_of(" " + A["header"].replace(",", " , ") + " ")), "ok")],
    ),
    case(
        "two-times",
        [CUR],
        [step(T, req(A, signature_of(f"t={T}," + A["header"])), "malformed")],
    ),
    case("no-run-id", [CUR], [step(T, req(A, set_header("X-Anarchon-Run-Id", None)), "malformed")]),
    case(
        "job-twice",
        [CUR],
        [step(T, req(A, add_header("X-Anarchon-Job", "sync")), "malformed")],
        "a signed header sent twice is refused, whatever the framework would make of it",
    ),
    case(
        "unknown-entries-ignored",
        [CUR],
        [step(T, req(A, signature_of(A["header"] + ",v9=abc")), "ok")],
    ),
    case(
        "header-names-any-case",
        [CUR],
        [step(T, req(A, lambda hs: [[n.lower(), v] for n, v in hs]), "ok")],
    ),
    case(
        "v3-accepts-then-refuses-replay",
        [CUR],
        [step(T + 180, V3["request"], "ok"), step(T + 181, V3["request"], "replay")],
    ),
    case("v3-rotation-new-secret", [NXT], [step(T + 240, V3R["request"], "ok")]),
    case(
        "v3-trigger-changed",
        [CUR],
        [step(T + 180, req(V3, set_header("X-Anarchon-Trigger", "scheduled")), "mismatch")],
        "v2 still matches, but a verifier that knows v3 checks v3",
    ),
    case(
        "v3-previous-changed",
        [CUR],
        [
            step(
                T + 180,
                req(V3, set_header("X-Anarchon-Previous-Scheduled-At", "2026-12-01T00:00:00Z")),
                "mismatch",
            )
        ],
    ),
    case(
        "v3-trigger-removed",
        [CUR],
        [step(T + 180, req(V3, set_header("X-Anarchon-Trigger", None)), "mismatch")],
    ),
    case(
        "v3-stripped",
        [CUR],
        [step(T + 180, req(V3, signature_of(V3["header"].split(",v3=")[0])), "malformed")],
        "X-Anarchon-Trigger with only v2 entries: never believed unsigned",
    ),
    case(
        "v3-previous-added-to-v2",
        [CUR],
        [
            step(
                T,
                req(A, add_header("X-Anarchon-Previous-Scheduled-At", "2026-12-02T15:00:00Z")),
                "malformed",
            )
        ],
    ),
    case(
        "retry-is-not-a-replay",
        [CUR],
        [step(T + 60, F["request"], "ok"), step(T + 61, RETRY["request"], "ok")],
        "the same run id with another attempt is another request",
    ),
]

ABOUT = (
    "Test vectors of X-Anarchon-Signature (README.md, 'Verifying the signature'). "
    "Strings are UTF-8: secrets and bodies are the UTF-8 bytes of the strings given. "
    "'signing': the header the sidecar sends for the given fields, time and secrets "
    "(current first); attempt null means X-Anarchon-Attempt is not sent, fence null "
    "that X-Anarchon-Fence is not sent; a case with trigger or previous also has "
    "canonical_v3 and v3 entries (null or absent: that header is not sent). "
    "'verify': one verifier per case (its secrets, "
    "its window in seconds) fed the steps in order; 'expect' is ok or the reason it "
    "refuses: malformed, expired, mismatch, replay. Headers are [name, value] pairs "
    "in the order sent."
)
# One line per header pair and per list of secrets.
SHORT_LIST = re.compile(r'\[\s*("(?:[^"\\]|\\.)*")(?:,\s*("(?:[^"\\]|\\.)*"))?\s*\]')


def main() -> None:
    doc = {"about": ABOUT, "signing": SIGNING, "verify": VERIFY}
    text = json.dumps(doc, indent=1, ensure_ascii=False)
    text = SHORT_LIST.sub(lambda m: "[" + ", ".join(g for g in m.groups() if g) + "]", text)
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
