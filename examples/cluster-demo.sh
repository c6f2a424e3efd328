#!/usr/bin/env bash
# ginx in a cluster, in five minutes: a real Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager built from Kubernetes' own Go modules, tests/control-plane/) on
# 127.0.0.1, three nodes lucy, makise and quinn, and three ginx daemons against one local
# Hephaestus repository, each with its own identity made through the CSR API as docs/src/install.md says.
# A commit then rolls through the three one at a time, through the rollout lock's slot Lease.
# Everything lives in a temporary directory and is stopped and removed at the end.
#
# Needs: cargo, go >= 1.26 (the first control-plane build takes about 10 minutes), git,
# openssl, python3 (to find free ports).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
echo "==> building ginx, ginxctl and the test control plane"
cargo build --quiet --manifest-path "$here/Cargo.toml" --bin ginx --bin ginxctl
bash "$here/tests/control-plane/build.sh" | sed 's/^/    /'
built="${CARGO_TARGET_DIR:-$here/target}/debug"
cpbin="$here/target/control-plane/control-plane"
nodes=(lucy makise quinn)

work=$(mktemp -d -t ginx-cluster-demo-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  # Give each a few seconds to drain, then make sure.
  for _ in $(seq 1 50); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
# The daemons run from copies: each attempt starts ginx's own binary again, which a cargo build
# elsewhere during the demo would replace.
mkdir "$work/bin"
cp "$built/ginx" "$built/ginxctl" "$work/bin/"
bin=$work/bin

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
kubectl() { "$cpbin" kubectl --kubeconfig "$work/admin.kubeconfig" "$@"; }
wait_until() { # what, command...
  local what=$1; shift
  for _ in $(seq 1 600); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "gave up waiting for $what" >&2
  for log in "$work"/*.log; do
    case "$log" in */audit.log) continue ;; esac
    echo "--- $log" >&2
    tail -n 15 "$log" >&2
  done
  exit 1
}

echo "==> certificates: a cluster CA, the API server's serving certificate, a service-account key"
pki=$work/pki
mkdir -p "$pki"
openssl_() { openssl "$@" 2>/dev/null; }
openssl_ req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
  -keyout "$pki/ca.key" -out "$pki/ca.crt" -subj "/CN=ginx demo CA"
openssl_ req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$pki/apiserver.key" \
  -out "$pki/apiserver.csr" -subj "/CN=kube-apiserver"
printf 'subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost,IP:127.0.0.1,IP:10.0.0.1\nextendedKeyUsage=serverAuth\n' > "$pki/san.ext"
openssl_ x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -days 1 -extfile "$pki/san.ext" -out "$pki/apiserver.crt"
openssl_ genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$pki/sa.key"
openssl_ pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
client_cert() { # name subject
  openssl_ req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$pki/$1.key" \
    -out "$pki/$1.csr" -subj "$2"
  printf 'extendedKeyUsage=clientAuth\n' > "$pki/client.ext"
  openssl_ x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 1 -extfile "$pki/client.ext" -out "$pki/$1.crt"
}
client_cert admin "/O=system:masters/CN=admin"
client_cert controller-manager "/CN=system:kube-controller-manager"

etcd_port=$(free_port) peer_port=$(free_port) api_port=$(free_port)
url=https://127.0.0.1:$api_port
kubeconfig() { # file cert key
  "$cpbin" kubectl config set-cluster demo --server="$url" --certificate-authority="$pki/ca.crt" \
    --embed-certs --kubeconfig="$1" >/dev/null
  "$cpbin" kubectl config set-credentials user --client-certificate="$2" --client-key="$3" \
    --embed-certs --kubeconfig="$1" >/dev/null
  "$cpbin" kubectl config set-context demo --cluster=demo --user=user --kubeconfig="$1" >/dev/null
  "$cpbin" kubectl config use-context demo --kubeconfig="$1" >/dev/null
  chmod 600 "$1"
}
kubeconfig "$work/admin.kubeconfig" "$pki/admin.crt" "$pki/admin.key"
kubeconfig "$work/controller-manager.kubeconfig" "$pki/controller-manager.crt" "$pki/controller-manager.key"

echo "==> etcd, kube-apiserver (Node,RBAC, NodeRestriction, audit log) and kube-controller-manager on 127.0.0.1"
mkdir -m 700 "$work/etcd"
"$cpbin" etcd --name=default --data-dir="$work/etcd" \
  --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
  --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
  --initial-cluster="default=http://127.0.0.1:$peer_port" --unsafe-no-fsync=true --log-level=warn \
  > "$work/etcd.log" 2>&1 &
