"""deploy/helm/anarchon-sidecar: `helm lint` and `helm template`, then the rendered
manifests checked the way tests/test_deploy.py checks the kustomize ones.

For each values file (the defaults, every optional part on, and a user's own
ConfigMap and Secrets): `helm lint --strict`, `helm template`, then
`kubernetes-validate --strict` on the result (Kubernetes 1.29 and the newest
it knows), `anarchon-sidecar check` on the rendered config, and the pod's
shape (a native sidecar, its config and secrets mounted where the config
reads them, restricted security, a grace period longer than the drain). The
optional parts are compared with the files they come from (permissions.conf,
the dashboards), and nats-server loads the permissions as the chart ships
them. Helm is the `helm` command (`make helm` installs it); without it these
tests skip, saying so (under CI they fail).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config.load import load_config
from tests.support import NatsServer, Sidecar, free_port
from tests.test_deploy import (
    CONFIG_IN_IMAGE,
    K8S,
    K8S_VERSIONS,
    docs_of_kind,
    output,
    run,
    sidecar_container,
    tool,
)

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "anarchon-sidecar"
VALUES = {
    "defaults": None,
    "everything": CHART / "ci" / "everything-values.yaml",
    "byo": CHART / "ci" / "byo-values.yaml",
}
RELEASE = "demo"
# Prometheus Operator kinds: no schema in kubernetes-validate, reported not failed.
CUSTOM_KINDS = {"PodMonitor", "ServiceMonitor"}
SIDECAR = "anarchon-sidecar"


# ---------------------------------------------------------------- helm


class Helm:
    """`helm lint` and `helm template`, run as the `helm` command."""

    def __init__(self) -> None:
        venv_bin = str(Path(sys.executable).parent)
        command = shutil.which("helm") or shutil.which("helm", path=venv_bin)
        if command is None:
            why = (
                "no helm: `make helm` installs it (Debian's package where the release has one, "
                "else the official release binary, tests/install-helm.sh)"
            )
            if os.environ.get("CI"):
                pytest.fail(why)
            pytest.skip(why)
        self.command = command

    def lint(self, chart: Path, values: Path | None) -> tuple[bool, str]:
        """(passed, report) of `helm lint --strict` (warnings fail)."""
        args = [self.command, "lint", "--strict", str(chart)]
        args += ["-f", str(values)] if values else []
        proc = run(args)
        return proc.returncode == 0, output(proc)

    def template(self, chart: Path, values: Path | None) -> str:
        """`helm template` of the release RELEASE: the rendered manifests as one stream."""
        args = [self.command, "template", RELEASE, str(chart), "--namespace", "apps"]
        args += ["-f", str(values)] if values else []
        proc = run(args)
        if proc.returncode != 0:
            raise RenderError(output(proc))
        return proc.stdout


class RenderError(Exception):
    pass


def load_values(path: Path | None) -> dict[str, Any] | None:
    return yaml.safe_load(path.read_text()) if path else None


@pytest.fixture(scope="module")
def helm() -> Helm:
    return Helm()


@pytest.fixture(scope="module")
def rendered(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each values set rendered once: name -> the manifests' file."""
    out = tmp_path_factory.mktemp("helm")
    files = {}
    for name, values in VALUES.items():
        files[name] = out / f"{name}.yaml"
        files[name].write_text(helm.template(CHART, values))
    return files


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def one(path: Path, kind: str, name_suffix: str = "") -> dict[str, Any]:
    (doc,) = [
        d for d in docs(path) if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)
    ]
    return doc


def pod_of(path: Path) -> dict[str, Any]:
    spec: dict[str, Any] = one(path, "Deployment")["spec"]["template"]["spec"]
    return spec


ALL = pytest.mark.parametrize("values", list(VALUES))


# ------------------------------------------------------- lint and validate


@ALL
def test_helm_lint_strict(helm: Helm, values: str) -> None:
    passed, report = helm.lint(CHART, VALUES[values])
    assert passed, report


