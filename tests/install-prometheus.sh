#!/bin/sh
# Puts `prometheus` and `promtool` into the venv for `make test` (the rule
# tests and the Prometheus end-to-end test), without installing or starting
# anything on the system:
#   - from PATH when both are there (linked);
#   - else unpacked from Debian's `prometheus` package, fetched with
#     `apt-get download` (no dpkg install, so no service, no user, no
#     dependencies); as root, `apt-get update` first when the lists lack it.
#
#   tests/install-prometheus.sh VENV_BIN
set -eu
bin=${1:-.venv/bin}
tools="prometheus promtool"

have() { [ -x "$bin/prometheus" ] && [ -x "$bin/promtool" ]; }
have && exit 0

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    for tool in $tools; do ln -sf "$(command -v "$tool")" "$bin/$tool"; done
    echo "install-prometheus: linked prometheus and promtool from PATH into $bin"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    echo "install-prometheus: prometheus and promtool (2.x) not found; put them on PATH" >&2
    echo "  (on Debian or Ubuntu this script fetches them with apt-get download)" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# As root apt drops to the _apt user to download, which cannot write to $work.
opts=
[ "$(id -u)" = 0 ] && opts="-o APT::Sandbox::User=root"
echo "install-prometheus: apt-get download prometheus (unpacked into $bin, not installed)"
# shellcheck disable=SC2086
if ! (cd "$work" && apt-get download -qq $opts prometheus >/dev/null 2>&1); then
    if [ "$(id -u)" = 0 ]; then
        sh "$(dirname "$0")/apt-wait.sh" update -qq
        # shellcheck disable=SC2086
        (cd "$work" && apt-get download -qq $opts prometheus >/dev/null)
    else
        echo "install-prometheus: apt-get download prometheus failed;" \
            "run apt-get update as root, or put prometheus and promtool on PATH" >&2
        exit 1
    fi
fi
dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
for tool in $tools; do
    cp "$work/root/usr/bin/$tool" "$bin/$tool"
done
"$bin/promtool" --version 2>&1 | head -n 1
