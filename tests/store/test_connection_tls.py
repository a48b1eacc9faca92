"""TLS means TLS: with a tls:// URL or a nats.tls section nothing is sent in clear.

A fake server that answers INFO without `tls_required` records every byte it
receives: no CONNECT, no password or token may arrive, on the first connect
and on reconnects. Real nats-servers with TLS (a throwaway CA made here) show
that the same client connects, upgrading also when TLS is only offered.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import logging
import socket
import socketserver
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sidecar.config.load import Secrets, parse_config
from sidecar.core.errors import ConnectError
from sidecar.store.connection import Connection
from tests.support import NatsServer, run_cli, wait_for, write_config

PASSWORD = "pw-Zq81-never-in-clear"
TOKEN = "tok-Hh27-never-in-clear"
USER = "sidecar"


# ------------------------------------------------------------------ fake server


class FakeServer(socketserver.ThreadingTCPServer):
    """Answers each connection with one plaintext INFO line and records what comes back."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, port: int, info: dict[str, Any]) -> None:
        self.info = info
        self.received: list[bytes] = []  # one entry per connection, complete once it closed
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def everything(self) -> bytes:
        with self.lock:
            return b"".join(self.received)

    def connections(self) -> int:
        with self.lock:
            return len(self.received)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(10)


class _Handler(socketserver.BaseRequestHandler):
    server: FakeServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(15)
        info = {"server_id": "FAKE", "version": "2.15.1", "max_payload": 1048576}
        info.update(self.server.info)
        sock.sendall(b"INFO " + json.dumps(info).encode() + b"\r\n")
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
                if got.startswith(b"\x16"):  # a TLS ClientHello: this fake speaks no TLS
                    break
        except OSError:
            pass
        with self.server.lock:
            self.server.received.append(got)


