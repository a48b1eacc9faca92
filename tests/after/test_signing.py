"""Trigger signatures (sidecar/after/signing.py), the test vectors and the sample verifiers.

docs/signing/vectors.json was computed with hmac/hashlib directly, not with
sidecar.after.signing; the sidecar must reproduce it, and the Python, Go and
JavaScript verifiers of docs/signing must reach its expected verdicts. The
verifiers are also fed requests exactly as a real sidecar sent them over a
socket (a raw recording server, so the request target is the one on the wire).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sidecar.after.signing import SignedFields, Signer, canonical_v2, canonical_v3, signature
from sidecar.config.load import ConfigError, load_secrets, parse_config
from sidecar.core.clock import Clock
from sidecar.run.trigger import Trigger, Why
from tests.support import ROOT, free_port, run_cli, wait_for

SIGNING_DOCS = ROOT / "docs" / "signing"
VECTORS = json.loads((SIGNING_DOCS / "vectors.json").read_text(encoding="utf-8"))
SIGNING_CASES = VECTORS["signing"]


def fields_of(case: dict[str, Any]) -> SignedFields:
    f = case["fields"]
    return SignedFields(
        method=f["method"],
        target=f["target"],
        job=f["job"],
        slot=f["slot"],
        run_id=f["run_id"],
        body=f["body"].encode(),
        attempt=1 if f["attempt"] is None else f["attempt"],
        fence=f["fence"],
        trigger=f.get("trigger"),
        previous=f.get("previous"),
    )


def expected_verdicts(vectors: dict[str, Any]) -> list[str]:
    return [
        f"{case['name']} {i} {step['expect']}"
        for case in vectors["verify"]
        for i, step in enumerate(case["steps"])
    ]


# ----------------------------------------------------------- the sidecar side


@pytest.mark.parametrize("case", SIGNING_CASES, ids=[c["name"] for c in SIGNING_CASES])
def test_sidecar_reproduces_the_vectors(case: dict[str, Any]) -> None:
    fields = fields_of(case)
    assert canonical_v2(case["t"], fields) == case["canonical"].encode()
    if "canonical_v3" in case:
        assert canonical_v3(case["t"], fields) == case["canonical_v3"].encode()
    else:
        assert not fields.has_v3
    secrets = [s.encode() for s in case["secrets"]]
    signer = Signer.of(secrets[0], secrets[1] if len(secrets) > 1 else None, v1=case["v1"])
    assert signer is not None
    assert signer.header(case["t"], fields) == case["header"]


def test_vectors_file_is_what_its_generator_writes() -> None:
    # make_vectors.py computes them without the sidecar's code; the file must be its output.
    proc = subprocess.run(
        [sys.executable, str(SIGNING_DOCS / "make_vectors.py")],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert proc.stdout == (SIGNING_DOCS / "vectors.json").read_bytes()


def test_vectors_cover_rotation_v1_switch_attempt_and_fence() -> None:
    assert any(len(c["secrets"]) == 2 and c["v1"] for c in SIGNING_CASES)
    assert any(not c["v1"] for c in SIGNING_CASES)
    assert any(c["fields"]["attempt"] not in (None, 1) for c in SIGNING_CASES)
    assert any(c["fields"]["fence"] is not None for c in SIGNING_CASES)
    reasons = {step["expect"] for c in VECTORS["verify"] for step in c["steps"]}
    assert reasons == {"ok", "malformed", "expired", "mismatch", "replay"}


def test_v1_signature_is_unchanged() -> None:
    # The first scheme, for verifiers written before v2: HMAC of "<t>.<body>".
    for case in SIGNING_CASES:
        if case["v1"]:
            v1 = signature(case["secrets"][0].encode(), case["t"], case["fields"]["body"].encode())
            assert case["header"].startswith(v1 + ",v2=")
    assert signature(b"k", 1, b"") == "t=1,v1=" + hmac.new(b"k", b"1.", hashlib.sha256).hexdigest()


def test_rotation_sends_current_then_next_and_v1_only_with_current() -> None:
    fields = fields_of(SIGNING_CASES[0])
    signer = Signer.of(b"cur", b"nxt")
    assert signer is not None
    parts = signer.header(100, fields).split(",")
    assert [p.split("=")[0] for p in parts] == ["t", "v1", "v2", "v2"]
    only_cur = Signer.of(b"cur")
    only_next = Signer.of(b"nxt", v1=False)
    assert only_cur is not None and only_next is not None
    assert parts[1:3] == only_cur.header(100, fields).split(",")[1:]
    assert parts[3] == only_next.header(100, fields).split(",")[1]
    # The same secret twice is sent once; no current secret, no signer.
    same = Signer.of(b"cur", b"cur")
    assert same is not None and same.secrets == (b"cur",)
    assert Signer.of(None, b"nxt") is None


def test_signer_and_secrets_never_show_a_secret() -> None:
    signer = Signer.of(b"topsecret-current", b"topsecret-next")
    text = repr(signer) + str(signer)
    assert "topsecret" not in text and "2 set" in text


@pytest.mark.parametrize("bad", ["/a\nb", "/a\rb"])
def test_canonical_form_refuses_cr_and_lf(bad: str) -> None:
    with pytest.raises(ValueError, match="CR or LF"):
        canonical_v2(1, SignedFields("POST", bad, "j", 1, "r", b""))


# ------------------------------------------------------------------- config


def target_config(target: dict[str, Any], **job_request: Any) -> Any:
    return parse_config(
        {
            "target": target,
            "jobs": [{"name": "sync", "schedule": "* * * * *", "request": job_request}],
        },
        {},
    )


def test_config_signing_keys(tmp_path: Path) -> None:
    cur, nxt = tmp_path / "cur", tmp_path / "next"
    cur.write_bytes(b"current\n")
    nxt.write_bytes(b"next\n")
    config = target_config(
        {"signing_secret_file": str(cur), "signing_secret_next_file": str(nxt), "signing_v1": False}
    )
    assert config.target.signing_v1 is False
    secrets = load_secrets(config, {})
    assert (secrets.signing_secret, secrets.signing_secret_next) == (b"current", b"next")
    assert "current" not in repr(secrets) and "next'" not in repr(secrets)
    assert "signing_secret_next=<set>" in repr(secrets)
    assert target_config({}).target.signing_v1 is True
    # From the environment, like the current secret.
    env = {"ANARCHON_SIGNING_SECRET": "a", "ANARCHON_SIGNING_SECRET_NEXT": "b"}
    secrets = load_secrets(target_config({}), env)
    assert (secrets.signing_secret, secrets.signing_secret_next) == (b"a", b"b")


def test_config_next_secret_needs_a_current_one(tmp_path: Path) -> None:
    nxt = tmp_path / "next"
    nxt.write_text("next")
    config = target_config({"signing_secret_next_file": str(nxt)})
    with pytest.raises(ConfigError) as err:
        load_secrets(config, {})
    assert err.value.key == "target.signing_secret_next_file"
    with pytest.raises(ConfigError) as err:
        load_secrets(target_config({}), {"ANARCHON_SIGNING_SECRET_NEXT": "b"})
    assert err.value.key == "target.signing_secret_next_file"


def test_config_signing_v1_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError) as err:
        target_config({"signing_v1": "no"})
    assert err.value.key == "target.signing_v1"


@pytest.mark.parametrize("path", ["/jobs/ä", "/jobs/sync#frag"])
def test_config_path_must_go_on_the_wire_as_written(path: str) -> None:
    with pytest.raises(ConfigError) as err:
        target_config({}, path=path)
    assert err.value.key == "jobs[0].request.path"
    assert "percent-encode" in str(err.value)


@pytest.mark.parametrize(
    ("target", "env", "shown"),
    [
        ({"signing_secret_file": "CUR", "signing_secret_next_file": "NEXT"}, {}, "v1+v2+v3 keys=2"),
        ({"signing_v1": False}, {"ANARCHON_SIGNING_SECRET": "env-secret-value"}, "v2+v3 keys=1"),
        ({}, {}, "off"),
    ],
    ids=["rotation", "env", "off"],
)
def test_start_line_says_how_triggers_are_signed(
    tmp_path: Path, target: dict[str, Any], env: dict[str, str], shown: str
) -> None:
    # After step 1 of a rotation, the log shows both keys are in use; never a key.
    (tmp_path / "cur").write_text("cur-secret-value")
    (tmp_path / "next").write_text("next-secret-value")
    files = {"CUR": str(tmp_path / "cur"), "NEXT": str(tmp_path / "next")}
    target = {k: files.get(v, v) if isinstance(v, str) else v for k, v in target.items()}
    config = tmp_path / "c.yaml"
    config.write_text(
        json.dumps(
            {
                "nats": {"servers": f"nats://127.0.0.1:{free_port()}", "connect_timeout": "200ms"},
                "metrics": {"listen": "127.0.0.1:0"},
                "target": target,
                "jobs": [{"name": "sync", "schedule": "* * * * *"}],
            }
        )
    )
    res = run_cli("run", "-c", str(config), env=env, timeout=60)
    assert res.returncode == 3, res.stderr  # NATS is not there
    (line,) = [line for line in res.stderr.splitlines() if "starting:" in line]
    assert line.endswith(f"signing={shown}"), line
    assert "secret-value" not in res.stderr


# --------------------------------------------------------------- verifiers


def python_verifier() -> ModuleType:
    spec = importlib.util.spec_from_file_location("anarchon_verify", SIGNING_DOCS / "verify.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_verifier(language: str, vectors_file: Path, tmp_path: Path) -> list[str]:
    """The verdict lines of the `language` verifier run on `vectors_file`."""
    if language == "python":
        args = ["python3", str(SIGNING_DOCS / "verify.py"), str(vectors_file)]
        env = dict(os.environ)
    elif language == "go":
        if shutil.which("go") is None:
            pytest.skip("go is not installed (Debian: apt-get install golang-go; `make unit` does)")
        args = ["go", "run", str(SIGNING_DOCS / "verify.go"), str(vectors_file)]
        env = dict(os.environ, GOFLAGS="-mod=mod", GO111MODULE="auto", GOTOOLCHAIN="local")
        if not os.access(Path.home(), os.W_OK):
            env["GOCACHE"] = str(tmp_path / "gocache")
    else:
        if shutil.which("node") is None:
            pytest.skip("node is not installed (Debian: apt-get install nodejs; `make unit` does)")
        args = ["node", str(SIGNING_DOCS / "verify.js"), str(vectors_file)]
        env = dict(os.environ)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=170, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


LANGUAGES = ["python", "go", "javascript"]


@pytest.mark.parametrize("language", LANGUAGES)
def test_verifier_reaches_the_vectors_verdicts(language: str, tmp_path: Path) -> None:
    got = run_verifier(language, SIGNING_DOCS / "vectors.json", tmp_path)
    assert got == expected_verdicts(VECTORS)


def test_python_verifier_imported_as_apps_would() -> None:
    verify = python_verifier()
    case = SIGNING_CASES[0]
    req = case["request"]
    verifier = verify.Verifier([b"current-secret-2026"])
    pairs = [tuple(p) for p in req["headers"]]
    verifier.verify(req["method"], req["target"], pairs, req["body"].encode(), case["t"])
    with pytest.raises(verify.SignatureError) as err:
        verifier.verify(req["method"], req["target"], pairs, req["body"].encode(), case["t"])
    assert err.value.reason == "replay"


# ------------------------------------------------- what a real sidecar sends


class RawApp:
    """Records each request exactly as it came over the socket; answers 200."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ")
        pairs = [line.split(":", 1) for line in lines[1:] if line]
        headers = [[name, value.strip()] for name, value in pairs]
        length = int(next((v for n, v in headers if n.lower() == "content-length"), "0"))
        body = await reader.readexactly(length)
        self.requests.append(
            {"method": method, "target": target, "headers": headers, "body": body.decode()}
        )
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@pytest.mark.parametrize("language", LANGUAGES)
async def test_verifiers_accept_what_the_sidecar_sends(language: str, tmp_path: Path) -> None:
    current, nxt = b"live-current", b"live-next"
    jobs = [
        {"name": "sync", "schedule": "* * * * *", "request": {"body": '{"full": false}'}},
        {
            "name": "report",
            "schedule": "* * * * *",
            # Dot segments and percent-escapes must reach the app as signed.
            "request": {"method": "GET", "path": "/jobs/a/../b%7E?q=%2F&x=1"},
        },
    ]
    raw = RawApp()
    async with raw as url:
        config = parse_config({"target": {"url": url}, "jobs": jobs}, {})
        async with Trigger(Signer.of(current, nxt), Clock(), "web-1") as trigger:
            for n, job in enumerate(config.jobs):
                deadline = time.monotonic() + 30
                # The first with the v3 headers (and v3), the second without (v2 only).
                why = Why("catchup", "2026-12-02T15:30:00.000Z") if n == 0 else None
                result = await trigger.fire(job, 1_796_227_910_000, f"run{n}", deadline, why=why)
                assert result.ok, result.error
    sent = raw.requests
    assert [r["target"] for r in sent] == ["/jobs/sync", "/jobs/a/../b%7E?q=%2F&x=1"]
    assert ["X-Anarchon-Trigger", "catchup"] in sent[0]["headers"]
    assert ",v3=" in dict(sent[0]["headers"])["X-Anarchon-Signature"]
    assert ",v3=" not in dict(sent[1]["headers"])["X-Anarchon-Signature"]
    now = int(time.time())
    tampered = json.loads(json.dumps(sent[0]))
    tampered["target"] = "/jobs/report"
    steps = [{"now": now, "request": r, "expect": "ok"} for r in sent]
    retold = json.loads(json.dumps(sent[0]))  # a catch-up passed off as scheduled
    retold["headers"] = [
        [n, "scheduled" if n == "X-Anarchon-Trigger" else v] for n, v in retold["headers"]
    ]
    steps += [
        {"now": now, "request": sent[0], "expect": "replay"},
        {"now": now, "request": tampered, "expect": "mismatch"},
        {"now": now, "request": retold, "expect": "mismatch"},
    ]
    live = {
        "verify": [
            {"name": "current", "secrets": ["live-current"], "window": 300, "steps": steps},
            {"name": "next", "secrets": ["live-next"], "window": 300, "steps": steps},
            {"name": "other", "secrets": ["nope"], "window": 300, "steps": steps[:1]},
        ]
    }
    live["verify"][2]["steps"] = [{**steps[0], "expect": "mismatch"}]
    path = tmp_path / "live.json"
    path.write_text(json.dumps(live))
    assert run_verifier(language, path, tmp_path) == expected_verdicts(live)


