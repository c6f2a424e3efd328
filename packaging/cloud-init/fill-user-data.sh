#!/usr/bin/env bash
# Fills user-data.yaml (beside this script) for one kaas VM and prints it:
#   fill-user-data.sh NAME ROLE DEPLOY_KEY_FILE 'HOST_KEY_LINE' > user-data-NAME.yaml
# NAME: the VM's node name; ROLE: worker | control-plane; DEPLOY_KEY_FILE: the private key;
# HOST_KEY_LINE: the Git server's known_hosts line, checked against a trusted fingerprint.
set -euo pipefail
if [ $# -ne 4 ]; then
  echo "usage: $0 NAME ROLE DEPLOY_KEY_FILE 'HOST_KEY_LINE'" >&2
  exit 2
fi
name=$1 role=$2 key=$3 host_key=$4
case "$name" in
  *[!A-Za-z0-9.-]* | "") echo "$0: NAME must be a host name (letters, digits, '.', '-'): $name" >&2; exit 2 ;;
esac
case "$role" in
  worker | control-plane) ;;
  *) echo "$0: ROLE must be worker or control-plane: $role" >&2; exit 2 ;;
esac
if ! grep -q -- '-----BEGIN OPENSSH PRIVATE KEY-----' "$key"; then
  echo "$0: $key is not an OpenSSH private key" >&2
  exit 2
fi
case "$host_key" in
  *'|'* | *'&'* | *'\'* | *$'\n'*) echo "$0: HOST_KEY_LINE must be one known_hosts line" >&2; exit 2 ;;
esac
template="$(dirname "$0")/user-data.yaml"
indented=$(mktemp)
trap 'rm -f "$indented"' EXIT
sed 's/^/      /' "$key" > "$indented"    # the YAML block's indentation
sed -e "s/^      name = \"kaas-worker-1\"$/      name = \"$name\"/" \
    -e "s/^      role = \"worker\"$/      role = \"$role\"/" \
    -e "s|^      git.example.com ssh-ed25519 .*|      $host_key|" \
    -e '/BEGIN OPENSSH PRIVATE KEY/d; /END OPENSSH PRIVATE KEY/d' \
    -e "/(the private half of the deploy key)/{r $indented" -e 'd}' \
    "$template"
