"""The role's podman method on a real host: Debian 13 (trixie), podman 5.4 with quadlet.

Debian 12's podman (4.3) has no quadlet, so this host is a trixie root
filesystem (debootstrap: systemd, python3 and podman; cached per machine like
the bookworm one) booted with systemd as PID 1. Its podman runs nested inside
this machine's podman, which needs `--privileged`, and vfs storage (written to
the host's /etc/containers/storage.conf before the role runs, as an admin
would configure storage). The sidecar image is built here from
deploy/Dockerfile, offline, on the bookworm host root filesystem (it has
python3-venv) with the wheelhouse, saved and loaded into the host: the role
is told not to pull (`anarchon_sidecar_podman_pull: false`).

One host is enough for what differs from the venv method (the quadlet, the
image's user, validation in a container, removal of the container); the
schedule, restarts and upgrades are the sidecar's and are proven in
test_role_on_hosts.py.
"""

from __future__ import annotations

import contextlib
import os
import resource
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.hosts.test_role_on_hosts import (
    CONFIG,
    CONFIG_TASK,
    PASSWORD,
    ROOT,
    SERVICE,
    SIGNING,
    Host,
    World,
    _interrupt,
    ansible_env,
    boot,
    build_wheelhouse,
    host_rootfs,
    nats_violations,
    remove_everything,
    restricted_nats,
    say,
    wait_for,
    write_inventory,
)
from tests.podman import podman
from tests.support import RecordingApp, free_port

pytestmark = pytest.mark.hosts

TRIXIE = "trixie"
TRIXIE_PACKAGES = (
    "systemd,systemd-sysv,dbus,python3,ca-certificates,podman,runc,netavark,iptables,fuse-overlayfs"
)
QUADLET = f"/etc/containers/systemd/{SERVICE}.container"
# podman cannot raise a limit above this machine's hard one (the role's default is 65536).
NOFILE = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
STORAGE_CONF = """\
[storage]
driver = "vfs"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
"""


def build_image(prefix: str, workdir: Path, wheelhouse: Path) -> str:
    """deploy/Dockerfile on the bookworm host root filesystem, from the wheelhouse."""
    ctx = workdir / "image-context"
    (ctx / "deploy").mkdir(parents=True)
    shutil.copytree(ROOT / "sidecar", ctx / "sidecar", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, ctx / name)
    for name in ("Dockerfile", "install-venv.sh"):
        shutil.copy2(ROOT / "deploy" / name, ctx / "deploy" / name)
    shutil.copytree(wheelhouse, ctx / "wheels")
    base, image = f"localhost/{prefix}-base:bookworm", f"localhost/{prefix}-sidecar:hosts"
    podman(
        "import", "--quiet", "--change", f"LABEL anarchon-hosts={prefix}",
        str(host_rootfs()), base, timeout=300,
    )  # fmt: skip
    podman(
        "build", "--pull=never", "--layers=false", "--label", f"anarchon-hosts={prefix}",
        "-f", str(ctx / "deploy" / "Dockerfile"), "--build-arg", f"PYTHON_IMAGE={base}",
        "-t", image, str(ctx), timeout=600,
    )  # fmt: skip
    return image


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, str]]:
    if os.geteuid() != 0 or not shutil.which("podman") or not shutil.which("debootstrap"):
        pytest.fail("the hosts test needs root, podman and debootstrap: run it with `make hosts`")
    prefix = f"anarchon-hosts-{secrets.token_hex(4)}"
    say(f"run prefix {prefix} (podman method, {TRIXIE})")
    old_term = signal.signal(signal.SIGTERM, _interrupt)
    workdir = tmp_path_factory.mktemp("podman-hosts")
    nats = restricted_nats(workdir / "nats")
    app = RecordingApp()
    started = time.monotonic()
    host = Host(f"{prefix}-h1", free_port())
    try:
        wheelhouse = build_wheelhouse(workdir / "wheelhouse")
        with ThreadPoolExecutor(1) as pool:
            built = pool.submit(build_image, prefix, workdir, wheelhouse)
            host_image = f"localhost/{prefix}-host:{TRIXIE}"
            podman(
                "import", "--quiet", "--change", f"LABEL anarchon-hosts={prefix}",
                str(host_rootfs(TRIXIE, TRIXIE_PACKAGES)), host_image, timeout=300,
            )  # fmt: skip
            image = built.result()
        say(f"images built: {time.monotonic() - started:.1f} s")
        boot(host.name, host_image, "--privileged")
        host.sh(f"printf '%s' '{STORAGE_CONF}' > /etc/containers/storage.conf")
        archive = workdir / "sidecar-image.tar"
        podman("save", "--quiet", "-o", str(archive), image, timeout=300)
        podman("cp", str(archive), f"{host.name}:/root/sidecar-image.tar", timeout=300)
        archive.unlink()
        host.sh(
            "podman load --quiet -i /root/sidecar-image.tar && rm /root/sidecar-image.tar",
            timeout=300,
        )
        versions = host.sh("systemctl --version | head -n 1; podman --version")
        say(f"host booted, image loaded ({versions}): {time.monotonic() - started:.1f} s")
        nats.start()
        app.start()
        write_inventory(workdir, [host], extra=f" anarchon_sidecar_limit_nofile={NOFILE}")
        world = World(workdir, [host], nats, app, wheelhouse, ansible_env(workdir))
        world.first_play = world.play(podman_vars(world, image))
        yield world, image
    finally:
        if sys.exc_info()[0] is not None:
            with contextlib.suppress(Exception):
                say(f"journal of {host.name}:\n{host.journal()[-4000:]}")
        app.stop()
        nats.stop()
        remove_everything(prefix)
        signal.signal(signal.SIGTERM, old_term)
        say(f"the podman-method run took {time.monotonic() - started:.1f} s")


