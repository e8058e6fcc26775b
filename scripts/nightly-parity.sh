#!/usr/bin/env bash
# The nightly parity step: runs every case under CASES on BACKENDS with `zoo parity run`,
# keeps its printed summary beside the results, and exits with zoo's status (non-zero when
# a case failed or errored), so the workflow's step is red exactly when parity is.
#
#   scripts/nightly-parity.sh BACKENDS [CASES] [OUT] [HISTORY]
#   scripts/nightly-parity.sh candle-cpu,pjrt-cpu,pjrt-cpu-x4,pjrt-cpu-tp4,pjrt-cpu-tp2pp2
#
# CASES (comma-separated folders) defaults to nightly/fixtures (models against
# transformers) and diffusers/tests/data/pipelines (pipelines against diffusers); OUT to
# parity-out, HISTORY to parity-history (each created when absent). ZOO_BIN names the zoo binary (default: a release build of zoo-cli).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -lt 1 ]; then
  echo "usage: $0 BACKENDS [CASES] [OUT] [HISTORY]" >&2
  exit 2
fi
backends="$1"
cases="${2:-$root/nightly/fixtures,$root/diffusers/tests/data/pipelines}"
out="${3:-parity-out}"
history="${4:-parity-history}"
mkdir -p "$out" "$history"
zoo="${ZOO_BIN:-}"
if [ -z "$zoo" ]; then
  cargo build --release -p zoo-cli --manifest-path "$root/Cargo.toml" >&2
  zoo="$root/target/release/zoo"
fi
set +e
case_args=()
IFS=',' read -ra case_dirs <<<"$cases"
for dir in "${case_dirs[@]}"; do
  case_args+=(--cases "$dir")
done
"$zoo" parity run "${case_args[@]}" --backends "$backends" --out "$out" --history "$history" \
  | tee "$out/summary.txt"
status=${PIPESTATUS[0]}
set -e
echo "zoo parity run exited with $status; summary in $out/summary.txt" >&2
exit "$status"