pids+=($!)
printf 'apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n' > "$work/audit-policy.yaml"
"$cpbin" kube-apiserver --etcd-servers="http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 \
  --advertise-address=127.0.0.1 --secure-port="$api_port" --cert-dir="$pki" \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-cluster-ip-range=10.0.0.0/24 --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --endpoint-reconciler-type=none \
  --audit-policy-file="$work/audit-policy.yaml" --audit-log-path="$work/audit.log" --profiling=false \
  > "$work/kube-apiserver.log" 2>&1 &
pids+=($!)
wait_until "the API server's /readyz" kubectl get --raw /readyz
"$cpbin" kube-controller-manager --kubeconfig="$work/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$work/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$work/controller-manager.kubeconfig" \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
  --use-service-account-credentials=true --controllers='*' --leader-elect=false \
  --service-cluster-ip-range=10.0.0.0/24 --secure-port=0 \
  --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
  > "$work/kube-controller-manager.log" 2>&1 &
pids+=($!)
kubectl version | sed 's/^/    /'

echo "==> nodes lucy, makise, quinn (no kubelets here: a loop renews their node leases)"
for n in "${nodes[@]}"; do
  kubectl create -f - >/dev/null <<NODE
apiVersion: v1
kind: Node
metadata:
  name: $n
  labels: {kubernetes.io/hostname: $n, node-role.kubernetes.io/control-plane: ""}
NODE
done
renew_nodes() {
  while :; do
    for n in "${nodes[@]}"; do
      now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
      kubectl patch node "$n" --subresource=status --type=strategic -p \
        "{\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"KubeletReady\",\"message\":\"stand-in kubelet\",\"lastHeartbeatTime\":\"$now\",\"lastTransitionTime\":\"$now\"}]}}" >/dev/null 2>&1 || true
    done
    sleep 10
  done
}
renew_nodes > "$work/renew-nodes.log" 2>&1 &
pids+=($!)

issued() { [ -n "$(kubectl get csr "$1" -o jsonpath='{.status.certificate}')" ]; }
echo "==> rbac.yaml and vap.yaml, then each node's two identities through the CSR API (docs/src/security.md)"
kubectl apply -f "$here/packaging/kubernetes/rbac.yaml" -f "$here/packaging/kubernetes/vap.yaml" | sed 's/^/    /'
identity() { # name subject file-prefix
  openssl_ req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$pki/$3.key" -subj "$2" -out "$pki/$3.csr"
  kubectl apply -f - >/dev/null <<CSR
apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata: { name: $1 }
spec:
  signerName: kubernetes.io/kube-apiserver-client
  usages: [client auth]
  expirationSeconds: 86400
  request: $(base64 -w0 < "$pki/$3.csr")
CSR
  kubectl certificate approve "$1" >/dev/null
  wait_until "the certificate of $1" issued "$1"
  kubectl get csr "$1" -o jsonpath='{.status.certificate}' | base64 -d > "$pki/$3.crt"
}
for n in "${nodes[@]}"; do
  mkdir -p "$work/$n"
  # ginx's own: the Leases in ginx-system and the ginx-rollout ConfigMap.
  identity "ginx-$n" "/O=ginx:nodes/CN=ginx:$n" "ginx-$n"
  kubeconfig "$work/$n/kubeconfig" "$pki/ginx-$n.crt" "$pki/ginx-$n.key"
  # The node's own, as kubeadm's kubelet.conf: its Node's annotations and condition.
  identity "node-$n" "/O=system:nodes/CN=system:node:$n" "node-$n"
  kubeconfig "$work/$n/kubelet.conf" "$pki/node-$n.crt" "$pki/node-$n.key"
done
kubectl get csr | sed 's/^/    /'

