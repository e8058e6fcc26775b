#!/usr/bin/env bash
# `zoo serve` through the official `openai` Python client (nightly/clients/openai_client_check.py):
# a SmolLM2 server and an all-MiniLM-L6-v2 server on free ports, both behind a key; chat whole
# and streamed, completions, models, embeddings (base64 as the client asks), and the client's
# typed 400/404/401 errors. Needs a Python with `openai` (PYTHON, default .venv/bin/python;
# `pip install openai`). Exits non-zero when a check fails; the servers stop either way.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
python="${PYTHON:-.venv/bin/python}"
"$python" -c "import openai" 2>/dev/null || {
  echo "openai-client-check: $python has no openai package (pip install openai)" >&2
  exit 2
}
eval "$(scripts/fetch-test-assets.sh)"
cargo build --release -p zoo-cli
zoo="$root/target/release/zoo"
logs="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logs"' EXIT
start() { # name model log -> address on stdout
  "$zoo" serve "$2" --served-model-name "$1" --port 0 --api-key check >"$3" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do
    if addr="$(grep -o 'http://[0-9.:]*' "$3" | head -n1)" && [ -n "$addr" ]; then
      echo "$addr"
      return
    fi
    sleep 0.1
  done
  echo "openai-client-check: $1 did not start:" >&2
  cat "$3" >&2
  exit 1
}
chat="$(start smollm2 "$ZOO_SMOLLM2_GGUF" "$logs/chat.log")"
embed="$(start minilm "$ZOO_MINILM_DIR" "$logs/embed.log")"
"$python" nightly/clients/openai_client_check.py "$chat/v1" smollm2 "$embed/v1" minilm check
