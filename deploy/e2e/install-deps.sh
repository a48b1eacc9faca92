#!/bin/sh
# What `make e2e` needs besides the venv, installed only when missing:
# Debian's podman with runc (crun fails here), netavark with iptables (RUN
# steps fail without it) and aardvark-dns (containers find each other by
# name), debootstrap for the base image, prometheus for the Prometheus image;
# podman-compose from PyPI into the venv.
#
#   deploy/e2e/install-deps.sh VENV_BIN
set -eu
bin=${1:-.venv/bin}

missing=
for pkg in podman runc netavark aardvark-dns iptables debootstrap prometheus; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
    echo "install-deps: apt-get install$missing"
    export DEBIAN_FRONTEND=noninteractive
    # tests/apt-wait.sh: apt-get that waits for a held lock instead of failing
    apt_wait="$(dirname "$0")/../../tests/apt-wait.sh"
    sh "$apt_wait" update -qq
    # shellcheck disable=SC2086
    sh "$apt_wait" install -y -qq --no-install-recommends $missing >/dev/null
fi

if [ ! -x "$bin/podman-compose" ]; then
    echo "install-deps: pip install podman-compose"
    "$bin/pip" install --quiet 'podman-compose>=1.6,<2'
fi
podman --version
"$bin/podman-compose" --version | grep -v '^podman version' || true
