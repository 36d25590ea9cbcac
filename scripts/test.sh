#!/usr/bin/env bash
# README command 2: the whole test suite, as CI runs it.
# Installs what it needs (idempotently, outside the checkout), then checks
# formatting and lints and runs every test, backends included.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
apt_install libgloo-dev redis-server
# ip (network namespaces) for the cut-link fault test over Gloo.
apt_install iproute2
# The pinned torch (outside the checkout): torchrun and libtorch for the tests
# that need them.
eval "$(scripts/setup-torch.sh)"
# NCCL 2.29.7 (pip wheel; the torch set-up's copy when present) for the nccl
# crate's tests: real unique ids and communicator errors without a GPU.
eval "$(scripts/setup-nccl.sh)"
# Backends this script installs must not be skipped by their tests for being
# missing. (A behaviour an engine cannot show — c10d cannot interrupt peers
# blocked inside a collective — is skipped with its reason printed.)
export CCOL_STRICT_SKIPS=1
features=(--features compiler-collectives-cli/gloo)

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy (default members, then every crate with Gloo)"
cargo clippy --all-targets --quiet -- -D warnings
cargo clippy --workspace --all-targets "${features[@]}" --quiet -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet -p compiler-collectives-core -p compiler-collectives
echo "== core depends on no backend"
deps=$(cargo tree -p compiler-collectives-core -e normal,build --prefix none --quiet)
if grep -Ei '^(compiler-collectives-(gloo|nccl|tch)|cudarc|tch|torch-sys|libloading|cc) ' <<<"$deps"; then
    echo "compiler-collectives-core must not depend on a backend or native code" >&2
    exit 1
fi
grep -q '^#!\[forbid(unsafe_code)\]' crates/core/src/lib.rs || { echo "core must forbid unsafe code" >&2; exit 1; }
echo "== cargo test (default members: no native libraries needed; the NCCL crate's CPU tests"
echo "   use the pip NCCL set up above, its GPU suite says why it skips without GPUs)"
cargo test --quiet 2>&1
echo "== cargo test: Gloo backend (real processes, redis, torchrun)"
cargo test --quiet -p compiler-collectives-gloo 2>&1
echo "== cargo test: ccol demo over Gloo"
cargo test --quiet -p compiler-collectives-cli "${features[@]}" --test demo 2>&1
cargo test --quiet -p compiler-collectives-cli "${features[@]}" --test demo_profile 2>&1
echo "== cargo test: Debian's Gloo and libtorch's c10d Gloo in one process"
cargo test --quiet -p compiler-collectives-gloo-libtorch 2>&1
echo "== cargo test: libtorch c10d process groups (real processes)"
cargo test --quiet -p compiler-collectives-tch 2>&1
