#!/bin/sh
# Install Debian packages for commands that are missing, where that can be done
# (root, apt-get); otherwise say what to install and what skips without them.
#   sh tests/install-missing.sh PURPOSE WITHOUT COMMAND:PACKAGE...
# e.g. sh tests/install-missing.sh "signature verifiers" "their verifier tests skip" go:golang-go
# NO_APT=1 (`make test NO_APT=1`): install nothing outside the project's directory,
# even as root; only say what is missing and what skips.
purpose=$1
without=$2
shift 2
missing=""
for pair in "$@"; do
  command -v "${pair%%:*}" >/dev/null || missing="$missing ${pair#*:}"
done
[ -z "$missing" ] && exit 0
if [ -z "${NO_APT:-}" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's$missing ($purpose)"
  here=$(dirname "$0")  # apt-wait.sh: apt-get that waits for a held lock
  DEBIAN_FRONTEND=noninteractive sh "$here/apt-wait.sh" update -qq &&
    DEBIAN_FRONTEND=noninteractive sh "$here/apt-wait.sh" install -y -qq \
      --no-install-recommends $missing >/dev/null
else
  echo "missing:$missing (apt-get install$missing as root); $without"
fi