def test_helm_lint_can_fail(helm: Helm, tmp_path: Path) -> None:
    broken = tmp_path / "anarchon-sidecar"
    shutil.copytree(CHART, broken)
    deployment = broken / "templates" / "deployment.yaml"
    deployment.write_text(deployment.read_text().replace("{{- end }}", "", 1))
    passed, report = helm.lint(broken, None)
    assert not passed, report


@ALL
@pytest.mark.parametrize("version", K8S_VERSIONS, ids=lambda v: v or "newest")
def test_rendered_manifests_validate_strict(
    rendered: dict[str, Path], values: str, version: str | None
) -> None:
    path = rendered[values]
    args = [tool("kubernetes-validate"), "--strict"]
    args += ["-k", version] if version else []
    proc = run([*args, str(path)])
    assert proc.returncode == 0, output(proc)
    lines = proc.stdout.splitlines() + proc.stderr.splitlines()
    for line in lines:
        if line.startswith(("WARN", "ERROR")):
            assert any(f"kind {kind} " in line for kind in CUSTOM_KINDS), line
    found = docs(path)
    custom = [d for d in found if d["kind"] in CUSTOM_KINDS]
    passed = [line for line in lines if line.startswith("INFO") and " passed " in line]
    assert len(passed) == len(found) - len(custom), output(proc)


def test_validation_can_fail(rendered: dict[str, Path], tmp_path: Path) -> None:
    manifests = docs(rendered["defaults"])
    deployment = next(d for d in manifests if d["kind"] == "Deployment")
    sidecar_container(deployment["spec"]["template"]["spec"])["restartPolicyy"] = "Always"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(manifests))
    proc = run([tool("kubernetes-validate"), "--strict", str(bad)])
    assert proc.returncode != 0, output(proc)


def test_the_parts_each_values_set_renders(rendered: dict[str, Path]) -> None:
    def kinds(name: str) -> list[str]:
        return sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs(rendered[name]))

    assert kinds("defaults") == [
        "ConfigMap/demo-anarchon-sidecar-config",
        "Deployment/demo-anarchon-sidecar",
        "Service/demo-anarchon-sidecar",
    ]
    assert kinds("everything") == [
        "ConfigMap/demo-anarchon-sidecar-config",
        "ConfigMap/demo-anarchon-sidecar-dashboards",
        "ConfigMap/demo-anarchon-sidecar-nats-permissions",
        "Deployment/demo-anarchon-sidecar",
        "PodMonitor/demo-anarchon-sidecar",
        "Secret/anarchon-admin",
        "Secret/anarchon-nats-auth",
        "Secret/anarchon-signing",
        "Service/demo-anarchon-sidecar",
        "Service/demo-anarchon-sidecar-metrics",
        "ServiceMonitor/demo-anarchon-sidecar",
    ]
    assert kinds("byo") == ["Deployment/demo-anarchon-sidecar"]


# ------------------------------------------------------------ the pod


def rendered_config(path: Path, tmp_path: Path) -> Path:
    """The ConfigMap's files, written as mounted: sidecar.yaml and the calendar files
    beside it (its calendars name them relative to its directory)."""
    configmap = one(path, "ConfigMap", "-config")
    for name, content in configmap["data"].items():
        (tmp_path / name).write_text(content)
    return tmp_path / "sidecar.yaml"


