#!/usr/bin/env bash
# What the activation under the slot costs beyond the activation itself, with apply.prebuild
# (docs/src/figures.md, "Build before the lock"), measured with the real Nix (Debian's nix-bin), side by
# side in one run:
#   - a second build of what is already built: `nix-build` of the same expression again (an
#     evaluation, and a realise that finds every output valid) — what a second
#     `colmena apply-local` run does before its activation;
#   - switching to the built path instead: `nix-store --realise` of the valid output alone (no
#     evaluation) — what closure mode's realise does under the slot.
# The expression is a plain `derivation` (no nixpkgs here): its evaluation takes milliseconds,
# where a NixOS hive's takes seconds to a minute; that part of a real second colmena run is
# NOT measured here. RUNS (default 9) of each, median and max printed.
set -euo pipefail
runs=${RUNS:-9}
export NIX_CONFIG=$'build-users-group =\nsandbox = false\nexperimental-features = nix-command'
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/default.nix" <<NIX
derivation {
  name = "ginx-noop-build-system";
  system = builtins.currentSystem;
  builder = "/bin/sh";
  args = [ "-c" "echo $dir > \$out" ];
}
NIX
ms() { local s=$(date +%s%N); "$@" > /dev/null 2>&1; echo $(( ($(date +%s%N) - s) / 1000000 )); }
first=$(ms nix-build --no-out-link "$dir/default.nix")
out=$(nix-build --no-out-link "$dir/default.nix" 2>/dev/null)
again=(); realise=()
for _ in $(seq "$runs"); do
  again+=("$(ms nix-build --no-out-link "$dir/default.nix")")
  realise+=("$(ms nix-store --realise "$out")")
done
stats() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {printf "%d ms median, %d ms max", a[int((NR+1)/2)], a[NR]}'; }
echo "| step (real Nix, $runs runs each) | time |"
echo "| --- | --- |"
echo "| first build (evaluate, build one derivation) | $first ms |"
echo "| second \`nix-build\` of the built expression (evaluate, every output valid) | $(stats "${again[@]}") |"
echo "| \`nix-store --realise\` of the built output (no evaluation) | $(stats "${realise[@]}") |"
nix-store --delete "$out" > /dev/null 2>&1 || true
