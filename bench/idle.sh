#!/usr/bin/env bash
# The idle cost of one node, beside a `git fetch` loop on the same interval (docs/src/figures.md):
# runs agent/benches/idle.rs. IDLE_SECONDS (default 600) is the measured window; it starts
# after about two minutes of set-up (the control plane, the first apply and its health gate).
# The control plane comes from tests/control-plane (bash tests/control-plane/build.sh), or
# GINX_CONTROL_PLANE names it.
set -euo pipefail
cd "$(dirname "$0")/.."
export IDLE_SECONDS="${IDLE_SECONDS:-600}"
exec cargo bench --locked --bench idle
