"""A rolling update across releases: the previous release and this code on one stream.

The previous release is built from this repository's own history: its commit
id is recorded here (the tag is used to check it when the clone has tags; a
submission or a shallow mirror may carry none), ``git archive`` writes its
tree to a directory and ``pip install`` puts it in a venv of its own, kept
under ``.venv/`` between runs. Its sidecars run from a directory outside the
checkout, so that ``python -m sidecar`` imports the old package, not this one.

The fleet goes old, mixed, new, as a Kubernetes rolling update would, with
per-second jobs, leases, ``overlap: skip`` and an old runner killed while it
holds the overlap lock. The app is the witness: no slot runs twice, the
killed run is recorded ``lost`` exactly once, and ``history`` and ``status``
of both versions read what both wrote.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import nats
import pytest

from sidecar import __version__
from tests.support import (
    ROOT,
    NatsServer,
    RecordingApp,
    Sidecar,
    read_stream,
    sidecar_env,
    wait_for,
    write_config,
)

# The release before this code (CHANGELOG.md). Its commit id is what counts.
PREVIOUS_TAG = "v0.1.0"
PREVIOUS_VERSION = "0.1.0"
PREVIOUS_COMMIT = "3df10e2e30679a8d51006a9b853edeeab4434490"
TTL = "2s"


def git(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, input=stdin)


def cannot_run(why: str) -> None:
    """Skip saying why; under CI, where it must run, fail."""
    if os.environ.get("CI"):
        pytest.fail(f"the upgrade test cannot run under CI: {why}")
    pytest.skip(f"the upgrade test needs git: {why}")


def git_or_skip() -> None:
    """Skip (fail under CI) when git or the previous release's commit is not here."""
    if shutil.which("git") is None:
        cannot_run("git is not installed (make git-tool installs it, as root on Debian)")
    elif not (ROOT / ".git").exists():
        cannot_run("not a git checkout: the previous release is built from its commit")
    elif git("cat-file", "-e", f"{PREVIOUS_COMMIT}^{{commit}}").returncode != 0:
        cannot_run(
            f"commit {PREVIOUS_COMMIT} ({PREVIOUS_TAG}) is not in this clone; "
            "a shallow clone needs `git fetch --unshallow`"
        )


def previous_tree(dest: Path) -> None:
    """The previous release's files in `dest`, from its commit (checked against the tag)."""
    tagged = git("rev-parse", "--verify", "--quiet", f"refs/tags/{PREVIOUS_TAG}^{{commit}}")
    if tagged.returncode == 0:
        assert tagged.stdout.decode().strip() == PREVIOUS_COMMIT, (
            f"tag {PREVIOUS_TAG} points elsewhere than the commit recorded here"
        )
    archive = git("archive", "--format=tar", PREVIOUS_COMMIT)
    assert archive.returncode == 0, archive.stderr.decode()
    unpack(archive.stdout, dest)


def unpack(archive: bytes, dest: Path) -> None:
    """A tar archive of this repository's files into `dest` (made here).

    tarfile's `filter` argument came in Python 3.11.4, and Debian 12 ships
    3.11.2 (the README promises 3.11): without it, the members are checked
    here as its "data" filter would refuse the worst (no absolute path, no
    `..`, no link), which a `git archive` of this repository never holds.
    """
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
            return
        for member in tar.getmembers():
            name = Path(member.name)
            assert not name.is_absolute() and ".." not in name.parts, member.name
            assert not (member.issym() or member.islnk()), member.name
        tar.extractall(dest)  # checked above; this Python has no filter


def test_the_previous_release_unpacks_on_this_python(tmp_path: Path) -> None:
    """The unpacking of the previous release, without git: on Python 3.11.0 to
    3.11.3 too (tests/test_oldest_python.py runs it there)."""
    data = BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        body = b"name = 'old'\n"
        info = tarfile.TarInfo("src/sidecar/__init__.py")
        info.size = len(body)
        tar.addfile(info, BytesIO(body))
    unpack(data.getvalue(), tmp_path / "tree")
    assert (tmp_path / "tree" / "src" / "sidecar" / "__init__.py").read_bytes() == body


