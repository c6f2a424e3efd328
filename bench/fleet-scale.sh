#!/usr/bin/env bash
# Fleet scale: many simulated nodes, each running ginx's own heartbeat,
# slot Lease and fleet-state code, in one process against one real kube-apiserver; runs
# agent/benches/fleet_scale.rs and prints its figures as tables (see that file for what each
# phase measures).
#
# SCALE_NODES (default "100,300,1000") are the fleet sizes, each against a fresh control plane;
# SCALE_STEADY_SECONDS (60) the steady-state windows, SCALE_HOLD_SECONDS (25) the held-slots
# window, SCALE_SLOTS (50) max_concurrent, SCALE_ACTIVATION_SECONDS (1) the stand-in activation,
# SCALE_ROLLOUT_SECONDS (300) how long a rollout may take before it is stopped and reported so,
# SCALE_ORDER (unset) `rollout.order` on every simulated node (e.g. "name").
# BENCH_PROFILE=dev builds with the dev profile instead of the bench one (much quicker to build
# on a small machine). The control plane comes from tests/control-plane (bash
# tests/control-plane/build.sh), or GINX_CONTROL_PLANE names it.
#
# On a shared machine: nice -n 19 bench/fleet-scale.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export SCALE_NODES="${SCALE_NODES:-100,300,1000}"
exec cargo bench --locked ${BENCH_PROFILE:+--profile "$BENCH_PROFILE"} --bench fleet_scale
