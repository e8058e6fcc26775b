#!/usr/bin/env bash
# Installs the Debian package behind each missing command, so a script's tools are there on a
# fresh machine:   scripts/need-commands.sh COMMAND=PACKAGE [COMMAND=PACKAGE...]
# Uses apt-get (through sudo when not root); where there is no apt-get, names what to install
# and exits 1.
set -euo pipefail
missing=()
for pair in "$@"; do
  command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "zoo: install ${missing[*]} (the commands the tests run), then run this again" >&2
  exit 1
fi
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
echo "zoo: installing Debian's ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
