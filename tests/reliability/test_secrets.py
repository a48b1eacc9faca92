"""Secrets never show: NATS password and token, signing secret and next signing secret.

Sidecars run at debug level against nats-servers that require a password or
a token, with the secrets from files and from env; the secrets must appear
nowhere they could leak: logs (text and JSON), `check` output (also when the
config is wrong), `--help` of every command, the read commands, `/metrics`,
the stream itself, the processes' command lines, and the environment of the
sidecars given files. The signing secrets are in use all the while: every
trigger's v1 and v2 signatures verify, v2 with either secret.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import secrets
from pathlib import Path
from typing import Any

from tests.reliability.conftest import Figures
from tests.reliability.helpers import config, every_second, slot_of
from tests.support import (
    ROOT,
    NatsServer,
    RecordingApp,
    read_stream,
    run_cli,
    sidecars,
    wait_for,
    write_config,
)


def _secret(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(16)}"


def test_secrets_never_appear(tmp_path: Path, http_app: RecordingApp, figures: Figures) -> None:
    password, token, signing = _secret("pw"), _secret("tok"), _secret("sig")
    wrong, signing_next = _secret("wrongpw"), _secret("signext")
    secret_values = {
        "password": password,
        "token": token,
        "signing": signing,
        "signing next": signing_next,
        "wrong": wrong,
    }
    (tmp_path / "password").write_text(password + "\n")
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "signing").write_text(signing)
    (tmp_path / "signing-next").write_text(signing_next + "\n")
    pw_nats = NatsServer(
        tmp_path / "pw-nats",
        extra_conf=f'authorization {{ user: anarchon, password: "{password}" }}\n',
    )
    token_nats = NatsServer(
        tmp_path / "token-nats", extra_conf=f'authorization {{ token: "{token}" }}\n'
    )
    pw_nats.start()
    token_nats.start()
    outputs: dict[str, str] = {}
    try:
        job = every_second("tick", jitter="0s")
        from_files = config([pw_nats.url], http_app, [job], user="anarchon")
        from_files["nats"]["password_file"] = str(tmp_path / "password")
        from_files["target"]["signing_secret_file"] = str(tmp_path / "signing")
        from_files["target"]["signing_secret_next_file"] = str(tmp_path / "signing-next")
        from_env = config([pw_nats.url], http_app, [job], user="anarchon")
        with_token = config([token_nats.url], http_app, [every_second("tock", jitter="0s")])
        with_token["nats"]["token_file"] = str(tmp_path / "token")
        with_token["target"]["signing_secret_file"] = str(tmp_path / "signing")
        inline_token = config([token_nats.url], http_app, [every_second("tock")], token=token)
        inline_token["target"]["signing_secret_file"] = str(tmp_path / "signing")
        debug = {"ANARCHON_LOG_LEVEL": "debug"}
        env_secrets = {
            **debug,
            "ANARCHON_NATS_PASSWORD": password,
            "ANARCHON_SIGNING_SECRET": signing,
            "ANARCHON_SIGNING_SECRET_NEXT": signing_next,
            "ANARCHON_LOG_FORMAT": "json",
        }
        procs = [
            ("files", from_files, debug),
            ("env", from_env, env_secrets),
            ("token", with_token, debug),
            ("inline", inline_token, debug),
        ]
        with sidecars(tmp_path, procs) as running:
            wait_for(
                lambda: (
                    len(http_app.requests_for("/jobs/tick")) >= 3
                    and len(http_app.requests_for("/jobs/tock")) >= 3
                ),
                20,
                what="runs on both servers",
            )
            for p in running:
                outputs[f"/metrics {p.name}"] = p.get("/metrics")[1]
                outputs[f"/readyz {p.name}"] = p.get("/readyz")[1]
                assert p.proc is not None
                proc_dir = Path(f"/proc/{p.proc.pid}")
                outputs[f"cmdline {p.name}"] = proc_dir.joinpath("cmdline").read_text()
                if p.name != "env":  # given through the environment, it is there by design
                    outputs[f"environ {p.name}"] = proc_dir.joinpath("environ").read_text()
            for name, path in [(p.name, p.config_path) for p in running]:
                for args in (["history", "tick"], ["stream"], ["last-run", "tock", "--json"]):
                    res = run_cli("--log-level", "debug", *args, "-c", str(path), env=env_secrets)
                    outputs[f"{' '.join(args)} {name}"] = res.stdout + res.stderr
            codes = [p.terminate() for p in running]
            for p in running:
                outputs[f"log {p.name}"] = p.log()

        # --help of every command, with every secret in the environment.
        for command in ("", "run", "check", "history", "last-run", "run-now", "stream", "demo"):
            res = run_cli(*command.split(), "--help", env=env_secrets)
            assert res.returncode == 0, res.stderr
            outputs[f"--help {command}"] = res.stdout + res.stderr

        # Wrong password: exit 3 with a reason, and the wrong password is not in it.
        bad = config([pw_nats.url], http_app, [job], user="anarchon", connect_timeout="2s")
        bad["metrics"] = {"listen": "127.0.0.1:0"}
        res = run_cli(
            "--log-level",
            "debug",
            "run",
            "-c",
            str(write_config(tmp_path / "bad.yaml", bad)),
            env={"ANARCHON_NATS_PASSWORD": wrong},
        )
        outputs["run wrong password"] = res.stdout + res.stderr
        assert res.returncode == 3, res.stderr[-2000:]

        # `check` of every config, and of broken configs that hold a secret.
        broken: dict[str, dict[str, Any]] = {
            "token and user": {**inline_token, "nats": {**inline_token["nats"], "user": "x"}},
            "token under a typo": {**inline_token, "nats": {**inline_token["nats"], "tokn": token}},
            "token in a map": {
                **inline_token,
                "nats": {**inline_token["nats"], "token": {"value": [token]}},
            },
            "token in the url": {
                **inline_token,
                "nats": {**inline_token["nats"], "servers": [f"nats://u:{token}@127.0.0.1:1"]},
            },
            "token as a header": {
                **inline_token,
                "target": {**inline_token["target"], "headers": {"Authorization\n": token}},
            },
        }
        check_codes = {}
        for name, cfg in {
            "files": from_files,
            "env": from_env,
            "token": with_token,
            "inline": inline_token,
            **broken,
        }.items():
            path = write_config(tmp_path / f"check-{name.replace(' ', '-')}.yaml", cfg)
            res = run_cli("--log-level", "debug", "check", "-c", str(path), env=env_secrets)
            outputs[f"check {name}"] = res.stdout + res.stderr
            check_codes[name] = res.returncode
        stored = read_stream(pw_nats.url.replace("nats://", f"nats://anarchon:{password}@"))
        outputs["stream pw"] = repr([(m.headers, m.data) for m in stored])
    finally:
        pw_nats.stop()
        token_nats.stop()

    # The signing secrets were in use: every signature verifies (v2 with either secret).
    spec = importlib.util.spec_from_file_location("verify", ROOT / "docs/signing/verify.py")
    assert spec is not None and spec.loader is not None
    verify = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verify)
    with_next = {"files", "env"}
    verified = 0
    for r in http_app.requests:
        entries = [p.split("=", 1) for p in r.headers["X-Anarchon-Signature"].split(",")]
        t, v1 = dict(entries)["t"], dict(entries)["v1"]
        want = hmac.new(signing.encode(), f"{t}.".encode() + r.body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(v1, want), r.headers
        instance = r.headers["X-Anarchon-Instance"]
        keys = [signing, signing_next] if instance in with_next else [signing]
        assert [k for k, _ in entries].count("v2") == len(keys), r.headers
        for key in keys:
            verify.Verifier([key.encode()]).verify(
                r.method, r.path, list(r.headers.items()), r.body
            )
        verified += 1
    leaks = sorted(
        f"{what} in {where}"
        for where, text in outputs.items()
        for what, value in secret_values.items()
        if value in text
    )
    debug_lines = sum(
        text.count(" DEBUG ") + text.count('"level": "debug"')
        for where, text in outputs.items()
        if where.startswith("log ")
    )
    figures.report(
        "secrets",
        secrets=len(secret_values),
        places_checked=len(outputs),
        bytes_checked=sum(len(t) for t in outputs.values()),
        debug_lines=debug_lines,
        signatures_verified=verified,
        leaks=len(leaks),
    )
    assert codes == [0, 0, 0, 0]
    assert not leaks, leaks
    assert debug_lines > 0  # debug logging was really on
    assert verified >= 3 and {slot_of(r) for r in http_app.requests}
    assert check_codes == {
        "files": 0,
        "env": 0,
        "token": 0,
        "inline": 0,
        "token and user": 2,
        "token under a typo": 2,
        "token in a map": 2,
        "token in the url": 2,
        "token as a header": 2,
    }
