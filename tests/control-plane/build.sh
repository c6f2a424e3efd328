#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager, kubectl from
# Kubernetes' own Go modules) into target/control-plane/control-plane. Test support only: ginx
# itself is pure Rust. Rebuilt only when go.mod, go.sum or main.go change; Go's build cache
# (GOCACHE) and module cache (GOMODCACHE) make a rebuild after that cheap.
#
# Needs Go >= 1.26 (go.mod); an older `go` fetches that toolchain from the module proxy.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
out_dir=$top/target/control-plane   # where tests/support/control_plane.rs looks
out=$out_dir/control-plane
version=v1.36.3   # k8s.io/kubernetes in go.mod

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=/usr/local/go/bin:$PATH
fi
if ! command -v go >/dev/null 2>&1; then
  echo "control-plane: no 'go' on PATH (Go >= 1.26 is needed to build the test control plane;" >&2
  echo "  install it, e.g. apt-get install golang-go, which then fetches go1.26 itself)" >&2
  exit 1
fi
# An older go reads `go 1.26.0` in go.mod and switches to that toolchain when allowed to.
export GOTOOLCHAIN=${GOTOOLCHAIN_OVERRIDE:-auto}

stamp=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -d' ' -f1)
if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "control-plane: up to date ($out)"
  exit 0
fi
mkdir -p "$out_dir"
start=$(date +%s)
echo "control-plane: building Kubernetes $version components with $(go version | cut -d' ' -f3) (the first build takes about 10 minutes on 2 cores)"
(
  cd "$here"
  CGO_ENABLED=0 go build -trimpath -mod=readonly \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitVersion=$version" \
    -o "$out.tmp" .
)
mv "$out.tmp" "$out"
echo "$stamp" > "$out.stamp"
echo "control-plane: built $out in $(( $(date +%s) - start )) s"
