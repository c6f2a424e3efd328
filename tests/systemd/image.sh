#!/usr/bin/env bash
# The Debian tree of the real-systemd test tier (tests/systemd.rs): systemd as PID 1,
# cloud-init, git, Nix, OpenSSH's client, from Debian's packages alone (mmdebstrap). It holds
# no ginx: the tests install the binaries they built, and the shipped unit, into each
# container's own overlay.
#
# Usage: tests/systemd/image.sh [OUT_DIR [VARIANT]]   (default: target/systemd-image, container)
# VARIANT "vm" adds Debian's kernel and initrd (/boot) and DHCP on eth0 (systemd-networkd), for
# qemu (tests/qemu.rs). Prints the tree's path. The tree is cached under OUT_DIR by a hash of
# this script, the files beside it and the variant: an unchanged recipe is not built again.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/../../target/systemd-image}"
variant="${2:-container}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

packages=(
  systemd systemd-sysv dbus        # PID 1, systemctl, systemd-run, journald
  libssl3 zlib1g                   # what the ginx binary links
  git openssh-client ca-certificates   # fetches over SSH and HTTPS
  nix-bin                          # real Nix: the system profile's generations
  cloud-init                       # the kaas user-data's NoCloud seed
  procps iproute2 util-linux       # ps, ip, setpriv
)
vm_hooks=()
if [ "$variant" = vm ]; then
  packages+=(linux-image-amd64)    # a real kernel and Debian's initrd, booted by qemu
  vm_hooks=(
    --customize-hook='printf "[Match]\nName=eth0\n\n[Network]\nDHCP=yes\n" > "$1/etc/systemd/network/20-dhcp.network"'
    --customize-hook='chroot "$1" systemctl enable systemd-networkd'
    --customize-hook='chroot "$1" systemctl mask serial-getty@ttyS0.service'
  )
fi
hash="$( (cat "$0"; cd "$here/files" && find . -type f | LC_ALL=C sort | while read -r f; do echo "$f"; cat "$f"; done; printf '%s\n' "$variant" "${packages[@]}") | sha256sum | cut -c1-16)"
tree="$out/$hash/tree"
if [ -e "$out/$hash/done" ]; then
  echo "$tree"
  exit 0
fi
rm -rf "${out:?}/$hash"
mkdir -p "$out/$hash"
include="$(IFS=,; echo "${packages[*]}")"
mmdebstrap --mode=root --variant=minbase --format=directory --quiet \
  --include="$include" \
  --customize-hook="cp -a '$here/files/.' \"\$1/\"" \
  --customize-hook='chroot "$1" systemctl enable ginx-test-stage2.service' \
  --customize-hook='chroot "$1" systemctl mask getty@.service console-getty.service systemd-networkd-wait-online.service' \
  --customize-hook='rm -f "$1/etc/hostname"' \
  "${vm_hooks[@]}" \
  bookworm "$tree" http://deb.debian.org/debian >&2
touch "$out/$hash/done"
# Older trees of this recipe are not needed any more.
for d in "$out"/*/; do
  [ -e "$d/variant-$variant" ] && [ "$(basename "$d")" != "$hash" ] && rm -rf "$d"
done
touch "$out/$hash/variant-$variant"
echo "$tree"