@pytest.mark.parametrize("values", ["defaults", "everything"])
def test_rendered_config_passes_check_and_secrets_are_where_it_reads_them(
    rendered: dict[str, Path], values: str, tmp_path: Path
) -> None:
    path = rendered[values]
    config_file = rendered_config(path, tmp_path)
    # The Secrets are mounted only in the pod: --no-files, as in the kustomize check.
    check = run(
        [sys.executable, "-m", "sidecar", "check", "--no-files", "-c", str(config_file)], cwd=ROOT
    )
    assert check.returncode == 0, output(check)
    config = load_config(str(config_file), {})

    pod = pod_of(path)
    container = sidecar_container(pod)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    configmap = one(path, "ConfigMap", "-config")["metadata"]["name"]
    (config_volume,) = [
        n for n, v in volumes.items() if v.get("configMap", {}).get("name") == configmap
    ]
    assert f"{mounts[config_volume]}/sidecar.yaml" == CONFIG_IN_IMAGE

    def secret_mount(file: Any) -> tuple[str, str]:
        """(Secret name, key) of the mounted Secret a config's file path is in."""
        file = Path(str(file))
        (volume,) = [n for n, m in mounts.items() if Path(m) == file.parent]
        return volumes[volume]["secret"]["secretName"], file.name

    wanted = [
        secret_mount(config.nats.password_file),
        secret_mount(config.target.signing_secret_file),
    ]
    if config.admin.token_file:
        wanted.append(secret_mount(config.admin.token_file))
    secrets = {d["metadata"]["name"]: d for d in docs(path) if d["kind"] == "Secret"}
    for name, key in wanted:
        if values == "everything":  # the chart made them: each holds the key read
            assert key in secrets[name]["stringData"], (name, key)
        else:
            assert not secrets, "the defaults make no Secret"
    # The app checks what the sidecar signs: the same Secret, the same path.
    app = next(c for c in pod["containers"] if c["name"] == "app")
    app_env = {e["name"]: e["value"] for e in app["env"]}
    assert app_env["SIGNING_SECRET_FILE"] == str(config.target.signing_secret_file)
    assert {m["name"] for m in app["volumeMounts"]} <= set(volumes)


