#!/usr/bin/env bash
# The long randomised fault run: three real ginx daemons against a private real
# control plane, NEMESIS_ROUNDS revisions (default 40), each with a fault drawn from
# NEMESIS_SEED (printed; random when unset) — the holder partitioned, SIGKILLed or SIGSTOPped
# until its slot is taken over, or the API server restarted — at a drawn moment of the
# holder's rollout; then the whole history is checked (tests/faults.rs, `check`). `cargo test`
# runs the same with 4 rounds. The log is kept in target/nemesis-<time>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
export NEMESIS_ROUNDS=${NEMESIS_ROUNDS:-40}
export NEMESIS_SEED=${NEMESIS_SEED:-$(od -An -N8 -tu8 /dev/urandom | tr -d " ")}
[ -x target/control-plane/control-plane ] || bash tests/control-plane/build.sh
log=target/nemesis-$(date -u +%Y%m%dT%H%M%SZ).log
echo "nemesis: $NEMESIS_ROUNDS rounds; log in $log"
start=$(date +%s)
CI=${CI:-true} cargo test --test integration -- --exact \
  faults::a_randomised_nemesis_over_three_nodes --nocapture 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo "nemesis: rc $rc after $(( $(date +%s) - start )) s"
exit "$rc"
