"""deploy/ and docs/DEPLOY.md, checked offline with the real tools.

hadolint lints the Dockerfiles, check-jsonschema validates the compose file
against the compose spec, kubernetes-validate (strict) every Kubernetes
manifest, nats-server `-t` every NATS config, promtool the compose Prometheus
config with the shipped rules, and `python -m sidecar check` every sidecar
config that compose mounts or a kustomization turns into a ConfigMap. The
image's install is run for real: deploy/install-venv.sh, the script the
Dockerfile's builder stage runs, into a clean venv, online and from wheels.
Each tool also gets one input it must reject, so a check that silently does
nothing fails. Where kustomize (or kubectl) is installed the overlays are also
built and the result validated; without it, the kustomization files are
checked for completeness instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

import sidecar
from sidecar.config.load import Config, load_config
from tests.support import anonymous_connect, free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
APP_DOCKERFILE = DEPLOY / "example-app" / "Dockerfile"
# Each Dockerfile with the build context its header documents.
DOCKERFILES = {DOCKERFILE: ROOT, APP_DOCKERFILE: DEPLOY / "example-app"}
INSTALL_SCRIPT = DEPLOY / "install-venv.sh"
COMPOSE_DIR = DEPLOY / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
K8S = DEPLOY / "k8s"
DEPLOY_DOC = ROOT / "docs" / "DEPLOY.md"

# The path the image's CMD reads, and where compose and Kubernetes mount it.
CONFIG_IN_IMAGE = "/etc/anarchon/sidecar.yaml"
SIDECAR_CONFIGMAP = "anarchon-sidecar-config"
# Kinds without a schema in kubernetes-validate: reported, not failed.
CUSTOM_KINDS = {"PodMonitor"}
# The oldest Kubernetes with native sidecars on by default, and the newest
# version kubernetes-validate ships (its default).
K8S_VERSIONS = ["1.29.0", None]


# ---------------------------------------------------------------- helpers


def tool(name: str) -> str:
    """An executable of the dev extra (in this venv), else from PATH."""
    found = shutil.which(name, path=sysconfig.get_path("scripts")) or shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found: run `make install` (the dev extra provides it)")
    return found


def run(
    args: list[str], *, timeout: float = 120, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_yaml_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def config_of(path: Path) -> Config:
    """A sidecar config parsed by the sidecar's own loader, without env overrides."""
    return load_config(str(path), {})


# ------------------------------------------------------------ Dockerfile


Instruction = tuple[str, str]  # (KEYWORD, arguments)


def dockerfile_stages(path: Path) -> tuple[list[Instruction], list[list[Instruction]]]:
    """The instructions before the first FROM, and those of each stage (FROM first)."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # also comment lines inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, f"{path}: the last instruction ends with a line continuation"
    preamble: list[Instruction] = []
    stages: list[list[Instruction]] = []
    for text in logical:
        keyword, _, args = text.partition(" ")
        instruction = (keyword.upper(), args.strip())
        if instruction[0] == "FROM":
            stages.append([instruction])
        elif stages:
            stages[-1].append(instruction)
        else:
            preamble.append(instruction)
    return preamble, stages


def args_of(stage: list[Instruction], keyword: str) -> list[str]:
    return [args for kw, args in stage if kw == keyword]


def copy_sources(args: str) -> tuple[list[str], str]:
    """COPY's sources and destination, without its --flags."""
    parts = [part for part in args.split() if not part.startswith("--")]
    return parts[:-1], parts[-1]


@pytest.mark.parametrize("dockerfile", list(DOCKERFILES), ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_clean(dockerfile: Path) -> None:
    # The strictest threshold: any finding, style included, fails.
    proc = run([tool("hadolint"), "--no-color", "--failure-threshold", "style", str(dockerfile)])
    assert proc.returncode == 0 and not proc.stdout.strip(), output(proc)


def test_hadolint_rejects_a_sloppy_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y gcc\n")
    proc = run([tool("hadolint"), "--no-color", "--failure-threshold", "style", str(bad)])
    assert proc.returncode != 0, output(proc)
    assert "DL3006" in proc.stdout, output(proc)  # untagged base image


def test_dockerfile_runtime_stage() -> None:
    preamble, stages = dockerfile_stages(DOCKERFILE)
    assert ("ARG", "PYTHON_IMAGE=python:3.12-slim") in preamble
    assert len(stages) >= 2, "a builder stage and a runtime stage"
    for stage in stages:
        assert stage[0][1].split()[0] == "${PYTHON_IMAGE}", stage[0]

    runtime = stages[-1]
    text = "\n".join(f"{kw} {args}" for kw, args in runtime).lower()
    for banned in ("gcc", "build-essential", "nats-server", "apt-get", "pip install", "wheels"):
        assert banned not in text, f"runtime stage mentions {banned!r}"
    builder_name = stages[0][0][1].split()[-1]
    assert any(args.startswith(f"--from={builder_name} ") for args in args_of(runtime, "COPY")), (
        "the runtime stage copies the venv from the builder"
    )

    users = args_of(runtime, "USER")
    assert users, "the runtime stage sets a USER"
    assert re.fullmatch(r"\d+(:\d+)?", users[-1]), f"USER {users[-1]} is not numeric"
    assert int(users[-1].split(":")[0]) != 0, "USER is root"

    # Exec form (JSON), exactly these: SIGTERM goes straight to the sidecar.
    assert [json.loads(a) for a in args_of(runtime, "ENTRYPOINT")] == [["anarchon-sidecar"]]
    assert [json.loads(a) for a in args_of(runtime, "CMD")] == [["run", "-c", CONFIG_IN_IMAGE]]


def test_dockerfile_builder_runs_the_tested_install() -> None:
    _, stages = dockerfile_stages(DOCKERFILE)
    builder = stages[0]
    env = " ".join(args_of(builder, "ENV"))
    assert "PIP_NO_CACHE_DIR=1" in env, "no pip cache in the image"
    copied = [src for args in args_of(builder, "COPY") for src in copy_sources(args)[0]]
    assert str(INSTALL_SCRIPT.relative_to(ROOT)) in copied
    # The optional offline wheels: a glob, so the build works without them.
    assert "wheel[s]" in copied
    runs = args_of(builder, "RUN")
    assert any(INSTALL_SCRIPT.name in args for args in runs), runs


@pytest.mark.parametrize(
    ("dockerfile", "context"),
    DOCKERFILES.items(),
    ids=[str(p.relative_to(ROOT)) for p in DOCKERFILES],
)
def test_dockerfile_copy_sources_exist(dockerfile: Path, context: Path) -> None:
    _, stages = dockerfile_stages(dockerfile)
    for stage in stages:
        for args in args_of(stage, "COPY"):
            if "--from=" in args:
                continue
            for src in copy_sources(args)[0]:
                if not re.search(r"[*?\[]", src):  # globs may match nothing
                    assert (context / src).exists(), f"{dockerfile.name}: COPY {src}: missing"


@pytest.fixture(scope="module")
def image_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builder's /src: what its relative COPY instructions put there."""
    src = tmp_path_factory.mktemp("image") / "src"
    src.mkdir()
    _, stages = dockerfile_stages(DOCKERFILE)
    for args in args_of(stages[0], "COPY"):
        sources, dest = copy_sources(args)
        if dest.startswith("/") or "--from=" in args:
            continue  # not into WORKDIR
        for name in sources:
            origin = ROOT / name
            target = src / dest if dest.endswith("/") and dest not in ("./", ".") else src
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target / origin.name)
    assert (src / "pyproject.toml").is_file() and (src / "sidecar" / "__init__.py").is_file()
    return src