@ALL
def test_sidecar_is_native_and_the_pods_restricted(rendered: dict[str, Path], values: str) -> None:
    deployment = one(rendered[values], "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = sidecar_container(pod)
    assert container["restartPolicy"] == "Always"
    assert container["args"] == ["run", "-c", CONFIG_IN_IMAGE]
    env = {e["name"]: e for e in container["env"]}
    assert env["ANARCHON_INSTANCE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 9464}
    # The selector picks these pods and nothing of another release.
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert selector["app.kubernetes.io/instance"] == RELEASE
    # Security: what the kustomize base promises (the restricted Pod Security Standard).
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    for c in pod["initContainers"] + pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, c["name"]
    # The user's init containers run before the sidecar starts.
    assert pod["initContainers"][-1]["name"] == SIDECAR


@pytest.mark.parametrize("values", ["defaults", "everything"])
def test_grace_outlasts_the_drain_and_a_config_change_rolls_the_pods(
    rendered: dict[str, Path], values: str, helm: Helm, tmp_path: Path
) -> None:
    path = rendered[values]
    config_text = one(path, "ConfigMap", "-config")["data"]["sidecar.yaml"]
    config = load_config(str(rendered_config(path, tmp_path)), {})
    template = one(path, "Deployment")["spec"]["template"]
    assert template["spec"]["terminationGracePeriodSeconds"] >= config.shutdown_grace + 10
    checksum = template["metadata"]["annotations"]["checksum/config"]
    assert checksum == hashlib.sha256(config_text.rstrip("\n").encode()).hexdigest()

    changed = tmp_path / "changed.yaml"
    data = load_values(VALUES[values]) or {}
    data.setdefault("sidecar", {}).setdefault("config", {})["shutdown_grace"] = "20s"
    if values == "defaults":  # a partial config map is merged into the defaults
        data["sidecar"]["config"] = {
            **load_values(CHART / "values.yaml")["sidecar"]["config"],
            "shutdown_grace": "20s",
        }  # type: ignore[index]
    changed.write_text(yaml.safe_dump(data))
    other = tmp_path / "other.yaml"
    other.write_text(helm.template(CHART, changed))
    new = one(other, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert new["checksum/config"] != checksum


def test_calendar_files_are_beside_the_config_and_roll_the_pods(
    rendered: dict[str, Path], helm: Helm, tmp_path: Path
) -> None:
    path = rendered["everything"]
    config = load_config(str(rendered_config(path, tmp_path)), {})
    (job,) = [j for j in config.jobs if j.name == "nightly-report"]
    assert [s.name for s in job.schedule.shared] == ["holidays-de"]  # read from the file
    annotations = one(path, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/calendars" in annotations
    assert (
        "checksum/calendars"
        not in (
            one(rendered["defaults"], "Deployment")["spec"]["template"]["metadata"]["annotations"]
        )
    )  # no calendar files: the pods' annotations as before
    data = load_values(VALUES["everything"]) or {}
    files = data["sidecar"]["calendarFiles"]  # type: ignore[index]
    files["holidays-de.ics"] = files["holidays-de.ics"].replace("20261227", "20261228")
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(data))
    other = tmp_path / "other.yaml"
    other.write_text(helm.template(CHART, changed))
    new = one(other, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert new["checksum/calendars"] != annotations["checksum/calendars"]


def test_defaults_match_the_kustomize_base() -> None:
    """The chart's sidecar is the base's: the same probes, resources, security and mounts."""
    (deployment,) = docs_of_kind(K8S / "base" / "deployment.yaml", "Deployment")
    base = sidecar_container(deployment["spec"]["template"]["spec"])
    values = load_values(CHART / "values.yaml")
    assert values is not None
    sidecar = values["sidecar"]
    for key in ("livenessProbe", "readinessProbe", "resources", "securityContext"):
        assert sidecar[key] == base[key], key
    assert (
        values["app"]["podSecurityContext"]
        == deployment["spec"]["template"]["spec"]["securityContext"]
    )
    base_mounts = sorted(m["mountPath"] for m in base["volumeMounts"])
    chart_mounts = sorted(["/etc/anarchon"] + [s["mountPath"] for s in values["secrets"].values()])
    assert chart_mounts == base_mounts
    # The default config is the base's sidecar.yaml with the example's second job left out.
    base_config = yaml.safe_load((K8S / "base" / "sidecar.yaml").read_text())
    chart_config = sidecar["config"]
    assert chart_config["jobs"] == base_config["jobs"][:1]
    assert {k: v for k, v in chart_config.items() if k != "jobs"} == {
        k: v for k, v in base_config.items() if k != "jobs"
    }


def test_byo_uses_the_users_configmap_and_secrets(rendered: dict[str, Path]) -> None:
    pod = pod_of(rendered["byo"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["anarchon-config"]["configMap"]["name"] == "worker-anarchon-config"
    assert volumes["anarchon-nats"]["secret"]["secretName"] == "worker-nats"
    assert set(volumes) == {"anarchon-config", "anarchon-nats"}
    assert [c["name"] for c in pod["containers"]] == ["worker"]
    assert "checksum/config" not in (
        one(rendered["byo"], "Deployment")["spec"]["template"]["metadata"].get("annotations") or {}
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"secrets": {"nats": {"create": True}}}, "secrets.nats.password is required"),
        ({"secrets": {"signing": {"create": True}}}, "secrets.signing.current is required"),
        ({"app": {"containers": []}}, r"app[./]containers"),
        # values.schema.json: a misspelt key, a wrong type.
        ({"sidecars": {"port": 9464}}, "sidecars"),
        ({"sidecar": {"port": "9464"}}, r"sidecar[./]port"),
        ({"metrics": {"serviceMonitor": {"enabeld": True}}}, "enabeld"),
    ],
    ids=["nats-password", "signing-key", "no-containers", "typo", "port-type", "nested-typo"],
)
def test_missing_values_are_refused_by_name(
    helm: Helm, tmp_path: Path, setting: dict[str, Any], message: str
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(setting))
    with pytest.raises(RenderError) as refused:
        helm.template(CHART, values)
    assert re.search(message, str(refused.value)), refused.value


# Credentials outside Secrets and privileged pods (issue 48): each refused by name,
# each rendered when its own `unsafe` flag says so, and only then.
UNSAFE = [
    (
        {"sidecar": {"config": {"target": {"url": "http://127.0.0.1:8080",
                                           "headers": {"Authorization": "Bearer x"}}}}},
        r"sidecar\.config\.target\.headers\.Authorization is a credential in the ConfigMap",
        "credentialsInConfig",
    ),
    (
        {"sidecar": {"config": {"jobs": [{"name": "a", "schedule": "* * * * *",
                                          "request": {"headers": {"X-Api-Key": "k"}}}]}}},
        r"jobs\[0\]\.request\.headers\.X-Api-Key is a credential",
        "credentialsInConfig",
    ),
    (
        {"sidecar": {"config": {"jobs": [{"name": "a", "schedule": "* * * * *",
                                          "ping": "https://hc-ping.com/key/a"}]}}},
        r"jobs\[0\]\.ping .*ConfigMap",
        "credentialsInConfig",
    ),
    (
        {"sidecar": {"config": {"defaults": {"ping": {"url": "https://hc-ping.com/k/{job}"}}}}},
        r"defaults\.ping",
        "credentialsInConfig",
    ),
    (
        {"sidecar": {"env": [{"name": "ANARCHON_NATS_PASSWORD", "value": "pw"}]}},
        r"sidecar\.env\[0\] ANARCHON_NATS_PASSWORD is a secret as a plain value",
        "secretEnv",
    ),
    (
        {"sidecar": {"resources": None}},
        r"sidecar\.resources needs requests\.memory and limits\.memory",
        "noResources",
    ),
    (
        {"sidecar": {"securityContext": {"privileged": True, "runAsUser": 0}}},
        r"sidecar\.securityContext has privileged: true",
        "privileged",
    ),
    (
        {"app": {"podSecurityContext": {"runAsUser": 0}}},
        r"app\.podSecurityContext has runAsUser: 0",
        "privileged",
    ),
    (
        {"sidecar": {"securityContext": None}},
        r"sidecar\.securityContext is empty",
        "privileged",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("setting", "message", "flag"),
    UNSAFE,
    ids=[
        "header",
        "job-header",
        "ping",
        "default-ping",
        "env",
        "resources",
        "privileged",
        "pod-root",
        "no-context",
    ],
)
def test_credentials_outside_secrets_and_privileged_pods_are_refused(
    helm: Helm, tmp_path: Path, setting: dict[str, Any], message: str, flag: str
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(setting))
    with pytest.raises(RenderError) as refused:
        helm.template(CHART, values)
    assert re.search(message, str(refused.value)), refused.value
    assert f"unsafe.{flag}: true" in str(refused.value), refused.value
    # Its own flag lifts it (and says so in the values file that renders it).
    values.write_text(yaml.safe_dump({**setting, "unsafe": {flag: True}}))
    assert "kind: Deployment" in helm.template(CHART, values)


def test_a_secret_from_a_secret_key_ref_is_not_refused(helm: Helm, tmp_path: Path) -> None:
    env = {
        "name": "ANARCHON_NATS_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "n", "key": "p"}},
    }
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"sidecar": {"env": [env]}}))
    assert "secretKeyRef" in helm.template(CHART, values)


# -------------------------------------------------------- optional parts


def test_chart_copies_are_the_files_they_come_from() -> None:
    pairs = {
        CHART / "files" / "permissions.conf": ROOT / "deploy" / "nats" / "permissions.conf",
        CHART / "files" / "app-permissions.conf": ROOT / "deploy" / "nats" / "app-permissions.conf",
    }
    for source in (ROOT / "grafana" / "dashboards").glob("*.json"):
        pairs[CHART / "files" / "dashboards" / source.name] = source
    assert sorted((CHART / "files" / "dashboards").iterdir()) == sorted(
        p for p in pairs if p.parent.name == "dashboards"
    )
    for copy, source in pairs.items():
        assert copy.read_bytes() == source.read_bytes(), (
            f"{copy.relative_to(ROOT)} differs: "
            f"cp {source.relative_to(ROOT)} {copy.relative_to(ROOT)}"
        )


def test_dashboards_configmap_holds_the_dashboards(rendered: dict[str, Path]) -> None:
    configmap = one(rendered["everything"], "ConfigMap", "-dashboards")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    sources = {p.name: p for p in (ROOT / "grafana" / "dashboards").glob("*.json")}
    assert set(configmap["data"]) == set(sources)
    for name, text in configmap["data"].items():
        assert json.loads(text) == json.loads(sources[name].read_text()), name


def test_nats_permissions_configmap_loads_in_nats_server(
    rendered: dict[str, Path], tmp_path: Path
) -> None:
    configmap = one(rendered["everything"], "ConfigMap", "-nats-permissions")
    for name, text in configmap["data"].items():
        assert text == (ROOT / "deploy" / "nats" / name).read_text(), name
        (tmp_path / name).write_text(text)
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f"jetstream {{ store_dir: {tmp_path / 'js'} }}\n"
        'include "permissions.conf"\ninclude "app-permissions.conf"\n'
        "authorization { users: [\n"
        "  {user: anarchon, password: pw, permissions: $ANARCHON_SIDECAR_PERMISSIONS}\n"
        "  {user: app, password: pw2, permissions: $ANARCHON_APP_PERMISSIONS}\n"
        "] }\n"
    )
    proc = run([tool("nats-server"), "-c", str(conf), "-t"])
    assert proc.returncode == 0, output(proc)