def podman_vars(world: World, image: str, **overrides: object) -> dict[str, object]:
    return world.vars(
        anarchon_sidecar_install_method="podman",
        anarchon_sidecar_image=image,
        anarchon_sidecar_podman_pull=False,
        **overrides,
    )


def test_podman_method_converges_to_a_quadlet_service(site: tuple[World, str]) -> None:
    world, image = site
    play = world.first_play
    assert play is not None
    play.assert_ok()
    assert "failed to validate" not in play.task(CONFIG_TASK)
    (host,) = world.hosts
    wait_for(host.ready, 90, f"{host.name}: quadlet unit active and /readyz 200")
    assert host.sh(f"stat -c '%a %U %G' {QUADLET}") == "644 root root"
    assert host.sh(f"stat -c '%a %U %G' {CONFIG}") == f"640 root {SERVICE}"
    # The container runs as the service user of the host, not as root.
    uid = host.sh(f"id -u {SERVICE}")
    assert uid != "0"
    assert host.sh(f"podman exec {SERVICE} id -u") == uid
    assert host.sh(f"podman inspect --format '{{{{.ImageName}}}}' {SERVICE}") == image
    wait_for(lambda: "connected to NATS at" in host.journal(), 30, "journald shows it connected")
    since = time.time()
    wait_for(lambda: world.instances_since(since)[host.name] >= 2, 60, "ticks from the container")
    world.assert_no_slot_twice()


def test_podman_method_second_run_changes_nothing(site: tuple[World, str]) -> None:
    world, image = site
    play = world.play(podman_vars(world, image)).assert_ok()
    assert play.changed() == 0, play.output
    check = world.play(podman_vars(world, image), check=True).assert_ok()
    assert check.changed() == 0, check.output


def test_podman_method_keeps_secrets_out_of_output_quadlet_and_journal(
    site: tuple[World, str],
) -> None:
    world, _ = site
    (host,) = world.hosts
    for play in world.plays:
        assert PASSWORD not in play.output and SIGNING not in play.output
    for place in (
        host.sh(f"cat {QUADLET}"),
        host.sh(f"systemctl show {SERVICE}"),
        host.sh(f"podman inspect {SERVICE}"),
        host.sh("journalctl --no-pager -o cat", timeout=120),
    ):
        assert PASSWORD not in place and SIGNING not in place


def test_podman_method_state_absent_removes_the_container(site: tuple[World, str]) -> None:
    world, image = site
    (host,) = world.hosts
    play = world.play(podman_vars(world, image, anarchon_sidecar_state="absent")).assert_ok()
    assert play.changed() > 0
    assert host.sh(f"systemctl is-active {SERVICE}", check=False) in ("inactive", "unknown")
    assert host.sh("podman ps -a --format '{{.Names}}'") == ""
    for path in (QUADLET, CONFIG, "/etc/anarchon"):
        assert host.sh(f"test -e {path} || echo absent") == "absent", path
    assert host.sh(f"getent passwd {SERVICE} || echo absent") == "absent"
    again = world.play(podman_vars(world, image, anarchon_sidecar_state="absent")).assert_ok()
    assert again.changed() == 0, again.output
    # The container ran as the restricted user of deploy/nats/permissions.conf.
    assert not nats_violations(world.nats), nats_violations(world.nats)
