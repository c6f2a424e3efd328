#!/usr/bin/env bash
# Idle memory of one ginx without Kubernetes, one or more binaries side
# by side in the same run:
#
#   bench/idle-rss.sh                      builds the release ginx and ginxctl, measures them
#   bench/idle-rss.sh OLD/ginx NEW/ginx    measures each binary given, all at the same time
#
# Each ginx gets its own state directory, socket and configuration: two sources (hephaestus,
# holding a trivial hive, and argus) served by one `git daemon` on 127.0.0.1, the default poll
# interval, no kubeconfig (nothing reported to a cluster, the node marker absent so no health
# probe runs), and the stand-in colmena of the tests (tests/support/colmena-stub) as the apply
# command. Once every ginx has fetched both sources and applied hephaestus's head (polled with
# `ginxctl status --json`), all of them sit idle for IDLE_SECONDS (default 60); then, per
# binary, VmRSS, VmHWM, RssAnon and RssFile from /proc/PID/status, the binary's size, and the
# file-backed RSS by mapped file (from /proc/PID/smaps). ginxctl is the one beside each binary,
# else $GINXCTL. Every process the script started is stopped by its pid at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
idle=${IDLE_SECONDS:-60}

if [ $# -eq 0 ]; then
  (cd "$root" && CARGO_BUILD_JOBS=1 nice -n 19 cargo build --release -j 1 --bin ginx --bin ginxctl)
  set -- "${CARGO_TARGET_DIR:-$root/target}/release/ginx"
fi
for b in "$@"; do
  [ -x "$b" ] || { echo "idle-rss: $b is not an executable" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/ginx-idle-rss.XXXXXX")
started=()
cleanup() {
  for p in "${started[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${started[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# git without the machine's or the user's configuration (as tests/support/git.rs).
g() {
  env -u GIT_DIR -u GIT_WORK_TREE -u GIT_COMMON_DIR -u GIT_INDEX_FILE -u GIT_OBJECT_DIRECTORY \
    GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null \
    GIT_AUTHOR_NAME=Bench GIT_AUTHOR_EMAIL=bench@example.com \
    GIT_COMMITTER_NAME=Bench GIT_COMMITTER_EMAIL=bench@example.com git "$@"
}

# A value out of `ginxctl status --json` (a jq path), empty when absent.
field() {
  if command -v jq >/dev/null; then
    jq -r "$1 // empty" 2>/dev/null
  else
    python3 -c 'import json,sys
v=json.load(sys.stdin)
for k in sys.argv[1].lstrip(".").split("."): v=v.get(k) if isinstance(v,dict) else None
print("" if v is None else v)' "$1" 2>/dev/null
  fi
}

declare -A head
for name in hephaestus argus; do
  g init -q -b main "$work/src/$name"
  if [ "$name" = hephaestus ]; then
    echo '{ meta.nixpkgs = <nixpkgs>; }' > "$work/src/$name/hive.nix"
  else
    echo 'endpoint: 10.0.0.100:6443' > "$work/src/$name/cluster.yaml"
  fi
  g -C "$work/src/$name" add -A
  g -C "$work/src/$name" commit -q -m "$name"
  head[$name]=$(g -C "$work/src/$name" rev-parse HEAD)
  g clone -q --bare "$work/src/$name" "$work/served/$name.git"
done

# git daemon on a free port of 127.0.0.1: a few random ports are tried.
port=
for _ in $(seq 20); do
  p=$((20000 + RANDOM % 40000))
  # git-daemon itself rather than `git daemon`, so that the pid is the server's.
  env GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null "$(git --exec-path)/git-daemon" \
    --listen=127.0.0.1 --port="$p" --export-all --base-path="$work/served" "$work/served" \
    </dev/null >/dev/null 2>"$work/git-daemon.log" &
  dpid=$!
  for _ in $(seq 50); do
    if g ls-remote "git://127.0.0.1:$p/argus.git" >/dev/null 2>&1; then port=$p; break; fi
    kill -0 "$dpid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -n "$port" ]; then started+=("$dpid"); break; fi
  kill "$dpid" 2>/dev/null || true
  wait "$dpid" 2>/dev/null || true
done
[ -n "$port" ] || { echo "idle-rss: git daemon did not start" >&2; cat "$work/git-daemon.log" >&2; exit 1; }

pids=() ctls=()
i=0
for bin in "$@"; do
  i=$((i + 1))
  d=$work/ginx-$i
  mkdir -p "$d/stub" "$d/run" "$d/bin"
  cp "$root/tests/support/colmena-stub" "$d/bin/colmena"
  chmod 755 "$d/bin/colmena"
  cat > "$d/config.toml" <<EOF
state_dir = "$d/state"
socket = "$d/run/ginx.sock"

[node]
name = "idle"

[sources.hephaestus]
url = "git://127.0.0.1:$port/hephaestus.git"

[sources.argus]
url = "git://127.0.0.1:$port/argus.git"

[apply]
command = ["$d/bin/colmena", "apply-local", "--node", "{node}"]

[control]
group = "$(id -gn)"

[rollout.gate]
settle = "0s"

[kubernetes]
node_kubeconfig = "$d/kubelet.conf"

[health]
node_marker = "$d/kubelet.conf"
EOF
  ctl=${GINXCTL:-$(dirname "$bin")/ginxctl}
  [ -x "$ctl" ] || { echo "idle-rss: no ginxctl beside $bin; set GINXCTL" >&2; exit 2; }
  env -u NOTIFY_SOCKET -u GINX_SOCKET GINX_STUB_DIR="$d/stub" RUST_LOG=info \
    "$bin" --config "$d/config.toml" </dev/null >"$d/ginx.log" 2>&1 &
  pids+=("$!") ctls+=("$ctl")
  started+=("$!")
done

# Settled: both sources fetched, hephaestus's head applied.
for n in "${!pids[@]}"; do
  d=$work/ginx-$((n + 1))
  ok=
  for _ in $(seq 1200); do
    s=$("${ctls[$n]}" --socket "$d/run/ginx.sock" --timeout 5s status --json 2>/dev/null) || s=
    if [ -n "$s" ] &&
      [ "$(field .apply.state <<<"$s")" = succeeded ] &&
      [ "$(field .apply.applied_revision <<<"$s")" = "${head[hephaestus]}" ] &&
      [ "$(field .sources.hephaestus.revision <<<"$s")" = "${head[hephaestus]}" ] &&
      [ "$(field .sources.argus.revision <<<"$s")" = "${head[argus]}" ]; then
      ok=1
      break
    fi
    kill -0 "${pids[$n]}" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$ok" ]; then
    echo "idle-rss: ginx $((n + 1)) did not settle; its log:" >&2
    tail -n 30 "$d/ginx.log" >&2
    exit 1
  fi
done
echo "idle-rss: ${#pids[@]} ginx settled (git daemon on 127.0.0.1:$port); idle for ${idle}s" >&2
sleep "$idle"

mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
kib() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$2/status"; }
printf '| %-3s | %-9s | %-7s | %-7s | %-7s | %-7s | %s\n' \
  '#' 'size MiB' 'VmRSS' 'VmHWM' 'RssAnon' 'RssFile' 'binary'
printf '| --- | --------- | ------- | ------- | ------- | ------- | ------\n'
details=()
for n in "${!pids[@]}"; do
  pid=${pids[$n]} bin=${*:$((n + 1)):1}
  kill -0 "$pid" 2>/dev/null || { echo "idle-rss: ginx $((n + 1)) exited" >&2; exit 1; }
  size=$(stat -c %s "$bin")
  printf '| %-3s | %-9s | %-7s | %-7s | %-7s | %-7s | %s\n' "$((n + 1))" \
    "$(awk -v b="$size" 'BEGIN { printf "%.1f", b / 1048576 }')" \
    "$(mib "$(kib VmRSS "$pid")")" "$(mib "$(kib VmHWM "$pid")")" \
    "$(mib "$(kib RssAnon "$pid")")" "$(mib "$(kib RssFile "$pid")")" "$bin"
  # File-backed RSS by file, largest first.
  details+=("$((n + 1)): $(awk '
    /^[0-9a-f]+-[0-9a-f]+ / { file = ($6 ~ /^\//) ? $6 : "" }
    /^Rss:/ && file != "" { rss[file] += $2 }
    END { for (f in rss) if (rss[f] >= 64) printf "%d %s\n", rss[f], f }' "/proc/$pid/smaps" |
    sort -rn | head -n 6 | awk '{ n = split($2, p, "/"); printf "%s%s %.1f", sep, p[n], $1 / 1024; sep = ", " }')")
done
echo "RSS in MiB after ${idle}s idle. File-backed RSS by file (MiB, >= 64 KiB):"
printf '  %s\n' "${details[@]}"
