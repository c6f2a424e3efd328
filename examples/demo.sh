#!/usr/bin/env bash
# ginx in two minutes: a local "Hephaestus" repository, ginx pulling it, a stand-in for
# `colmena apply-local` applying each revision, and ginxctl showing what happened.
# Everything lives in a temporary directory that is removed at the end.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
echo "==> building ginx and ginxctl"
cargo build --quiet --manifest-path "$here/Cargo.toml" --bin ginx --bin ginxctl
built="${CARGO_TARGET_DIR:-$here/target}/debug"

work=$(mktemp -d -t ginx-demo-XXXXXX)
ginx_pid=
cleanup() {
  if [ -n "$ginx_pid" ] && kill -0 "$ginx_pid" 2>/dev/null; then
    kill -TERM "$ginx_pid"
    wait "$ginx_pid" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
# The daemons run from copies: each attempt starts ginx's own binary again, which a cargo build
# elsewhere during the demo would replace.
mkdir "$work/bin"
cp "$built/ginx" "$built/ginxctl" "$work/bin/"
bin=$work/bin

git_() { git -C "$work/hephaestus" -c user.name=Demo -c user.email=demo@example.com "$@"; }

echo "==> a Hephaestus repository with a trivial hive in $work/hephaestus"
mkdir -p "$work/hephaestus" "$work/etc"
git_ init -q -b main
echo '{ meta.nixpkgs = <nixpkgs>; lucy = { ... }: { }; }' > "$work/hephaestus/hive.nix"
git_ add hive.nix
git_ commit -q -m "initial hive"

echo "==> a stand-in for colmena apply-local (real colmena needs Nix)"
cat > "$work/colmena" <<'STUB'
#!/usr/bin/env bash
# argv: apply-local --node NAME GOAL; runs in the checked-out tree of the revision. GOAL is
# `build` first (apply.prebuild, before any slot), then `switch` (or `boot`): the activation.
# `eval -E EXPR` (after the build, for ginx's plan) prints the built system's path; that
# system's switch-to-configuration answers `dry-activate` as NixOS does, on stderr.
if [ "$1" = eval ]; then
  sys="$(dirname "$0")/systems/$GINX_REVISION"
  mkdir -p "$sys/bin"
  printf '#!/bin/sh\necho "would restart the following units: nginx.service" >&2\n' > "$sys/bin/switch-to-configuration"
  chmod +x "$sys/bin/switch-to-configuration"
  echo "\"$sys\""
  exit 0
fi
echo "[INFO ] Evaluating the hive in $PWD for node $3"
sleep 1
if [ "$4" = build ]; then
  echo "[INFO ] Build of revision ${GINX_REVISION:0:12} for $3 done"
else
  echo "[INFO ] Activation ($4) of revision ${GINX_REVISION:0:12} on $3 done"
fi
STUB
chmod +x "$work/colmena"

cat > "$work/etc/config.toml" <<TOML
state_dir = "$work/state"
socket = "$work/ginx.sock"

[node]
name = "lucy"

[sources.hephaestus]
url = "$work/hephaestus"
interval = "1h"      # the demo triggers fetches with 'ginxctl sync'

[apply]
command = ["$work/colmena", "apply-local", "--node", "{node}"]

[disruption]         # after the build, the stand-in tells ginx where the built system is
system_command = ["$work/colmena", "eval", "-E", "{ nodes, ... }: nodes.\\"{node}\\".config.system.build.toplevel.outPath"]

[control]
group = "$(id -gn)"

[rollout.gate]
settle = "2s"        # the health gate after each activation (default 1m; short for the demo)
TOML

echo "==> ginx check-config"
"$bin/ginx" check-config --config "$work/etc/config.toml" | sed 's/^/    /'

echo "==> starting ginx (log: $work/ginx.log)"
"$bin/ginx" --config "$work/etc/config.toml" > "$work/ginx.log" 2>&1 &
ginx_pid=$!
ctl() { "$bin/ginxctl" --socket "$work/ginx.sock" "$@"; }
wait_for() {
  for _ in $(seq 1 300); do
    if ctl status --json 2>/dev/null | grep -q "$1"; then return 0; fi
    sleep 0.1
  done
  echo "gave up waiting for $1; ginx log:"; cat "$work/ginx.log"; exit 1
}

first=$(git_ rev-parse HEAD)
wait_for "\"applied_revision\": \"$first\""
echo "==> ginxctl status (first revision applied)"
ctl status | sed 's/^/    /'

echo "==> a new commit, then ginxctl sync"
echo '{ meta.nixpkgs = <nixpkgs>; lucy = { ... }: { services.openssh.enable = true; }; }' > "$work/hephaestus/hive.nix"
git_ commit -q -am "lucy: enable openssh"
second=$(git_ rev-parse HEAD)
ctl sync | sed 's/^/    /'
ctl status | sed 's/^/    /'
wait_for "\"applied_revision\": \"$second\""

echo "==> ginxctl status (second revision applied)"
ctl status | sed 's/^/    /'
echo "==> ginxctl history --output"
ctl history --output | sed 's/^/    /'

echo "==> stopping ginx (SIGTERM) and cleaning up"
kill -TERM "$ginx_pid"
wait "$ginx_pid"
ginx_pid=
echo "demo finished: ginx applied $first and then $second"
