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
echo "== core depends on no backend"
deps=$(cargo tree -p compiler-collectives-core -e normal,build --prefix none --quiet)
if grep -Ei '^(compiler-collectives-(gloo|nccl|tch)|cudarc|tch|torch-sys|libloading|cc) ' <<<"$deps"; then
    echo "compiler-collectives-core must not depend on a backend or native code" >&2
    exit 1
fi
grep -q '^#!\[forbid(unsafe_code)\]' crates/core/src/lib.rs || { echo "core must forbid unsafe code" >&2; exit 1; }