def install_env(**extra: str) -> dict[str, str]:
    """This interpreter's python3 first on PATH, as the image's base provides it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


def assert_installed_sidecar_works(venv: Path, tmp_path: Path) -> None:
    exe = venv / "bin" / "anarchon-sidecar"
    where = run(
        [str(venv / "bin" / "python"), "-c", "import sidecar; print(sidecar.__file__)"],
        cwd=tmp_path,
    )
    assert Path(where.stdout.strip()).is_relative_to(venv), output(where)

    # The runtime set only: h11 for HTTP, no aiohttp (nats-py would import it).
    found = run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.util as u; print([bool(u.find_spec(m)) for m in ('h11', 'aiohttp')])",
        ],
        cwd=tmp_path,
    )
    assert found.stdout.strip() == "[True, False]", output(found)

    version = run([str(exe), "--version"], cwd=tmp_path)
    assert version.returncode == 0, output(version)
    assert sidecar.__version__ in version.stdout, output(version)

    compose_config = COMPOSE_DIR / "sidecar.yaml"
    check = run([str(exe), "check", "--no-files", "-c", str(compose_config)], cwd=tmp_path)
    assert check.returncode == 0, output(check)
    for job in config_of(compose_config).jobs:
        assert job.name in check.stdout, output(check)

    broken = tmp_path / "broken.yaml"
    broken.write_text(compose_config.read_text().replace("max_late: 5s", "max_late: 10m"))
    refused = run([str(exe), "check", "--no-files", "-c", str(broken)], cwd=tmp_path)
    assert refused.returncode == 2, output(refused)
    assert "max_late" in refused.stdout + refused.stderr, output(refused)


def test_image_install_in_a_clean_venv(image_source: Path, tmp_path: Path) -> None:
    """The builder's install, online: build the wheel, install it and its deps."""
    venv = tmp_path / "venv"
    proc = run(
        ["sh", str(INSTALL_SCRIPT), str(venv), str(image_source)],
        env=install_env(),
        cwd=tmp_path,
        timeout=170,
    )
    assert proc.returncode == 0, output(proc)
    assert not (venv / "bin" / "nats-server").exists(), "nats-server is a dev dependency only"
    assert_installed_sidecar_works(venv, tmp_path)


def test_image_install_offline_from_wheels(image_source: Path, tmp_path: Path) -> None:
    """With wheels in the context the install never asks an index."""
    wheels = tmp_path / "wheels"
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "-w", str(wheels), str(image_source)],
        env=install_env(),
        cwd=tmp_path,
        timeout=170,
    )
    assert built.returncode == 0, output(built)
    venv = tmp_path / "venv"
    # An index that refuses every connection: any look-up there would fail.
    proc = run(
        ["sh", str(INSTALL_SCRIPT), str(venv), str(image_source), str(wheels)],
        env=install_env(PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="0"),
        cwd=tmp_path,
        timeout=170,
    )
    assert proc.returncode == 0, output(proc)
    assert "Looking in links" in proc.stdout, output(proc)
    assert_installed_sidecar_works(venv, tmp_path)


# --------------------------------------------------------------- compose


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = load_yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


def numbered(services: dict[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    return {
        int(m.group(1)): spec
        for name, spec in services.items()
        if (m := re.fullmatch(rf"{prefix}(\d+)", name))
    }


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of a service's short-syntax bind mounts (./ or ../)."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts.append((source, target))
    return mounts


def test_compose_schema() -> None:
    proc = run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)])
    assert proc.returncode == 0, output(proc)


