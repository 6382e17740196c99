#!/usr/bin/env bash
# Debian's `prometheus` package, for tests/test_prometheus.py and make compose-test's metrics
# image (.ci/run and deploy/compose-test.sh call this; root).  Nothing to do when `prometheus` is
# on PATH.  The package's own service is not started: while it installs, a policy-rc.d refuses
# every service start if the machine has none (a Prometheus on 0.0.0.0:9090 is not wanted here).
# Output goes to $1 (default /dev/null); on failure its tail is printed and the exit code is 1.
set -euo pipefail
LOG=${1:-/dev/null}
command -v prometheus >/dev/null && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "install-prometheus: installing Debian's prometheus needs root" >&2
    exit 1
fi
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$POLICY"
    chmod 0755 "$POLICY"
    trap 'rm -f "$POLICY"' EXIT
fi
if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; } >"$LOG" 2>&1; then
    echo "install-prometheus: apt-get install prometheus failed" >&2
    [ "$LOG" = /dev/null ] || tail -20 "$LOG" >&2
    exit 1
fi
echo "install-prometheus: $(prometheus --version 2>&1 | head -1)" >&2