@pytest.fixture(scope="module")
def previous_python() -> Path:
    """The python of a venv holding the previous release (built once, then reused)."""
    home = ROOT / ".venv" / f"previous-{PREVIOUS_COMMIT[:12]}"
    python = home / "venv" / "bin" / "python"
    done = home / ".installed"
    git_or_skip()
    if not done.exists():
        subprocess.run(["rm", "-rf", str(home)], check=True)
        previous_tree(home / "src")
        subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
        pip = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", str(home / "src")],
            capture_output=True,
            text=True,
        )
        assert pip.returncode == 0, pip.stdout + pip.stderr
        done.touch()
    version = subprocess.run(
        [str(home / "venv" / "bin" / "anarchon-sidecar"), "--version"],
        capture_output=True,
        text=True,
        cwd=home,
    )
    assert version.stdout.strip() == f"anarchon-sidecar, version {PREVIOUS_VERSION}", version
    assert __version__ != PREVIOUS_VERSION
    return python


class OldSidecar(Sidecar):
    """A sidecar of the previous release, run from outside the checkout."""

    python: Path

    def command(self) -> list[str]:
        return [str(self.python), "-m", "sidecar"]

    @property
    def cwd(self) -> Path:  # type: ignore[override]
        return self.workdir  # outside the checkout


