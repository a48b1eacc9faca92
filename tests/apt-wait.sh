#!/bin/sh
# apt-get that waits for a lock another package manager holds (unattended-upgrades,
# cloud-init, a second make) instead of failing at once with Error 100:
#   sh tests/apt-wait.sh ARGS...    (as apt-get ARGS)
# dpkg's lock: apt's own DPkg::Lock::Timeout. The package lists' lock of
# `apt-get update`, which that option does not cover: tried again every 2 s
# while it is held. Both for at most ANARCHON_APT_LOCK_WAIT seconds (600).
wait=${ANARCHON_APT_LOCK_WAIT:-600}
deadline=$(($(date +%s) + wait))
err=$(mktemp)
trap 'rm -f "$err"' EXIT
said=
while :; do
    status=0
    apt-get -o DPkg::Lock::Timeout="$wait" "$@" 2>"$err" || status=$?
    if [ "$status" != 0 ] && grep -q "Could not get lock" "$err" &&
        [ "$(date +%s)" -lt "$deadline" ]; then
        if [ -z "$said" ]; then
            echo "apt-get: another package manager holds its lock; waiting for it" \
                "(at most ${wait}s)" >&2
            said=1
        fi
        sleep 2
        continue
    fi
    cat "$err" >&2
    exit "$status"
done
