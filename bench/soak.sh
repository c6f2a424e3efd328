#!/usr/bin/env bash
# The soak: the real ginx against the real control plane (tests/control-plane),
# for SOAK_MINUTES (default 60), with a commit every 10 s, a SIGHUP every minute, the API
# server restarted every 3 min and ginx SIGKILLed at a random moment of every 5 min. Prints
# the figures and the problems found; exits 1 when a check fails. The log is kept in
# target/soak-<time>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
export SOAK_MINUTES=${SOAK_MINUTES:-60}
[ -x target/control-plane/control-plane ] || bash tests/control-plane/build.sh
log=target/soak-$(date -u +%Y%m%dT%H%M%SZ).log
echo "soak: $SOAK_MINUTES min; log in $log"
cargo bench --bench soak 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
