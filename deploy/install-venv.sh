#!/bin/sh
# Install anarchon-sidecar into a new virtual environment.
#
#   install-venv.sh VENV SOURCE [WHEELS]
#
# The image's builder stage (deploy/Dockerfile) runs this, and so does
# tests/test_deploy.py, so the test checks the very install the image does.
#
# Online (no *.whl in WHEELS, or no WHEELS): build this project's wheel from
# SOURCE, then install it; pip takes the dependencies from the package index.
# Offline (WHEELS holds wheels): install anarchon-sidecar and every dependency
# from the wheels there, never asking an index. Make them from the same
# checkout, with the same Python as the image: `pip wheel . -w wheels`.
set -eu

venv=$1
source=$2
wheels=${3:-}

python3 -m venv "$venv"
if [ -n "$wheels" ] && ls "$wheels"/*.whl >/dev/null 2>&1; then
    "$venv/bin/pip" install --no-index --find-links="$wheels" anarchon-sidecar
else
    dist=$(mktemp -d)
    "$venv/bin/pip" wheel --no-deps --wheel-dir="$dist" "$source"
    "$venv/bin/pip" install "$dist"/anarchon_sidecar-*.whl
    rm -rf "$dist"
fi
"$venv/bin/anarchon-sidecar" --version