git_() { git -C "$work/hephaestus" -c user.name=Demo -c user.email=demo@example.com "$@"; }
echo "==> one Hephaestus repository for all three nodes, and a stand-in colmena apply-local"
mkdir -p "$work/hephaestus"
git_ init -q -b main
echo '{ meta.nixpkgs = <nixpkgs>; lucy = { ... }: { }; makise = { ... }: { }; quinn = { ... }: { }; }' > "$work/hephaestus/hive.nix"
git_ add hive.nix
git_ commit -q -m "initial hive"
cat > "$work/colmena" <<STUB
#!/usr/bin/env bash
# argv: apply-local --node NAME GOAL; runs in the checked-out tree of the revision. Takes 2 s,
# and notes its start and end in one journal for all three nodes. GOAL is \`build\` first
# (apply.prebuild: no slot, every node at once), then \`switch\`: the activation, under the lock.
# \`eval -E EXPR\` (after the build, for ginx's plan) prints the built system's path; its
# switch-to-configuration answers \`dry-activate\` as NixOS does, on stderr.
if [ "\$1" = eval ]; then
  sys="$work/systems/\$GINX_REVISION"
  mkdir -p "\$sys/bin"
  printf '#!/bin/sh\\necho "would restart the following units: nginx.service" >&2\\n' > "\$sys/bin/switch-to-configuration"
  chmod +x "\$sys/bin/switch-to-configuration"
  echo "\"\$sys\""
  exit 0
fi
if [ "\$4" = build ]; then started=building ended=built; else started=activating ended=activated; fi
echo "\$(date +%T.%3N) \$3 \$started \${GINX_REVISION:0:12}" >> "$work/journal"
sleep 2
if [ "\$4" = build ]; then
  echo "[INFO ] Build of revision \${GINX_REVISION:0:12} for \$3 done"
else
  echo "[INFO ] Activation (\$4) of revision \${GINX_REVISION:0:12} on \$3 done"
fi
echo "\$(date +%T.%3N) \$3 \$ended" >> "$work/journal"
STUB
chmod +x "$work/colmena"

echo "==> three ginx daemons"
for n in "${nodes[@]}"; do
  mkdir -p "$work/$n"
  cat > "$work/$n/config.toml" <<TOML
state_dir = "$work/$n/state"
socket = "$work/$n/ginx.sock"

[node]
name = "$n"
role = "control-plane"

[sources.hephaestus]
url = "$work/hephaestus"
interval = "1h"      # the demo triggers fetches with 'ginxctl sync'

[apply]
command = ["$work/colmena", "apply-local", "--node", "{node}"]

[disruption]         # after the build, the stand-in tells ginx where the built system is
system_command = ["$work/colmena", "eval", "-E", "{ nodes, ... }: nodes.\\"{node}\\".config.system.build.toplevel.outPath"]

[control]
group = "$(id -gn)"

[kubernetes]
kubeconfig = "$work/$n/kubeconfig"
node_kubeconfig = "$work/$n/kubelet.conf"

# The rollout lock is on (a kubeconfig is there): one control-plane node at a time, each
# healthy for 2 s after its activation before the next may start.
[rollout.gate]
settle = "2s"
interval = "500ms"
command = ["sh", "-c", "echo \"\$(date +%T.%3N) $n gate check ok\" >> $work/journal"]

# No kubelet, Cilium or systemd here: only the node's Ready condition is probed.
[health.kubelet]
enabled = false
[health.apiserver]
enabled = false
[health.cilium]
enabled = false
[health.systemd]
enabled = false
TOML
  "$bin/ginx" --config "$work/$n/config.toml" > "$work/ginx-$n.log" 2>&1 &
  pids+=($!)
done
ctl() { local n=$1; shift; "$bin/ginxctl" --socket "$work/$n/ginx.sock" "$@"; }
annotated() { # revision: applied and through its health gate on every node
  for n in "${nodes[@]}"; do
    [ "$(kubectl get node "$n" -o jsonpath='{.metadata.annotations.ginx\.io/applied-revision} {.metadata.annotations.ginx\.io/apply-state}')" = "$1 succeeded" ] || return 1
  done
}
healthy() {
  for n in "${nodes[@]}"; do
    [ "$(kubectl get node "$n" -o jsonpath='{.status.conditions[?(@.type=="GinxHealthy")].status}')" = True ] || return 1
  done
}
show() {
  kubectl get nodes -o custom-columns='NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,GINX-HEALTHY:.status.conditions[?(@.type=="GinxHealthy")].status,APPLIED:.metadata.annotations.ginx\.io/applied-revision,STATE:.metadata.annotations.ginx\.io/apply-state,VERSION:.metadata.annotations.ginx\.io/version' | sed 's/^/    /'
}
first=$(git_ rev-parse HEAD)
wait_until "every node annotated with $first" annotated "$first"
wait_until "GinxHealthy on every node" healthy
echo "==> kubectl get nodes (ginx.io/ annotations and the GinxHealthy condition)"
show
echo "==> kubectl describe node lucy (ginx's part)"
kubectl get node lucy -o go-template='{{range $k, $v := .metadata.annotations}}{{$k}}: {{$v}}{{"\n"}}{{end}}{{range .status.conditions}}{{if eq .type "GinxHealthy"}}condition GinxHealthy={{.status}} reason={{.reason}} message="{{.message}}"{{"\n"}}{{end}}{{end}}' | grep -E '^(ginx\.io/|condition)' | sed 's/^/    /'
echo "==> kubectl -n ginx-system get leases (one heartbeat per node)"
kubectl -n ginx-system get leases | sed 's/^/    /'