async def test_v1_can_be_switched_off_on_the_wire(tmp_path: Path) -> None:
    raw = RawApp()
    async with raw as url:
        config = parse_config(
            {"target": {"url": url}, "jobs": [{"name": "sync", "schedule": "* * * * *"}]}, {}
        )
        async with Trigger(Signer.of(b"k", v1=False), Clock()) as trigger:
            assert (await trigger.fire(config.jobs[0], 1, "r", time.monotonic() + 30)).ok
    (req,) = raw.requests
    (header,) = [v for n, v in req["headers"] if n.lower() == "x-anarchon-signature"]
    assert [p.split("=")[0] for p in header.split(",")] == ["t", "v2"]


def test_the_trigger_doc_example_is_the_first_vector() -> None:
    readme = (ROOT / "docs" / "TRIGGER.md").read_text()
    case = SIGNING_CASES[0]
    assert f"X-Anarchon-Signature: {case['header']}\n" in readme
    assert "```text\n" + case["canonical"] + "\n```" in readme
    assert f"`{case['secrets'][0]}`" in readme


# ------------------------------------------- the example app of deploy/compose


def test_example_app_carries_the_python_verifier_unchanged() -> None:
    copy = ROOT / "deploy" / "example-app" / "anarchon_verify.py"
    assert copy.read_bytes() == (SIGNING_DOCS / "verify.py").read_bytes()


