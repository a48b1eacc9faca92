"""Host names looked up without the idna codec (sidecar/core/hostnames.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.core.hostnames import ascii_host
from tests.support import ROOT, NatsServer, RecordingApp, base, job, sidecar_env, sidecars, wait_for

NAMES = [
    "nats",
    "nats.example.org",
    "nats.example.org.",  # a trailing dot: an empty last label
    "NATS-1.Example.ORG",  # kept as written: the codec does not fold ASCII
    "a" * 63 + ".org",
    "",
    "xn--bcher-kva.example",
]
# What the codec refuses (an empty or a too long label) or must encode itself.
REFUSED_OR_UNICODE = ["a..b", ".nats", "a" * 64 + ".org", "nats." + "b" * 64, "bücher.example"]


@pytest.mark.parametrize("name", NAMES)
def test_an_ascii_name_becomes_the_bytes_the_idna_codec_makes_of_it(name: str) -> None:
    assert ascii_host(name) == name.encode("idna")


@pytest.mark.parametrize("name", REFUSED_OR_UNICODE)
def test_any_other_name_is_left_to_the_codec_as_before(name: str) -> None:
    assert ascii_host(name) is name


@pytest.mark.parametrize("host", [None, b"nats"])
def test_what_is_not_text_is_passed_on(host: bytes | None) -> None:
    assert ascii_host(host) is host


# A connection by name to a real nats-server, as nats-py makes it (asyncio's
# open_connection), on asyncio's loop with and without skip_idna; then whether
# the idna codec was loaded. As a plain install has it: no aiohttp (bench/runtime.py).
CONNECT = """
import asyncio, sys
sys.modules["aiohttp"] = None
from sidecar.core.hostnames import skip_idna

async def main(port: int, skip: bool) -> None:
    if skip:
        skip_idna(asyncio.get_running_loop())
    reader, writer = await asyncio.open_connection("localhost", port)
    line = await reader.readline()
    writer.close()
    print(line.split()[0].decode(), "encodings.idna" in sys.modules)

asyncio.run(main(int(sys.argv[1]), sys.argv[2] == "skip"))
"""


def test_a_lookup_by_name_connects_without_loading_the_idna_codec(nats_server: NatsServer) -> None:
    def connect(mode: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", CONNECT, str(nats_server.port), mode],
            capture_output=True,
            text=True,
            env=sidecar_env(),
            cwd=ROOT,
            timeout=60,
            check=True,
        )
        return out.stdout.split()

    assert connect("skip") == ["INFO", "False"]
    assert connect("plain") == ["INFO", "True"]  # what every lookup by name cost before


def test_a_sidecar_that_names_nats_and_its_app_by_name_runs_its_jobs(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [job("tick")])
    config["nats"]["servers"] = [nats_server.url.replace("127.0.0.1", "localhost")]
    config["target"]["url"] = http_app.url.replace("127.0.0.1", "localhost")
    assert "localhost" in config["nats"]["servers"][0] and "localhost" in config["target"]["url"]
    with sidecars(tmp_path, [("named", config, {})]) as (proc,):
        wait_for(lambda: len(http_app.requests) >= 2, 20, what="two slots triggered")
        assert proc.terminate() == 0