echo "==> a new commit, then ginxctl sync on each node"
echo '{ meta.nixpkgs = <nixpkgs>; lucy = { ... }: { services.openssh.enable = true; }; makise = { ... }: { }; quinn = { ... }: { }; }' > "$work/hephaestus/hive.nix"
git_ commit -q -am "lucy: enable openssh"
second=$(git_ rev-parse HEAD)
: > "$work/journal"
for n in "${nodes[@]}"; do
  echo "    $n: $(ctl "$n" sync)"
done
# The builds (2 s each) run at once without a slot; show the fleet once the Nodes tell of the
# first activation (each daemon writes its node's annotations a moment after a change).
activation_shown() { ctl lucy cluster | grep -q ', 1 activating,'; }
wait_until "the first activation in ginxctl cluster" activation_shown
echo "==> ginxctl cluster, during the first activation: one node holds the slot, the others wait"
ctl lucy cluster | sed 's/^/    /'
wait_until "every node annotated with $second" annotated "$second"
echo "==> kubectl get nodes (the revision annotation moved to ${second:0:12})"
show
echo "==> the journal: the builds at once (no slot), then one activation at a time, its gate passed before the next one starts"
grep -v 'gate check' "$work/journal" | sed 's/^/    /'
# What the heading says, checked: no activation starts before the one before it ended and its
# node's health gate ran, and every node activated once.
python3 - "$work/journal" "${nodes[@]}" <<'PY'
import sys
nodes = sys.argv[2:]
active = None   # the node activating now
done = []       # the nodes activated, in order
gated = set()   # of those, the ones whose gate command ran after their activation
def fail(why):
    sys.exit(f"cluster demo FAILED: {why} (journal above)")
for line in open(sys.argv[1]):
    at, node, what = line.split()[:3]
    if what == "activating":
        if active is not None:
            fail(f"at {at} {node} started activating while {active} was still activating")
        if done and done[-1] not in gated:
            fail(f"at {at} {node} started activating before {done[-1]}'s health gate ran")
        active = node
    elif what == "activated":
        if active != node:
            fail(f"at {at} {node} ended an activation it had not started")
        active = None
        done.append(node)
    elif what == "gate" and node in done:
        gated.add(node)
if active is not None or sorted(done) != sorted(nodes):
    fail(f"activations ended: {done}, still activating: {active}; wanted each of {nodes} once")
print(f"    checked: {' -> '.join(done)}, one at a time, each after the gate of the one before")
PY
echo "==> who wrote the slot Lease ginx-rollout-control-plane-0, in order (audit log)"
python3 - "$work/audit.log" <<'PY' | sed 's/^/    /'
import json, sys
last = None
for line in open(sys.argv[1]):
    e = json.loads(line)
    ref = e.get("objectRef") or {}
    if ref.get("name") != "ginx-rollout-control-plane-0" or e.get("verb") not in ("create", "update"):
        continue
    if e.get("responseStatus", {}).get("code", 0) >= 300:
        continue
    who = e["user"]["username"]
    if who != last:
        print(e["stageTimestamp"][11:23], who)
        last = who
PY
echo "==> ginxctl status on lucy"
ctl lucy status | sed 's/^/    /'

echo "==> what ginx asked of the API server (from its audit log), by identity: its own, and the node's"
grep '"userAgent":"ginx/' "$work/audit.log" | grep -o '"username":"[a-z:]*"' | sort | uniq -c | sed 's/^/    /'

echo "==> stopping everything and cleaning up"
echo "cluster demo finished: lucy, makise and quinn applied $first, then $second one at a time"