def test_compose_schema_rejects_a_broken_file(tmp_path: Path) -> None:
    data = load_yaml(COMPOSE)
    data["services"]["sidecar1"]["network_mood"] = data["services"]["sidecar1"]["network_mode"]
    broken = tmp_path / "compose.yaml"
    broken.write_text(yaml.safe_dump(data))
    proc = run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(broken)])
    assert proc.returncode != 0, output(proc)


def test_compose_three_apps_each_with_its_sidecar(compose: dict[str, Any]) -> None:
    services = compose["services"]
    apps, sidecars = numbered(services, "app"), numbered(services, "sidecar")
    assert sorted(apps) == sorted(sidecars) == [1, 2, 3]
    instance_ids = set()
    for n, spec in sidecars.items():
        assert spec["network_mode"] == f"service:app{n}"
        assert spec["depends_on"][f"app{n}"] == {"condition": "service_healthy"}
        assert spec["depends_on"]["nats"] == {"condition": "service_healthy"}
        assert "healthcheck" in apps[n]
        assert spec["command"] == ["run", "-c", CONFIG_IN_IMAGE]
        assert CONFIG_IN_IMAGE in [target for _, target in bind_mounts(spec)]
        instance_ids.add(spec["environment"]["ANARCHON_INSTANCE_ID"])
        # The sidecar's metrics are published through its app's ports.
        assert "ports" not in spec
        assert any(p.endswith(":9464") for p in apps[n]["ports"])
    assert len(instance_ids) == 3

    for source, target in bind_mounts(sidecars[1]):
        if target == CONFIG_IN_IMAGE:
            config = config_of(COMPOSE_DIR / source)
            # The app is reached in the shared network namespace.
            assert urlsplit(config.target.url).hostname == "127.0.0.1"
            assert config.metrics.port == 9464
            assert config.nats.servers == ("nats://nats:4222",)


def test_compose_nats_with_jetstream_store_and_healthcheck(compose: dict[str, Any]) -> None:
    nats = compose["services"]["nats"]
    assert "-js" in nats["command"]
    named = {v.split(":")[1] for v in nats["volumes"] if not v.startswith(".")}
    assert named, "a named volume for the JetStream store"
    conf_source = next(src for src, dst in bind_mounts(nats) if dst.endswith(".conf"))
    conf = (COMPOSE_DIR / conf_source).read_text()
    store_dir = re.search(r"store_dir:\s*(\S+)", conf)
    assert store_dir and store_dir.group(1) in named, "the store is on the volume"
    test = nats["healthcheck"]["test"]
    assert test[0] == "CMD" and any("/healthz" in part for part in test), test


def test_compose_mounts_and_builds_exist(compose: dict[str, Any]) -> None:
    for name, spec in compose["services"].items():
        for source, _ in bind_mounts(spec):
            assert (COMPOSE_DIR / source).exists(), f"{name}: {source} does not exist"
        if "build" in spec:
            context = COMPOSE_DIR / spec["build"]["context"]
            assert (context / spec["build"].get("dockerfile", "Dockerfile")).is_file(), name
    for name, secret in compose.get("secrets", {}).items():
        assert (COMPOSE_DIR / secret["file"]).is_file(), name
    prometheus = dict(
        (target, source) for source, target in bind_mounts(compose["services"]["prometheus"])
    )
    assert (COMPOSE_DIR / prometheus["/etc/prometheus/rules"]).resolve() == (
        DEPLOY / "prometheus" / "rules"
    )