def test_monitors_scrape_the_sidecars_as_the_rules_expect(rendered: dict[str, Path]) -> None:
    path = rendered["everything"]
    pod_labels = one(path, "Deployment")["spec"]["template"]["metadata"]["labels"]
    service = one(path, "Service", "-metrics")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["name"] == "metrics" and port["targetPort"] == 9464
    monitor = one(path, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pod_monitor = one(path, "PodMonitor")
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    rules = "".join(
        p.read_text() for p in (ROOT / "deploy" / "prometheus" / "rules").glob("*.y*ml")
    )
    for endpoint in (
        monitor["spec"]["endpoints"][0],
        pod_monitor["spec"]["podMetricsEndpoints"][0],
    ):
        assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
        job = {r["targetLabel"]: r["replacement"] for r in endpoint["relabelings"]}["job"]
        assert f'job="{job}"' in rules


def test_rendered_pod_runs_against_nats_with_the_rendered_permissions(
    rendered: dict[str, Path], tmp_path: Path
) -> None:
    """The chart's parts together, for real: the rendered config, its Secrets laid out
    as the pod mounts them, a nats-server with the rendered permissions.conf and the
    Secret's password; the sidecar gets ready (stream and state bucket made under
    those permissions) and the server logs no permissions violation."""
    path = rendered["everything"]
    pod = pod_of(path)
    container = sidecar_container(pod)
    secrets = {d["metadata"]["name"]: d for d in docs(path) if d["kind"] == "Secret"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_map = one(path, "ConfigMap", "-config")["data"]
    config_text = config_map["sidecar.yaml"]
    for name, content in config_map.items():  # the calendar files, beside the config
        if name != "sidecar.yaml":
            (tmp_path / name).write_text(content)
    # Each Secret as the kubelet mounts it: a directory with one file per key.
    for mount in container["volumeMounts"]:
        secret_name = volumes[mount["name"]].get("secret", {}).get("secretName")
        if not secret_name:
            continue
        directory = tmp_path / "mounts" / mount["name"]
        directory.mkdir(parents=True)
        for key, value in secrets[secret_name]["stringData"].items():
            (directory / key).write_text(value)
        config_text = config_text.replace(mount["mountPath"] + "/", f"{directory}/")
    config = yaml.safe_load(config_text)
    config["nats"]["servers"] = []  # set below, once the server has its port
    config["nats"]["replicas"] = 1  # one server here
    config["metrics"] = {"listen": f"127.0.0.1:{free_port()}"}

    store = tmp_path / "nats"
    store.mkdir()
    permissions = one(path, "ConfigMap", "-nats-permissions")["data"]["permissions.conf"]
    (store / "permissions.conf").write_text(permissions)
    password = secrets["anarchon-nats-auth"]["stringData"]["password"]
    server = NatsServer(
        store,
        extra_conf='include "permissions.conf"\n'
        "authorization { users: [\n"
        f"  {{user: anarchon, password: {json.dumps(password)}, "
        "permissions: $ANARCHON_SIDECAR_PERMISSIONS}\n] }\n",
    )
    server.start()
    try:
        config["nats"]["servers"] = [server.url]
        sidecar = Sidecar(tmp_path, "helm-pod", config, {})
        sidecar.start()
        try:
            sidecar.wait_ready(30)
        finally:
            code = sidecar.terminate()
    finally:
        server.stop()
    assert code == 0, sidecar.log()
    log = server.log_path.read_text()
    assert "Permissions Violation" not in log, log[-3000:]
    assert "Authorization Violation" not in log, log[-3000:]
