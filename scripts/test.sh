#!/usr/bin/env bash
# README command 2: the whole test suite, as CI runs it.
# Installs what it needs (idempotently, outside the checkout), then checks
# formatting and lints and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --all-targets --quiet -- -D warnings
echo "== cargo test"
cargo test --quiet 2>&1
