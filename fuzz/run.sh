#!/usr/bin/env bash
# Runs every fuzz target of agent/src/fuzz.rs under libFuzzer (cargo fuzz, which needs a nightly
# toolchain: `rustup toolchain install nightly`, `cargo install cargo-fuzz`) for FUZZ_SECONDS
# each (default 600), one after the other, and prints executions per second and findings.
#
#   fuzz/run.sh                    every target, 10 minutes each
#   FUZZ_SECONDS=60 fuzz/run.sh url_secrets config
#
# Each run starts from the committed seeds (fuzz/corpus/<target>/) plus the corpus grown by
# earlier runs (target/fuzz-corpus/<target>/, not committed). Crashes and hangs land in
# fuzz/artifacts/<target>/; turn each into fuzz/regressions/<target>/<name> and a test named
# after it (`cargo test` replays both directories on stable). Exits 1 when a target fails.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$PWD
seconds=${FUZZ_SECONDS:-600}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config control_request kubeadm_cluster trust_files url_secrets render)

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: no nightly toolchain (libFuzzer needs -Z flags): rustup toolchain install nightly" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: cargo-fuzz is missing: cargo install cargo-fuzz" >&2
  exit 1
fi
echo "--- building the targets (cargo +nightly fuzz build, address sanitizer, debug assertions)"
(cd fuzz && cargo +nightly fuzz build -a) || exit 1

failed=0
summary=()
for t in "${targets[@]}"; do
  corpus=$top/target/fuzz-corpus/$t
  mkdir -p "$corpus" "$top/fuzz/artifacts/$t"
  cp -n fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  [ -d fuzz/regressions/"$t" ] && cp -n fuzz/regressions/"$t"/* "$corpus"/ 2>/dev/null
  log=$top/target/fuzz-$t.log
  echo "--- $t for ${seconds}s (log: $log)"
  began=$(date +%s)
  (cd fuzz && cargo +nightly fuzz run -a "$t" "$corpus" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$top/fuzz/artifacts/$t/") > "$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  secs=$(( $(date +%s) - began ))
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  units=$(find "$corpus" -type f | wc -l)
  if [ $rc -eq 0 ]; then verdict="no finding"; else verdict="FAILED (rc $rc): see $log and fuzz/artifacts/$t/"; failed=1; fi
  summary+=("$(printf '%-16s %7ss %11s runs %8s exec/s  cov %6s  corpus %5s  %s' "$t" "${secs:-?}" "${runs:-?}" "${rate:-?}" "${cov:-?}" "$units" "$verdict")")
  echo "${summary[-1]}"
done
echo "--- summary"
printf '%s\n' "${summary[@]}"
exit $failed