def cli(python: Path | None, workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command line of the previous release (`python`) or of this code (None)."""
    return subprocess.run(
        [str(python or sys.executable), "-m", "sidecar", *args],
        capture_output=True,
        text=True,
        env=sidecar_env(),
        timeout=60,
        cwd=workdir if python else ROOT,
    )


def job(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "schedule": "* * * * * *", "jitter": "200ms", "max_late": "3s", **extra}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[list[Sidecar]]:
    procs: list[Sidecar] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.proc and p.proc.poll() is None:
                p.proc.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.terminate(30)
            except Exception:
                p.kill()


async def put_foreign_key(url: str, bucket: str) -> None:
    """A key no released version knows, as a later release might add."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        await kv.put("zz-future.key", json.dumps({"from": "a later release", "n": 1}).encode())
    finally:
        await nc.close()


def test_rolling_update_from_the_previous_release_runs_no_slot_twice(
    tmp_path: Path,
    nats_server: NatsServer,
    http_app: RecordingApp,
    previous_python: Path,
    fleet: list[Sidecar],
) -> None:
    http_app.delay["/jobs/long"] = 2.5
    config = {
        "nats": {"servers": [nats_server.url], "lease_ttl": TTL},
        "target": {"url": http_app.url, "timeout": "20s"},
        "jobs": [job("tick"), job("long", overlap="skip")],
    }
    cfg = str(write_config(tmp_path / "cli.yaml", {"instance_id": "cli", **config}))

    def old(name: str) -> Sidecar:
        proc = OldSidecar(tmp_path, name, config, {})
        proc.python = previous_python
        fleet.append(proc)
        return proc.start()

    def new(name: str) -> Sidecar:
        proc = Sidecar(tmp_path, name, config, {})
        fleet.append(proc)
        return proc.start()

    def ran(path: str, instance: str | None = None) -> list[int]:
        return [
            int(r.headers["X-Anarchon-Slot"])
            for r in http_app.requests_for(path)
            if instance is None or r.headers.get("X-Anarchon-Instance") == instance
        ]

    def status(python: Path | None) -> dict[str, Any]:
        # 0.1.0's read of the bucket ends at nats-py's end marker even when it comes
        # before the values (on a loaded machine), and then shows an empty bucket: fixed
        # since (CHANGELOG; tests/store/test_watch_early_marker.py). Its status is read
        # again until it shows an instance; this code's, once.
        for _ in range(1 if python is None else 10):
            res = cli(python, tmp_path, "status", "-c", cfg, "--json")
            assert res.returncode == 0, res.stderr
            view = dict(json.loads(res.stdout))
            if view["instances"]:
                break
        return view

    started = time.time()
    # Old: two sidecars of the previous release.
    o1, o2 = old("old-1").wait_ready(), old("old-2").wait_ready()
    assert o1.metric("anarchon_build_info", {"version": PREVIOUS_VERSION}) == 1
    wait_for(lambda: len(ran("/jobs/tick")) >= 3, 20, what="the old fleet runs tick")

    # Mixed: one old replaced by a new one (a clean stop), a second new one.
    n1 = new("new-1").wait_ready()
    assert o2.terminate(40) == 0
    n2 = new("new-2").wait_ready()
    asyncio.run(put_foreign_key(nats_server.url, "CRON_STATE"))
    wait_for(
        lambda: len(ran("/jobs/tick", "new-1")) >= 2 and len(ran("/jobs/tick", "old-1")) >= 2,
        30,
        what="old and new both win tick slots",
    )
    # Both versions' status shows both versions, the foreign key changing nothing.
    mismatch = {}
    for name, python in (("old", previous_python), ("new", None)):
        view = status(python)
        versions = {i["id"]: i["version"] for i in view["instances"]}
        assert versions == {"old-1": PREVIOUS_VERSION, "new-1": __version__, "new-2": __version__}
        mismatch[name] = view["config_mismatch"]
    # One config everywhere: the new version sees no "settings differ" across versions;
    # 0.1.0 does, its job hashes holding the app's address (the changelog says so).
    assert mismatch == {"old": True, "new": False}
    assert n1.metric("anarchon_fleet_config_mismatch") == 0

    def running_long(instance: str) -> Any:
        # A run that began moments ago: one near its end (2.5 s) could be answered
        # and recorded before the kill lands, and would never be lost.
        return next(
            (
                r
                for r in http_app.requests_for("/jobs/long")
                if r.headers.get("X-Anarchon-Instance") == instance
                and not r.finished
                and time.time() - r.at < 0.5
            ),
            None,
        )

    def kill_while_running_long(*procs: Sidecar) -> tuple[Sidecar, Any, float]:
        """Kill the first of `procs` seen running `long` (holding its overlap lock, taken
        before the request is sent). Any of them: the claims' order can favour some
        sidecars for a minute (new-2 won no free slot of `long` in 60 s once)."""
        found = wait_for(
            lambda: next(((p, r) for p in procs if (r := running_long(p.name))), None),
            60,
            interval=0.02,
            what=f"one of {[p.name for p in procs]} running long",
        )
        proc, run = found
        assert proc.proc is not None
        at = time.time()
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait(10)
        # Not answered before the kill: its runner never had a result to record.
        assert not run.finished or run.finished > at, (run.at, run.finished, at)
        return proc, run, at

    def lost() -> list[dict[str, Any]]:
        return [
            m.data
            for m in read_stream(nats_server.url)
            if m.subject == "cron.long.results" and m.data.get("status") == "lost"
        ]

    # A new runner killed while old and new run: judged by whichever version sees it.
    killed_new, new_victim, _ = kill_while_running_long(n1, n2)
    survivor = n2 if killed_new is n1 else n1
    new_token = new_victim.headers["X-Anarchon-Run-Id"]
    wait_for(
        lambda: new_token in {r["token"] for r in lost()},
        15,
        interval=0.2,
        what="the killed new run recorded lost",
    )
    # The old runner killed while it holds the overlap lock of `long`.
    _, victim, killed_at = kill_while_running_long(o1)
    token = victim.headers["X-Anarchon-Run-Id"]
    wait_for(
        lambda: token in {r["token"] for r in lost()},
        15,
        interval=0.2,
        what="the killed old run recorded lost",
    )
    # New: a third new sidecar; the new fleet runs on.
    n3 = new("new-3").wait_ready()
    wait_for(
        lambda: sum(1 for s in ran("/jobs/long") if s / 1000 > killed_at) >= 2,
        30,
        what="long runs again after the kill",
    )
    tick_before = len(ran("/jobs/tick"))
    wait_for(lambda: len(ran("/jobs/tick")) >= tick_before + 3, 20, what="the new fleet runs")
    time.sleep(2.0)  # a second lost record, were there one, would be stored now
    hist = {
        name: cli(python, tmp_path, "history", "long", "-c", cfg, "--json", "--limit", "1000")
        for name, python in (("old", previous_python), ("new", None))
    }
    last = {
        name: cli(python, tmp_path, "last-run", "tick", "-c", cfg, "--json")
        for name, python in (("old", previous_python), ("new", None))
    }
    # The killed old runner's presence key lives out its TTL (it never deleted it):
    # wait for that, rather than read status at a moment that races the TTL.
    wait_for(
        lambda: {i["version"] for i in status(None)["instances"]} == {__version__},
        30,
        interval=0.5,
        what="the killed old instance gone from status",
    )
    new_status, old_status = status(None), status(previous_python)
    for p in (survivor, n3):
        assert p.terminate(40) == 0, p.log()
    ended = time.time()

    # 0 slots twice, on both jobs, across both versions.
    for path in ("/jobs/tick", "/jobs/long"):
        twice = {slot: n for slot, n in Counter(ran(path)).items() if n > 1}
        assert not twice, (path, twice)
    # tick ran on most seconds of the whole update (each runner change may miss one).
    ticks = {s for s in ran("/jobs/tick")}
    assert len(ticks) >= 0.8 * (ended - started - 6), (len(ticks), ended - started)
    assert {r.headers.get("User-Agent") for r in http_app.requests_for("/jobs/tick")} == {
        f"anarchon-sidecar/{PREVIOUS_VERSION}",
        f"anarchon-sidecar/{__version__}",
    }
    # Each killed run: lost exactly once; the old one judged by a new sidecar within
    # the lease, the new one by whichever of old-1 and the other new one stored its record.
    records = lost()
    assert [r["token"] for r in records] == [new_token, token], records
    assert [r["instance"] for r in records] == [killed_new.name, "old-1"]
    judged_new = records[0]["error"].rsplit("recorded by ", 1)[1]
    assert judged_new in ("old-1", survivor.name), records[0]
    assert "recorded by new-" in records[1]["error"]
    assert records[1]["slot"] == int(victim.headers["X-Anarchon-Slot"])
    stored_at = [
        m.time
        for m in read_stream(nats_server.url)
        if m.subject == "cron.long.results" and m.data.get("status") == "lost"
    ]
    assert stored_at[1] - killed_at <= 2.0 + 3.0
    # history and last-run of both versions read the runs of both.
    for name, res in hist.items():
        assert res.returncode == 0, (name, res.stderr)
        rows = [json.loads(line) for line in res.stdout.splitlines()]
        statuses = Counter(r["status"] for r in rows)
        assert statuses["lost"] == 2, (name, statuses)
        assert statuses["succeeded"] >= 2, (name, statuses)
        instances = {r["instance"] for r in rows}
        assert "old-1" in instances and instances & {"new-1", "new-2", "new-3"}, (name, rows)
        lost_slots = sorted(r["slot"] for r in rows if r["status"] == "lost")
        assert lost_slots == sorted(r["slot"] for r in records), (name, rows)
    for name, res in last.items():
        assert res.returncode == 0, (name, res.stderr)
        assert json.loads(res.stdout)["status"] == "succeeded", (name, res.stdout)
    for view in (new_status, old_status):
        assert {i["version"] for i in view["instances"]} == {__version__}
        assert not view["config_mismatch"]
        assert {j["name"] for j in view["jobs"]} == {"tick", "long"}
    assert os.path.exists(previous_python)


def test_job_hashes_are_compared_only_with_hashes_of_their_kind() -> None:
    from sidecar.store.digests import HASH_KIND, mismatched_jobs

    old = {"jobs": {"a": "with-address", "b": "b1"}}  # 0.1.0: no "digest"
    new = {"jobs": {"a": "without", "b": "b2"}, "digest": HASH_KIND}
    assert mismatched_jobs({"o": old, "n1": new, "n2": dict(new)}) == set()
    odd = {"jobs": {"a": "other", "b": "b2"}, "digest": HASH_KIND}
    assert mismatched_jobs({"o": old, "n1": new, "n3": odd}) == {"a"}
    assert mismatched_jobs({"o": old, "o2": {"jobs": {"a": "x", "b": "b1"}}}) == {"a"}
    hostile = {"jobs": {"a": "q"}, "digest": [1, {"x": 2}]}
    assert mismatched_jobs({"n1": new, "h": hostile}) == set()
