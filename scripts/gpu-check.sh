#!/usr/bin/env bash
# zoo's GPU check, for a machine with an NVIDIA GPU: builds zoo with candle's CUDA backend
# (`--features cuda`, when the CUDA toolkit's nvcc is here), finds the PJRT CUDA plugin, then
#   1. `zoo devices` (the plugins found and their devices),
#   2. every committed parity case on `pjrt-cuda` and `candle-cuda` (cuda:0),
#   3. SmolLM2-135M f32 decode/prefill on both, as one table,
# and exits non-zero when a case fails or a backend cannot run. Without a GPU it says so in
# one line and exits 0. Budget: under 8 minutes on a fresh GPU machine (most of it the build).
#
#   scripts/gpu-check.sh [OUT_DIR]        (default .cache/gpu-check; results and the table)
#
# The plugin: ZOO_PJRT_CUDA_PLUGIN (a .so), else an installed jax-cuda13-pjrt/jax-cuda12-pjrt
# (zoo's discovery), else pip downloads jax-cuda13-pjrt (then jax-cuda12-pjrt) here.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${1:-$root/.cache/gpu-check}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi lists none); nothing to check"
  exit 0
fi
mkdir -p "$out"
start=$(date +%s)
nvidia-smi -L

# The PJRT CUDA plugin.
plugin="${ZOO_PJRT_CUDA_PLUGIN:-}"
if [ -z "$plugin" ]; then
  py="$(command -v python3 || true)"
  if [ -n "$py" ]; then
    plugin="$("$py" - <<'PY' 2>/dev/null || true
import glob, importlib.util, os
for pkg in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
    try:
        spec = importlib.util.find_spec(pkg)
    except ModuleNotFoundError:
        continue
    if spec and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            hits = glob.glob(os.path.join(d, "*.so"))
            if hits:
                print(hits[0]); raise SystemExit
PY
)"
    if [ -z "$plugin" ]; then
      for pkg in jax-cuda13-pjrt jax-cuda12-pjrt; do
        dest="$root/.cache/zoo-assets/$pkg"
        if [ ! -d "$dest" ] && "$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$dest.whl" "$pkg" >/dev/null 2>&1; then
          "$py" -m zipfile -e "$dest.whl"/*.whl "$dest" && rm -rf "$dest.whl"
        fi
        plugin="$(find "$dest" -name '*.so' -path '*xla_cuda*' 2>/dev/null | head -n1 || true)"
        [ -n "$plugin" ] && break
      done
    fi
  fi
fi
if [ -z "$plugin" ] || [ ! -f "$plugin" ]; then
  echo "gpu-check: no PJRT CUDA plugin: pip install jax-cuda13-pjrt (or jax-cuda12-pjrt), or set ZOO_PJRT_CUDA_PLUGIN" >&2
  exit 1
fi
export PJRT_NAMES_AND_LIBRARY_PATHS="cuda:$plugin"
echo "gpu-check: PJRT CUDA plugin $plugin"

features=()
backends="pjrt-cuda"
if command -v nvcc >/dev/null 2>&1; then
  features=(--features cuda)
  backends="pjrt-cuda,candle-cuda"
else
  echo "gpu-check: nvcc not found, so zoo is built without candle's CUDA backend; candle-cuda is not checked (install the CUDA toolkit)" >&2
fi
eval "$(scripts/fetch-test-assets.sh)"
echo "gpu-check: building zoo (release ${features[*]})"
cargo build --quiet --release -p zoo-cli "${features[@]}"
cargo build --quiet --release --manifest-path benchmarks/Cargo.toml --target-dir target/bench \
  --bin smollm2 "${features[@]}"
zoo="$root/target/release/zoo"

status=0
echo "== zoo devices"
"$zoo" devices || status=1
echo "== parity: nightly/fixtures on $backends"
"$zoo" parity run --cases nightly/fixtures --backends "$backends" --out "$out/parity" \
  | tee "$out/parity-summary.txt" || status=1
echo "== SmolLM2 f32 on the GPU"
target/bench/release/smollm2 --gpu | tee "$out/bench.txt" || status=1
echo "gpu-check: done in $(( $(date +%s) - start )) s; results in $out"
exit $status
