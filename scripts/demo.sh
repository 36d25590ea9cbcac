#!/usr/bin/env bash
# README command 1: the main job. Builds `ccol` and runs the built-in scenario
# corpus (PyTorch's own multi-rank cases) over concurrent in-process ranks,
# checking every mode against its expectation, then shows one scenario with
# and without compiler collectives.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
cargo build --release --quiet -p compiler-collectives-cli
ccol="$CARGO_TARGET_DIR/release/ccol"
echo "== every scenario, every mode with an expectation"
"$ccol" scenario check "$@"
echo
echo "== the tensor scenario: compiler collectives on (ranks agree at step 0)"
"$ccol" scenario run tests/scenarios/01_tensor.json --collectives
echo
echo "== the same job without compiler collectives (ranks recompile at different steps)"
"$ccol" scenario run tests/scenarios/01_tensor.json --no-collectives
