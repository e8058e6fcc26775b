#!/usr/bin/env bash
# The peers' own test configurations: writes a parity case for every config that
# transformers' model tests build for the families zoo has (nightly/reference/tester.py) and
# for the pipelines of diffusers' tests (`--tester` of pipelines.py, patch_pipelines.py and
# flow_pipelines.py), all from
# tester_configs.json, into CASES with the reference venv, then runs zoo's parity harness on
# them (scripts/nightly-parity.sh) and prints how many passed. The scheduler tests' own
# configs (`schedulers.py --tester`) go into SCHEDULER_CASES (default
# .cache/zoo-tester-schedulers) and run through zoo-diffusers' scheduler tester test, on
# candle CPU and the XLA CPU plugin.
#
#   scripts/tester-sweep.sh [BACKENDS] [CASES] [OUT] [HISTORY]
#   scripts/tester-sweep.sh candle-cpu,pjrt-cpu
#
# BACKENDS defaults to candle-cpu,pjrt-cpu; CASES to .cache/zoo-tester-cases; OUT and
# HISTORY to tester-out and tester-history. Needs the reference venv (.venv, from
# nightly/reference/requirements.txt; PYTHON names another interpreter) and, for pjrt-cpu,
# a PJRT CPU plugin (scripts/fetch-test-assets.sh). With GENERATE_ONLY=1 it writes the
# cases and stops (the nightly workflow runs them together with the fixtures).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
backends="${1:-candle-cpu,pjrt-cpu}"
cases="${2:-$root/.cache/zoo-tester-cases}"
out="${3:-tester-out}"
history="${4:-tester-history}"
python="${PYTHON:-$root/.venv/bin/python}"
if [ ! -x "$python" ]; then
  echo "tester-sweep.sh: no reference venv at $python; create it: python3 -m venv .venv && .venv/bin/pip install -r nightly/reference/requirements.txt" >&2
  exit 2
fi
mkdir -p "$cases"
"$python" "$root/nightly/reference/generate.py" --tester --out "$cases" >&2
"$python" "$root/nightly/reference/pipelines.py" --tester --out "$cases" >&2
"$python" "$root/nightly/reference/patch_pipelines.py" --tester --out "$cases" >&2
"$python" "$root/nightly/reference/flow_pipelines.py" --tester "$cases" >&2
schedulers="${SCHEDULER_CASES:-$root/.cache/zoo-tester-schedulers}"
"$python" "$root/nightly/reference/schedulers.py" --tester "$schedulers" >&2
echo "tester-sweep.sh: $(find "$cases" -mindepth 1 -maxdepth 1 -type d ! -name '.*' | wc -l) cases in $cases, $(find "$schedulers" -mindepth 1 -maxdepth 1 -type d | wc -l) scheduler cases in $schedulers" >&2
if [ "${GENERATE_ONLY:-0}" = 1 ]; then
  exit 0
fi
if [ -z "${ZOO_PJRT_CPU_PLUGIN:-}" ]; then
  eval "$("$root/scripts/fetch-test-assets.sh")"
fi
set +e
"$root/scripts/nightly-parity.sh" "$backends" "$cases" "$out" "$history"
status=$?
ZOO_SCHEDULER_CASES="$schedulers" cargo test --manifest-path "$root/Cargo.toml" -p zoo-diffusers --test schedulers \
  -- --ignored scheduler_tester_configs_match_diffusers --nocapture
scheduler_status=$?
set -e
[ "$status" = 0 ] && [ "$scheduler_status" = 0 ]