@pytest.fixture
def example_app(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """deploy/example-app/app.py with the current secret and a next-secret path."""
    port = free_port()
    (tmp_path / "current").write_bytes(b"app-current\n")
    env = dict(
        os.environ,
        HOST="127.0.0.1",
        PORT=str(port),
        SIGNING_SECRET_FILE=str(tmp_path / "current"),
        SIGNING_SECRET_NEXT_FILE=str(tmp_path / "next"),
    )
    app = ROOT / "deploy" / "example-app" / "app.py"
    proc = subprocess.Popen([sys.executable, str(app)], env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
                return resp.status == 200

        wait_for(healthy, timeout=20, what="the example app")
        yield url, tmp_path
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def post(url: str, path: str, headers: dict[str, str], body: bytes) -> int:
    req = urllib.request.Request(url + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)


async def test_example_app_checks_v2_refuses_replays_and_follows_rotation(
    example_app: tuple[str, Path],
) -> None:
    url, _ = example_app
    config = parse_config(
        {"target": {"url": url}, "jobs": [{"name": "sync", "schedule": "* * * * *"}]}, {}
    )
    job = config.jobs[0]
    # A real trigger, signed with the app's secret and a next one it does not know yet.
    async with Trigger(Signer.of(b"app-current", b"app-next"), Clock()) as trigger:
        assert (await trigger.fire(job, 1, "run-a", time.monotonic() + 30)).ok
        headers = trigger.headers(job, 2, "run-b", b"")
    assert await asyncio.to_thread(post, url, "/jobs/sync", headers, b"") == 200
    # The same request again: a replay.
    assert await asyncio.to_thread(post, url, "/jobs/sync", headers, b"") == 401
    tampered = {**headers, "X-Anarchon-Run-Id": "x"}
    assert await asyncio.to_thread(post, url, "/jobs/other", tampered, b"") == 401
    # Rotation done on the sidecar's side first: signed with the next secret only.
    async with Trigger(Signer.of(b"app-next"), Clock()) as trigger:
        assert not (await trigger.fire(job, 3, "run-c", time.monotonic() + 30)).ok
    runs = await asyncio.to_thread(get_json, url + "/runs")
    assert [r["signature"] for r in runs] == [
        "valid",
        "valid",
        "invalid: replay",
        "invalid: mismatch",
        "invalid: mismatch",
    ]