@pytest.fixture
def plaintext_server() -> Iterator[FakeServer]:
    server = FakeServer(0, {"auth_required": True})
    try:
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------ certificates


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A throwaway CA and a server certificate for 127.0.0.1, as PEM files."""
    out = tmp_path_factory.mktemp("certs")
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("anarchon test CA"))
        .issuer_name(_name("anarchon test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = {"ca": out / "ca.pem", "cert": out / "server.pem", "key": out / "server-key.pem"}
    files["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return {k: str(v) for k, v in files.items()}


def tls_server(tmp_path: Path, certs: dict[str, str], *, required: bool = True) -> NatsServer:
    """A real nats-server with TLS and a user/password; `required=False`: TLS only offered."""
    conf = (
        f"tls {{ cert_file: {certs['cert']!r}, key_file: {certs['key']!r} }}\n"
        f"authorization {{ user: {USER}, password: {PASSWORD!r} }}\n"
    )
    if not required:
        conf += "allow_non_tls: true\n"
    return NatsServer(tmp_path / "nats", extra_conf=conf)


def tls_versions(server: NatsServer) -> list[str]:
    """The TLS version of each client connection, as the server sees it ('' for none)."""
    url = f"http://127.0.0.1:{server.monitor_port}/connz"
    with urllib.request.urlopen(url, timeout=5) as resp:
        conns = json.load(resp)["connections"] or []
    return [str(c.get("tls_version", "")) for c in conns]


# ------------------------------------------------------------------ helpers


def nats_section(servers: list[str], **extra: Any) -> dict[str, Any]:
    return {"servers": servers, "connect_timeout": "3s", **extra}


def connection(nats: dict[str, Any], secrets: Secrets) -> Connection:
    config = parse_config({"nats": nats, "jobs": [{"name": "sync", "schedule": "* * * * *"}]}, {})
    return Connection(config, secrets)


async def until(condition: Callable[[], Any], timeout: float = 20.0, what: str = "") -> None:
    await asyncio.to_thread(wait_for, condition, timeout, 0.05, what)


def refusal(port: int) -> str:
    return (
        f"server 127.0.0.1:{port} did not offer TLS; refusing to send credentials or data in clear"
    )


def assert_nothing_in_clear(server: FakeServer) -> None:
    seen = server.everything()
    assert server.connections() >= 1
    assert b"CONNECT" not in seen, seen
    assert PASSWORD.encode() not in seen and TOKEN.encode() not in seen, seen
    assert seen == b"", seen  # not a byte after the plaintext INFO


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("how", "secrets", "auth"),
    [
        ("tls-url", Secrets(nats_password=PASSWORD), {"user": USER}),
        ("tls-section", Secrets(nats_password=PASSWORD), {"user": USER}),
        ("tls-url", Secrets(nats_token=TOKEN), {}),
        ("tls-section", Secrets(), {}),
    ],
)
async def test_a_server_without_tls_gets_no_connect(
    plaintext_server: FakeServer, how: str, secrets: Secrets, auth: dict[str, Any]
) -> None:
    port = plaintext_server.port
    if how == "tls-url":
        nats = nats_section([f"tls://127.0.0.1:{port}"], **auth)
    else:
        nats = nats_section([f"nats://127.0.0.1:{port}"], tls={}, **auth)
    conn = connection(nats, secrets)
    with pytest.raises(ConnectError) as caught:
        await conn.connect()
    url = nats["servers"][0]
    assert str(caught.value) == f"cannot connect to NATS at {url}: {refusal(port)}"
    await until(lambda: plaintext_server.connections() >= 2, what="both attempts closed")
    assert_nothing_in_clear(plaintext_server)


async def test_without_tls_configured_the_same_server_gets_connect(
    plaintext_server: FakeServer,
) -> None:
    """The fake can tell: a client not asked for TLS sends CONNECT with the password."""
    port = plaintext_server.port
    conn = connection(
        nats_section([f"nats://127.0.0.1:{port}"], user=USER, connect_timeout="1s"),
        Secrets(nats_password=PASSWORD),
    )
    with pytest.raises(ConnectError):  # the fake never answers PONG
        await conn.connect()
    await until(lambda: plaintext_server.connections() >= 1, what="a closed connection")
    assert b"CONNECT" in plaintext_server.everything()
    assert PASSWORD.encode() in plaintext_server.everything()


async def test_tls_offered_but_not_required_is_upgraded() -> None:
    """With `tls_available` the client starts TLS: a ClientHello arrives, never CONNECT."""
    server = FakeServer(0, {"tls_available": True, "auth_required": True})
    try:
        port = server.port
        conn = connection(
            nats_section([f"tls://127.0.0.1:{port}"], user=USER), Secrets(nats_password=PASSWORD)
        )
        with pytest.raises(ConnectError, match=f"cannot connect to NATS at tls://127.0.0.1:{port}"):
            await conn.connect()
        await until(lambda: server.connections() >= 1, what="a closed connection")
        seen = server.everything()
        assert seen.startswith(b"\x16\x03"), seen[:20]  # a TLS handshake record
        assert b"CONNECT" not in seen and PASSWORD.encode() not in seen
    finally:
        server.stop()


def test_cli_stream_exits_3_with_one_clear_line(
    plaintext_server: FakeServer, tmp_path: Path
) -> None:
    port = plaintext_server.port
    secret_file = tmp_path / "nats-password"
    secret_file.write_text(PASSWORD + "\n")
    path = write_config(
        tmp_path / "sidecar.yaml",
        {
            "instance_id": "web-1",
            "nats": nats_section(
                [f"tls://127.0.0.1:{port}"], user=USER, password_file=str(secret_file)
            ),
            "jobs": [{"name": "sync", "schedule": "* * * * *"}],
        },
    )
    res = run_cli("stream", "-c", str(path))
    assert res.returncode == 3, res.stderr
    assert "Traceback" not in res.stderr
    assert PASSWORD not in res.stderr and PASSWORD not in res.stdout
    last = res.stderr.strip().splitlines()[-1]
    assert last == (
        f"anarchon-sidecar: cannot connect to NATS at tls://127.0.0.1:{port}: {refusal(port)}"
    )
    wait_for(lambda: plaintext_server.connections() >= 2, 20, what="both attempts closed")
    assert_nothing_in_clear(plaintext_server)


# ------------------------------------------------------------------ real TLS servers


@pytest.mark.parametrize("required", [True, False], ids=["tls-required", "tls-offered"])
async def test_connects_to_a_real_tls_server(
    tmp_path: Path, certs: dict[str, str], required: bool
) -> None:
    server = tls_server(tmp_path, certs, required=required)
    await asyncio.to_thread(server.start)
    scheme = "tls" if required else "nats"  # the section alone asks for TLS too
    conn = connection(
        nats_section(
            [f"{scheme}://127.0.0.1:{server.port}"], user=USER, tls={"ca_file": certs["ca"]}
        ),
        Secrets(nats_password=PASSWORD),
    )
    try:
        nc = await conn.connect()
        await nc.flush(timeout=5)
        assert (await nc.jetstream().account_info()).streams == 0
        versions = await asyncio.to_thread(tls_versions, server)
        assert len(versions) == 1 and versions[0].startswith("1."), versions
    finally:
        await conn.close(drain=False)
        await asyncio.to_thread(server.stop)


async def test_every_reconnect_refuses_plaintext(
    tmp_path: Path,
    certs: dict[str, str],
    plaintext_server: FakeServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A second server speaks no TLS; then the real one goes away and an impostor takes
    its port. Every attempt to either is refused, the client keeps trying, and it is
    back on the real server as soon as that returns."""
    caplog.set_level(logging.WARNING, logger="sidecar.store.connection")
    server = tls_server(tmp_path, certs)
    await asyncio.to_thread(server.start)
    servers = [f"tls://127.0.0.1:{p}" for p in (server.port, plaintext_server.port)]
    conn = connection(
        nats_section(servers, user=USER, tls={"ca_file": certs["ca"]}),
        Secrets(nats_password=PASSWORD),
    )
    try:
        await conn.connect()
        await asyncio.to_thread(server.stop)
        await until(lambda: not conn.connected.is_set(), what="disconnected")
        before = plaintext_server.connections()
        impostor = FakeServer(server.port, {"auth_required": True})
        try:
            await until(lambda: impostor.connections() >= 2, what="two attempts at the impostor")
        finally:
            impostor.stop()
        await until(lambda: plaintext_server.connections() >= before + 2, what="and at the other")
        assert_nothing_in_clear(impostor)
        assert_nothing_in_clear(plaintext_server)
        for port in (server.port, plaintext_server.port):
            assert f"nats: {refusal(port)}" in caplog.messages
        assert PASSWORD not in caplog.text
        await asyncio.to_thread(server.start)
        await until(conn.connected.is_set, what="reconnected to the real server")
        versions = await asyncio.to_thread(tls_versions, server)
        assert len(versions) == 1 and versions[0].startswith("1."), versions
    finally:
        await conn.close(drain=False)
        await asyncio.to_thread(server.stop)


async def test_a_certificate_from_an_unknown_ca_fails_the_connect(
    tmp_path: Path, certs: dict[str, str]
) -> None:
    """Without our CA the handshake fails; the first connect gives up instead of hanging."""
    server = tls_server(tmp_path, certs)
    await asyncio.to_thread(server.start)
    url = f"tls://127.0.0.1:{server.port}"
    conn = connection(nats_section([url], user=USER), Secrets(nats_password=PASSWORD))
    try:
        with pytest.raises(ConnectError) as caught:
            await asyncio.wait_for(conn.connect(), 60)
        assert str(caught.value).startswith(
            f"cannot connect to NATS at {url}: SSLCertVerificationError: "
        ), str(caught.value)
    finally:
        await asyncio.to_thread(server.stop)