def test_compose_prometheus_config_loads_the_shipped_rules(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    promtool = shutil.which("promtool", path=sysconfig.get_path("scripts")) or shutil.which(
        "promtool"
    )
    if not promtool:
        pytest.skip("promtool not installed: `make prometheus` puts it into .venv/bin")
    # Lay the files out as the container sees them.
    mounts = dict(
        (target, source) for source, target in bind_mounts(compose["services"]["prometheus"])
    )
    shutil.copy(COMPOSE_DIR / mounts["/etc/prometheus/prometheus.yml"], tmp_path / "p.yml")
    shutil.copytree(COMPOSE_DIR / mounts["/etc/prometheus/rules"], tmp_path / "rules")
    proc = run([promtool, "check", "config", str(tmp_path / "p.yml")])
    assert proc.returncode == 0, output(proc)
    assert re.search(r"SUCCESS: [1-9]\d* rules found", proc.stdout + proc.stderr), output(proc)

    scrape = load_yaml(tmp_path / "p.yml")["scrape_configs"]
    sidecars = next(job for job in scrape if job["job_name"] == "anarchon-sidecar")
    assert sidecars.get("honor_labels") is True  # the metrics' own `job` label
    targets = {t for group in sidecars["static_configs"] for t in group["targets"]}
    apps = numbered(compose["services"], "app")
    assert targets == {f"app{n}:9464" for n in apps}


# ------------------------------------------------------------------ NATS


# deploy/nats/permissions.conf and app-permissions.conf (and the Kubernetes overlays'
# copies) are fragments to include, not server configs: they are loaded by the
# servers of tests/store/test_permissions.py and tests/store/test_security.py, and below.
PERMISSIONS = DEPLOY / "nats" / "permissions.conf"
FRAGMENTS = ("permissions.conf", "app-permissions.conf")
NATS_CONFS = sorted(p for p in DEPLOY.rglob("*.conf") if p.name not in FRAGMENTS)


@pytest.mark.parametrize("conf", NATS_CONFS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_nats_config_is_valid_and_durable(conf: Path, tmp_path: Path) -> None:
    env = {**os.environ, "POD_NAME": "nats-0", "NATS_PASSWORD": "test-password"}
    # Laid out as the server sees it: with the files it includes beside it.
    for name, source in included_beside(conf).items():
        shutil.copy(source, tmp_path / name)
    proc = run([tool("nats-server"), "-c", str(tmp_path / conf.name), "-t"], env=env)
    assert proc.returncode == 0, output(proc)
    assert re.search(r"^\s*sync_interval:\s*always\s*$", conf.read_text(), re.M)


def test_nats_config_check_rejects_a_bad_value(tmp_path: Path) -> None:
    bad = tmp_path / "nats.conf"
    bad.write_text("jetstream {\n  store_dir: /data\n  sync_interval: sometimes\n}\n")
    proc = run([tool("nats-server"), "-c", str(bad), "-t"])
    assert proc.returncode != 0, output(proc)


# -------------------------------------------- the sidecars' restricted NATS user

SIDECAR_PERMISSIONS = "$ANARCHON_SIDECAR_PERMISSIONS"
# Ways to reach NATS that carry no permissions of their own.
UNRESTRICTED = re.compile(r"^\s*(token|no_auth_user|user|password)\s*[:=]", re.MULTILINE)


def without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def nats_users(conf: Path) -> dict[str, dict[str, str]]:
    """The users of a NATS config's `authorization` block: name -> its keys and values."""
    text = without_comments(conf.read_text())
    block = re.search(r"^authorization\s*\{(.*?)^\}", text, re.MULTILINE | re.DOTALL)
    assert block, f"{conf}: no authorization block (anyone may connect, with every right)"
    users = {}
    for entry in re.findall(r"\{([^{}]*)\}", block.group(1)):
        fields = dict(re.findall(r"(\w+)\s*:\s*(\"[^\"]*\"|[^,\s]+)", entry))
        users[fields["user"]] = fields
    # Outside the list: no token, no shared user, no anonymous user.
    assert not UNRESTRICTED.search(re.sub(r"\{[^{}]*\}", "", block.group(1))), conf
    return users


def sidecar_configs_beside(conf: Path) -> list[Path]:
    """The sidecar configs whose sidecars connect to the NATS of `conf`."""
    if conf.is_relative_to(COMPOSE_DIR):
        return [p for p in sidecar_configs() if p.is_relative_to(COMPOSE_DIR)]
    overlay = conf.parent
    return generator_files(overlay, SIDECAR_CONFIGMAP) or generator_files(
        K8S / "base", SIDECAR_CONFIGMAP
    )


def included_beside(conf: Path) -> dict[str, Path]:
    """The files a NATS config's server finds next to it: name in the server -> source."""
    if conf.is_relative_to(COMPOSE_DIR):
        (nats,) = [s for s in load_yaml(COMPOSE)["services"].values() if "nats.conf" in str(s)]
        mounts = {target: COMPOSE_DIR / source for source, target in bind_mounts(nats)}
        (config_dir,) = {Path(t).parent for t, s in mounts.items() if s.name == conf.name}
        return {Path(t).name: s for t, s in mounts.items() if Path(t).parent == config_dir}
    # A Kubernetes overlay: the ConfigMap nats-config, mounted as one directory.
    return {f.name: f for f in generator_files(conf.parent, "nats-config")}


def test_every_shipped_nats_config_found() -> None:
    names = {str(p.relative_to(DEPLOY)) for p in NATS_CONFS}
    assert names == {
        "compose/nats.conf",
        "k8s/overlays/nats-cluster/nats.conf",
        "k8s/overlays/nats-single/nats.conf",
    }, names


@pytest.mark.parametrize("conf", NATS_CONFS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_user_is_restricted_and_the_sidecars_by_permissions_conf(conf: Path) -> None:
    text = without_comments(conf.read_text())
    users = nats_users(conf)
    assert users, f"{conf}: no user"
    for name, fields in users.items():
        assert fields.get("permissions", "").startswith("$ANARCHON_"), f"{conf}: {name}"
    # Every sidecar of the example connects as a user with exactly the sidecar's permissions.
    for config_file in sidecar_configs_beside(conf):
        nats = config_of(config_file).nats
        assert nats.user in users, f"{config_file}: user {nats.user} is not in {conf}"
        assert users[nats.user]["permissions"] == SIDECAR_PERMISSIONS, conf
        assert nats.password_file is not None, config_file
        assert not (nats.token or nats.token_file or nats.nkey_seed_file or nats.creds_file)
    # permissions.conf is included, and the server finds it beside its config:
    # deploy/nats/permissions.conf itself or a copy of it.
    beside = included_beside(conf)
    for name in re.findall(r'^include\s+"([^"]+)"', text, re.MULTILINE):
        assert name in beside, f"{conf}: includes {name}, which the server does not have"
        assert beside[name].read_bytes() == (DEPLOY / "nats" / name).read_bytes(), beside[name]
    assert "permissions.conf" in beside and 'include "permissions.conf"' in text
    if conf.is_relative_to(K8S):
        # The servers take the password from the Secret the sidecars read it from.
        (secret,) = docs_of_kind(K8S / "base" / "nats-auth-secret.yaml", "Secret")
        key = Path(str(config_of(sidecar_configs_beside(conf)[0]).nats.password_file)).name
        (statefulset,) = [
            doc
            for path in manifest_files()
            if path.parent == conf.parent
            for doc in docs_of_kind(path, "StatefulSet")
        ]
        (container,) = statefulset["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("valueFrom") for e in container["env"]}
        assert users[nats.user]["password"] == "$NATS_PASSWORD", conf
        assert env["NATS_PASSWORD"] == {
            "secretKeyRef": {"name": secret["metadata"]["name"], "key": key}
        }, conf


def test_kubernetes_overlays_carry_an_identical_copy_of_permissions_conf() -> None:
    copies = sorted(p for p in K8S.rglob("*.conf") if p.name in FRAGMENTS)
    overlays = sorted(p.parent for p in K8S.rglob("nats.conf"))
    assert overlays and [p.parent for p in copies] == overlays, copies
    for copy in copies:
        assert copy.read_bytes() == PERMISSIONS.read_bytes(), (
            f"{copy} differs from {PERMISSIONS}: cp {PERMISSIONS.relative_to(ROOT)} "
            f"{copy.relative_to(ROOT)}"
        )


def test_the_restricted_users_check_can_fail(tmp_path: Path) -> None:
    conf = tmp_path / "nats.conf"
    for block in (
        "authorization {\n  token: s3cret\n}",
        "authorization {\n  user: anarchon\n  password: pw\n}",
        "authorization { users: [\n  {user: anarchon, password: pw}\n] }",
    ):
        conf.write_text(block + "\n")
        with pytest.raises(AssertionError):
            users = nats_users(conf)
            assert users and all("permissions" in u for u in users.values())


def nats_password_for(conf: Path) -> str:
    """The example password of the sidecars' user, where the example keeps it."""
    (config_file, *_) = sidecar_configs_beside(conf)
    password_file = Path(str(config_of(config_file).nats.password_file))
    if conf.is_relative_to(COMPOSE_DIR):
        secret = load_yaml(COMPOSE)["secrets"][password_file.name]
        return (COMPOSE_DIR / secret["file"]).read_text().removesuffix("\n")
    (secret,) = docs_of_kind(K8S / "base" / "nats-auth-secret.yaml", "Secret")
    return str(secret["stringData"][password_file.name])


async def _nats_answers(url: str, password: str) -> dict[str, Any]:
    import nats

    found: dict[str, Any] = {}
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    nc = await nats.connect(
        url, user="anarchon", password=password, allow_reconnect=False, error_cb=on_error
    )
    try:
        await nc.publish("cron.probe.claims", b"{}")  # allowed
        await nc.flush()
        found["allowed"] = list(errors)
        await nc.publish("$JS.API.STREAM.DELETE.CRON", b"")  # not in permissions.conf
        await nc.publish("$KV.OTHER_BUCKET.key", b"")
        await nc.flush()
        for _ in range(50):
            if len(errors) >= 2:
                break
            await asyncio.sleep(0.1)
        found["denied"] = list(errors)
    finally:
        await nc.close()
    return found


@pytest.mark.parametrize("conf", NATS_CONFS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_shipped_nats_admits_the_sidecars_only_as_their_restricted_user(
    conf: Path, tmp_path: Path
) -> None:
    """Each NATS config run for real, with the example's own password and includes."""
    for name, source in included_beside(conf).items():
        if name != conf.name:
            shutil.copy(source, tmp_path / name)
    port = free_port()
    text = conf.read_text().replace("store_dir: /data", f"store_dir: {tmp_path / 'js'}")
    text = text.replace("0.0.0.0:4222", f"127.0.0.1:{port}")
    text = text.replace("0.0.0.0:8222", f"127.0.0.1:{free_port()}")
    text = text.replace("0.0.0.0:6222", f"127.0.0.1:{free_port()}")
    (tmp_path / "nats.conf").write_text(text)
    password = nats_password_for(conf)
    env = {**os.environ, "POD_NAME": "nats-0", "NATS_PASSWORD": password}
    log = tmp_path / "nats.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [tool("nats-server"), "-c", str(tmp_path / "nats.conf")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "Server is ready" in log.read_text(), 15, what="nats-server ready")
        anonymous = anonymous_connect("127.0.0.1", port)
        found = asyncio.run(_nats_answers(f"nats://127.0.0.1:{port}", password))
    finally:
        server.terminate()
        server.wait(timeout=15)
    assert anonymous == "-ERR 'Authorization Violation'", anonymous
    assert found["allowed"] == [], found
    assert any("$js.api.stream.delete.cron" in e for e in found["denied"]), found
    assert any("$kv.other_bucket.key" in e for e in found["denied"]), found


# ------------------------------------------------------------ Kubernetes


def kustomization_dirs() -> list[Path]:
    return sorted(p.parent for p in K8S.rglob("kustomization.yaml"))


def generator_files(kdir: Path, name: str | None = None) -> list[Path]:
    """Files that a kustomization's generators read (of one generator, if named)."""
    data = load_yaml(kdir / "kustomization.yaml")
    files = []
    for key in ("configMapGenerator", "secretGenerator"):
        for generator in data.get(key, []):
            if name is None or generator["name"] == name:
                files += [kdir / f.split("=")[-1] for f in generator.get("files", [])]
    return files


def manifest_files() -> list[Path]:
    """Every Kubernetes manifest: YAML under deploy/k8s but kustomize's own inputs."""
    inputs = {f for kdir in kustomization_dirs() for f in generator_files(kdir)}
    return sorted(
        p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml" and p not in inputs
    )


def sidecar_configs() -> list[Path]:
    """Every sidecar config compose mounts or a kustomization makes a ConfigMap of."""
    found = set()
    for spec in load_yaml(COMPOSE)["services"].values():
        for source, target in bind_mounts(spec):
            if target == CONFIG_IN_IMAGE:
                found.add(Path(os.path.normpath(COMPOSE_DIR / source)))
    for kdir in kustomization_dirs():
        found.update(generator_files(kdir, SIDECAR_CONFIGMAP))
    return sorted(found)


def docs_of_kind(path: Path, kind: str) -> list[dict[str, Any]]:
    return [doc for doc in load_yaml_all(path) if doc.get("kind") == kind]


@pytest.fixture(scope="module")
def base_pod() -> dict[str, Any]:
    (deployment,) = docs_of_kind(K8S / "base" / "deployment.yaml", "Deployment")
    assert deployment["spec"]["replicas"] == 3
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def sidecar_container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["initContainers"] if c["name"] == "anarchon-sidecar"]
    return container


def test_manifests_found() -> None:
    names = {str(p.relative_to(K8S)) for p in manifest_files()}
    assert {"base/deployment.yaml", "base/podmonitor.yaml"} <= names, names
    assert len(sidecar_configs()) >= 3, sidecar_configs()


@pytest.mark.parametrize("version", K8S_VERSIONS, ids=lambda v: v or "newest")
def test_kubernetes_validate_strict(version: str | None) -> None:
    files = manifest_files()
    args = [tool("kubernetes-validate"), "--strict"]
    args += ["-k", version] if version else []
    proc = run([*args, *map(str, files)])
    assert proc.returncode == 0, output(proc)
    lines = proc.stdout.splitlines() + proc.stderr.splitlines()
    for line in lines:
        if line.startswith(("WARN", "ERROR")):
            assert any(f"kind {kind} " in line for kind in CUSTOM_KINDS), line
    documents = sum(len(load_yaml_all(f)) for f in files)
    custom = sum(len(docs_of_kind(f, kind)) for f in files for kind in CUSTOM_KINDS)
    passed = [line for line in lines if line.startswith("INFO") and " passed " in line]
    assert len(passed) == documents - custom, output(proc)


def test_kubernetes_validate_rejects_an_unknown_field(tmp_path: Path) -> None:
    deployment = load_yaml(K8S / "base" / "deployment.yaml")
    sidecar_container(deployment["spec"]["template"]["spec"])["restartPolicyy"] = "Always"
    bad = tmp_path / "deployment.yaml"
    bad.write_text(yaml.safe_dump(deployment))
    proc = run([tool("kubernetes-validate"), "--strict", str(bad)])
    assert proc.returncode != 0, output(proc)


@pytest.mark.parametrize("kdir", kustomization_dirs(), ids=lambda p: str(p.relative_to(K8S)))
def test_kustomization_lists_exactly_its_files(kdir: Path) -> None:
    data = load_yaml(kdir / "kustomization.yaml")
    referenced: set[Path] = set()
    for entry in data.get("resources", []):
        target = (kdir / entry).resolve()
        if target.is_dir():
            assert (target / "kustomization.yaml").is_file(), entry
        else:
            assert target.is_file(), f"{entry} does not exist"
            referenced.add(target)
    for patch in data.get("patches", []):
        if "path" in patch:
            assert (kdir / patch["path"]).is_file(), patch["path"]
            referenced.add((kdir / patch["path"]).resolve())
    for file in generator_files(kdir):
        assert file.is_file(), f"{file.name} does not exist"
        referenced.add(file.resolve())
    present = {p.resolve() for p in kdir.iterdir() if p.is_file()}
    unlisted = present - referenced - {(kdir / "kustomization.yaml").resolve()}
    assert not unlisted, f"not in kustomization.yaml: {sorted(p.name for p in unlisted)}"


@pytest.mark.parametrize("config", sidecar_configs(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_sidecar_config_passes_check(config: Path) -> None:
    proc = run(
        [sys.executable, "-m", "sidecar", "check", "--no-files", "-c", str(config)], cwd=ROOT
    )
    assert proc.returncode == 0, output(proc)


def test_sidecar_native_and_probed(base_pod: dict[str, Any]) -> None:
    container = sidecar_container(base_pod)
    assert container["restartPolicy"] == "Always"  # a native sidecar
    assert container["image"] == "anarchon-sidecar"
    assert container.get("args", ["run", "-c", CONFIG_IN_IMAGE]) == ["run", "-c", CONFIG_IN_IMAGE]
    (config_file,) = generator_files(K8S / "base", SIDECAR_CONFIGMAP)
    config = config_of(config_file)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == config.metrics.port
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["resources"] == {
        "requests": {"cpu": "20m", "memory": "64Mi"},
        "limits": {"memory": "128Mi"},
    }
    # The app is in the same pod.
    assert urlsplit(config.target.url).hostname == "127.0.0.1"
    assert any(c["ports"][0]["containerPort"] == 8080 for c in base_pod["containers"])


def test_pods_run_restricted(base_pod: dict[str, Any]) -> None:
    pod_sc = base_pod["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in base_pod["initContainers"] + base_pod["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, container["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, container["name"]
        assert sc["readOnlyRootFilesystem"] is True, container["name"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, container["name"]
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        assert isinstance(uid, int) and uid > 0, container["name"]
    for path in manifest_files():
        for doc in docs_of_kind(path, "StatefulSet"):
            spec = doc["spec"]["template"]["spec"]
            assert spec["securityContext"]["runAsNonRoot"] is True, path
            for container in spec["containers"]:
                assert container["securityContext"]["allowPrivilegeEscalation"] is False
                assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_grace_period_outlasts_the_drain(base_pod: dict[str, Any]) -> None:
    grace = base_pod["terminationGracePeriodSeconds"]
    for kdir in kustomization_dirs():
        for file in generator_files(kdir, SIDECAR_CONFIGMAP):
            drain = config_of(file).shutdown_grace
            assert grace >= drain + 10, f"{file}: shutdown_grace {drain}s vs grace {grace}s"


def test_config_and_secret_mounted_where_the_sidecar_reads_them(
    base_pod: dict[str, Any],
) -> None:
    container = sidecar_container(base_pod)
    volumes = {v["name"]: v for v in base_pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (config_file,) = generator_files(K8S / "base", SIDECAR_CONFIGMAP)
    (config_volume,) = [
        n for n, v in volumes.items() if v.get("configMap", {}).get("name") == SIDECAR_CONFIGMAP
    ]
    assert f"{mounts[config_volume]}/{config_file.name}" == CONFIG_IN_IMAGE

    (secret,) = docs_of_kind(K8S / "base" / "nats-auth-secret.yaml", "Secret")
    (secret_volume,) = [
        n
        for n, v in volumes.items()
        if v.get("secret", {}).get("secretName") == secret["metadata"]["name"]
    ]
    for kdir in kustomization_dirs():
        for file in generator_files(kdir, SIDECAR_CONFIGMAP):
            password_file = Path(str(config_of(file).nats.password_file))
            assert password_file.parent == Path(mounts[secret_volume]), file
            assert password_file.name in secret["stringData"], file


def test_podmonitor_scrapes_the_sidecars_as_the_rules_expect(base_pod: dict[str, Any]) -> None:
    (monitor,) = docs_of_kind(K8S / "base" / "podmonitor.yaml", "PodMonitor")
    (deployment,) = docs_of_kind(K8S / "base" / "deployment.yaml", "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in sidecar_container(base_pod)["ports"]}
    assert endpoint["honorLabels"] is True
    job = {r["targetLabel"]: r["replacement"] for r in endpoint["relabelings"]}["job"]
    rules = "".join(p.read_text() for p in (DEPLOY / "prometheus" / "rules").glob("*.y*ml"))
    assert f'job="{job}"' in rules


def test_nats_cluster_overlay() -> None:
    overlay = K8S / "overlays" / "nats-cluster"
    docs = [
        doc
        for path in manifest_files()
        if path.is_relative_to(overlay)
        for doc in load_yaml_all(path)
    ]
    (statefulset,) = [d for d in docs if d["kind"] == "StatefulSet"]
    assert statefulset["spec"]["replicas"] == 3
    headless_name = statefulset["spec"]["serviceName"]
    (headless,) = [
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == headless_name
    ]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True

    conf = (overlay / "nats.conf").read_text()
    routes = set(re.findall(r"nats://([\w.-]+):6222", conf))
    name = statefulset["metadata"]["name"]
    assert routes == {f"{name}-{i}.{headless_name}" for i in range(3)}

    # The overlay's sidecar config is the base's with the stream on 3 replicas.
    (base_file,) = generator_files(K8S / "base", SIDECAR_CONFIGMAP)
    (overlay_file,) = generator_files(overlay, SIDECAR_CONFIGMAP)
    base, cluster = load_yaml(base_file), load_yaml(overlay_file)
    assert cluster["nats"].pop("replicas") == 3
    assert cluster == base
    assert config_of(overlay_file).nats.replicas == 3


# ------------------------------------------------- kustomize, when present


def kustomize_command() -> list[str] | None:
    """kustomize, else kubectl (on PATH or in the venv: `make helm` puts one there)."""
    venv_bin = str(Path(sys.executable).parent)
    if found := shutil.which("kustomize"):
        return [found, "build"]
    if found := shutil.which("kubectl") or shutil.which("kubectl", path=venv_bin):
        return [found, "kustomize"]
    return None


@pytest.fixture
def rendered(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    command = kustomize_command()
    if command is None:
        pytest.skip("neither kustomize nor kubectl: test_kustomization_lists_exactly_its_files")
    kdir: Path = request.param
    proc = run([*command, str(kdir)])
    assert proc.returncode == 0, output(proc)
    out = tmp_path / "rendered.yaml"
    out.write_text(proc.stdout)
    yield out


OVERLAYS = sorted(p for p in kustomization_dirs() if p.parent.name == "overlays")


@pytest.mark.parametrize("rendered", OVERLAYS, indirect=True, ids=lambda p: str(p.relative_to(K8S)))
def test_overlay_builds_into_valid_manifests(rendered: Path, tmp_path: Path) -> None:
    proc = run([tool("kubernetes-validate"), "--strict", "--quiet", str(rendered)])
    assert proc.returncode == 0, output(proc)
    docs = load_yaml_all(rendered)
    (configmap,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(SIDECAR_CONFIGMAP)
    ]
    config = tmp_path / "sidecar.yaml"
    config.write_text(configmap["data"]["sidecar.yaml"])
    check = run(
        [sys.executable, "-m", "sidecar", "check", "--no-files", "-c", str(config)], cwd=ROOT
    )
    assert check.returncode == 0, output(check)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    names = {
        v["configMap"]["name"]
        for v in deployment["spec"]["template"]["spec"]["volumes"]
        if "configMap" in v
    }
    assert configmap["metadata"]["name"] in names  # the generated (hashed) name
    nats_services = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "nats"]
    assert nats_services, "the sidecars' nats://nats:4222 exists"
    # The NATS servers' ConfigMap holds permissions.conf beside nats.conf, and
    # the two, as mounted, make a valid config with the sidecars' user restricted.
    (nats_config,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("nats-config")
    ]
    assert nats_config["data"]["permissions.conf"] == PERMISSIONS.read_text()
    mounted = tmp_path / "etc-nats"
    mounted.mkdir()
    for name, content in nats_config["data"].items():
        (mounted / name).write_text(content)
    assert nats_users(mounted / "nats.conf")["anarchon"]["permissions"] == SIDECAR_PERMISSIONS
    env = {**os.environ, "POD_NAME": "nats-0", "NATS_PASSWORD": "test-password"}
    proc = run([tool("nats-server"), "-c", str(mounted / "nats.conf"), "-t"], env=env)
    assert proc.returncode == 0, output(proc)


# ------------------------------------------------------------------ docs


def test_deploy_doc_links_and_commands() -> None:
    text = DEPLOY_DOC.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (DEPLOY_DOC.parent / target).exists(), f"broken link {target}"
    assert "podman build -f deploy/Dockerfile" in text
    assert "sync_interval: always" in text
    assert "2.11" in text


# ------------------------------------------------ signing and its rotation

NEXT_LINE = re.compile(r"^  # (signing_secret_next_file: (\S+))$", re.MULTILINE)


def rotated(config_file: Path, tmp_path: Path) -> tuple[Config, str]:
    """The config with its commented `signing_secret_next_file` line switched on."""
    text = config_file.read_text()
    found = NEXT_LINE.search(text)
    assert found, f"{config_file}: no commented signing_secret_next_file line"
    on = tmp_path / config_file.name
    on.write_text(NEXT_LINE.sub(r"  \1", text))
    return config_of(on), found[2]


def test_k8s_signing_secret_mounted_and_rotation_shown(
    base_pod: dict[str, Any], tmp_path: Path
) -> None:
    (secret,) = docs_of_kind(K8S / "base" / "signing-secret.yaml", "Secret")
    (volume,) = [
        v["name"]
        for v in base_pod["volumes"]
        if v.get("secret", {}).get("secretName") == secret["metadata"]["name"]
    ]
    app = next(c for c in base_pod["containers"] if c["name"] == "app")
    for container in (sidecar_container(base_pod), app):
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts[volume] == "/run/secrets/anarchon-signing", container["name"]
    app_env = {e["name"]: e["value"] for e in app["env"]}
    for kdir in kustomization_dirs():
        for file in generator_files(kdir, SIDECAR_CONFIGMAP):
            current = config_of(file).target.signing_secret_file
            assert current == app_env["SIGNING_SECRET_FILE"], file
            assert Path(current).name in secret["stringData"], file
            config, nxt = rotated(file, tmp_path)
            assert config.target.signing_secret_next_file == nxt
            assert nxt == app_env["SIGNING_SECRET_NEXT_FILE"], file
    # The rotation step the Secret's comment shows: a `next` key beside `current`.
    assert "# next: " in (K8S / "base" / "signing-secret.yaml").read_text()


def test_compose_signing_secret_mounted_and_rotation_shown(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    text = COMPOSE.read_text()
    services = compose["services"]
    (config_file,) = [p for p in sidecar_configs() if p.is_relative_to(COMPOSE_DIR)]
    config = config_of(config_file)
    current = str(config.target.signing_secret_file)
    for name, spec in services.items():
        if name.startswith(("sidecar", "app")):
            assert f"/run/secrets/{spec['secrets'][0]}" == current, name
        if name.startswith("app"):
            assert spec["environment"]["SIGNING_SECRET_FILE"] == current
    _, nxt = rotated(config_file, tmp_path)
    secret_name = Path(nxt).name
    assert services["app1"]["environment"]["SIGNING_SECRET_NEXT_FILE"] == nxt
    # Uncommenting the rotation lines gives a compose file whose secrets exist.
    uncommented = re.sub(
        rf"^(\s*)# (- {secret_name}|{secret_name}:|  file: \./secrets/signing-secret-next)",
        r"\1\2",
        text,
        flags=re.MULTILINE,
    )
    assert uncommented.count(secret_name) == text.count(secret_name) and uncommented != text
    rotated_compose = yaml.safe_load(uncommented)
    assert rotated_compose["secrets"][secret_name] == {"file": "./secrets/signing-secret-next"}
    for name, spec in rotated_compose["services"].items():
        if name.startswith(("sidecar", "app")):
            assert secret_name in spec["secrets"], name


# -------------------------------------------------------- SECURITY.md's claims

SECRET_ENV = re.compile(r"ANARCHON_\w*(PASSWORD|TOKEN|SECRET)\w*")


def test_containers_run_non_root_on_a_read_only_root(
    compose: dict[str, Any], base_pod: dict[str, Any]
) -> None:
    # The image: a numeric user (test_dockerfile_runtime_stage) that does not own the code.
    _, stages = dockerfile_stages(DOCKERFILE)
    for args in args_of(stages[-1], "COPY"):
        assert "--chown" not in args and "--chmod" not in args, args
    for name, spec in compose["services"].items():
        if name.startswith(("app", "sidecar")):
            assert spec["read_only"] is True, name
            assert spec["cap_drop"] == ["ALL"], name
            assert "no-new-privileges:true" in spec["security_opt"], name
    for container in [*base_pod["initContainers"], *base_pod["containers"]]:
        ctx = container["securityContext"]
        assert ctx["readOnlyRootFilesystem"] is True, container["name"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] != 0, container["name"]


def test_no_secret_travels_in_an_environment_variable(compose: dict[str, Any]) -> None:
    # Secrets are files in every example: the environment shows in `inspect` and /proc.
    for name, spec in compose["services"].items():
        assert not SECRET_ENV.findall(" ".join(spec.get("environment", {}))), name
    for path in manifest_files():
        for doc in load_yaml_all(path):
            assert not SECRET_ENV.search(json.dumps(doc.get("spec", {}))), path
