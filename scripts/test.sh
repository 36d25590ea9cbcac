#!/usr/bin/env bash
# README command 2: the whole test suite, as CI runs it.
# Installs what it needs (idempotently, outside the checkout), then checks
# formatting and lints and runs every test, backends included.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
step "Debian packages"
apt_install libgloo-dev redis-server
# ip (network namespaces) for the cut-link fault test over Gloo.
apt_install iproute2
# The pinned torch versions, each in an environment of its own outside the
# checkout: 2.13.0 gives libtorch (tch-rs, c10d) and the first run of the
# PyTorch oracle; the package is tested on all three (docs/python.md,
# "Support matrix").
step "torch 2.13.0, 2.14.1 and 2.15.0 (pip; about 4.7 GB each the first time)"
scripts/setup-torch.sh 2.14.1 >/dev/null
scripts/setup-torch.sh 2.15.0 >/dev/null
eval "$(scripts/setup-torch.sh 2.13.0)"
# The training stacks the package is tested under (accelerate, Lightning;
# pinned, with torch and numpy held as they are, then pip check), in every
# torch environment: the 2.15.0 suite and the smoke set use them.
step "accelerate and Lightning (pip, into each torch environment)"
for v in 2.13.0 2.14.1 2.15.0; do scripts/setup-integrations.sh "$v"; done
# NCCL 2.29.7 (pip wheel; the torch set-up's copy when present) for the nccl
# crate's tests: real unique ids and communicator errors without a GPU.
step "NCCL 2.29.7 (pip)"
eval "$(scripts/setup-nccl.sh)"
# Backends this script installs must not be skipped by their tests for being
# missing. (A behaviour an engine cannot show — c10d cannot interrupt peers
# blocked inside a collective — is skipped with its reason printed.)
export CCOL_STRICT_SKIPS=1
features=(--features compiler-collectives-cli/gloo)
# `ccol` for the README's commands: $CCOL_CACHE/bin/ccol (prints the PATH line).
step "build and install ccol"
install_ccol
# The Python package: one wheel (maturin, then auditwheel grafts Gloo into
# it), built once and installed as that same file into every torch
# environment (pip --force-reinstall --no-deps, then pip check), for the
# PyTorch oracle's package runs and pytest. PyO3's builds find 2.13.0's Python.
step "compiler_collectives wheel (built once, installed into each torch environment)"
scripts/setup-python.sh 2.14.1 >/dev/null
scripts/setup-python.sh 2.15.0 >/dev/null
eval "$(scripts/setup-python.sh 2.13.0)"
export PYO3_PYTHON="$CCOL_TORCH_PYTHON"

step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy (default members, then every crate with Gloo)"
cargo clippy --all-targets -- -D warnings
cargo clippy --workspace --all-targets "${features[@]}" -- -D warnings
step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p compiler-collectives-core -p compiler-collectives -p compiler-collectives-harness -p compiler-collectives-gloo
step "core depends on no backend"
deps=$(cargo tree -p compiler-collectives-core -e normal,build --prefix none --quiet)
if grep -Ei '^(compiler-collectives-(gloo|nccl|tch)|cudarc|tch|torch-sys|libloading|cc) ' <<<"$deps"; then
    echo "compiler-collectives-core must not depend on a backend or native code" >&2
    exit 1
fi
grep -q '^#!\[forbid(unsafe_code)\]' crates/core/src/lib.rs || { echo "core must forbid unsafe code" >&2; exit 1; }
# Demo data, test-oracle formats and benchmark loops live in crates/harness.
if grep -rn 'common-licenses' crates/core; then
    echo "core holds no demo data (the demo corpus is crates/harness's)" >&2
    exit 1
fi
step "the repository cites only itself"
# README, ARCHITECTURE, help texts and code comments cite docs/ (the design a
# clone needs), never a file outside the checkout. (The bracket keeps this
# line from matching itself; fuzz/corpus holds fuzzer inputs, not prose.)
if git rev-parse --git-dir >/dev/null 2>&1; then
    outside=$(git grep -n -e '\.\./share[d]/' -e 'DESIG[N] §' -- ':!fuzz/corpus' || true)
    if [ -n "$outside" ]; then
        echo "citations of files outside the repository (cite docs/ instead):" >&2
        echo "$outside" >&2
        exit 1
    fi
fi
step "backends keep unsafe code in their sys/ffi modules"
# Every `unsafe` keyword outside a sys.rs/ffi.rs file (or a sys/, ffi/ directory),
# with // comments stripped; and each backend root denies unsafe code.
unsafe_outside=$(find crates/ffi/src crates/gloo/src crates/nccl/src crates/tch-integration/src -name '*.rs' \
    ! -name sys.rs ! -name ffi.rs ! -path '*/sys/*' ! -path '*/ffi/*' -print0 | sort -z |
    xargs -0 -r awk '{ code = $0; sub(/\/\/.*/, "", code) }
        code ~ /(^|[^A-Za-z0-9_])unsafe([^A-Za-z0-9_]|$)/ { print FILENAME ":" FNR ": " $0 }')
for root in crates/ffi/src/lib.rs crates/gloo/src/lib.rs crates/nccl/src/lib.rs crates/tch-integration/src/lib.rs; do
    grep -q '^#!\[deny(unsafe_code)\]' "$root" || unsafe_outside+="${unsafe_outside:+$'\n'}$root: lacks #![deny(unsafe_code)]"
done
if [ -n "$unsafe_outside" ]; then
    echo "unsafe code outside the backends' sys/ffi modules:" >&2
    echo "$unsafe_outside" >&2
    exit 1
fi
step "cargo test: default members (no native libraries needed)"
echo "   (the NCCL crate's CPU tests use the pip NCCL set up above, its GPU suite says why it skips without GPUs)"
cargo test -- --quiet 2>&1
step "cargo test: Gloo backend (real processes, redis, torchrun)"
cargo test -p compiler-collectives-gloo -- --quiet 2>&1
step "cargo test: ccol demo over Gloo"
cargo test -p compiler-collectives-cli "${features[@]}" --test demo -- --quiet 2>&1
cargo test -p compiler-collectives-cli "${features[@]}" --test demo_profile -- --quiet 2>&1
cargo test -p compiler-collectives-cli "${features[@]}" --test interrupt -- --quiet 2>&1
step "cargo test: Debian's Gloo and libtorch's c10d Gloo in one process"
cargo test -p compiler-collectives-gloo-libtorch -- --quiet 2>&1
step "cargo test: libtorch c10d process groups (real processes)"
cargo test -p compiler-collectives-tch -- --quiet 2>&1
# The facade with every backend feature (gloo, nccl, tch) builds and its docs test
# (a program linking libtorch finds it at run time through the library path, as
# tch-rs documents).
LD_LIBRARY_PATH="$LIBTORCH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test -p compiler-collectives --all-features -- --quiet 2>&1
# The package on each torch (docs/python.md, "Support matrix"): its whole
# suite on the newest; on the older ones the PyTorch oracle three ways (2.13.0
# in the default members' cargo test above) and a smoke set.
torch_python() { echo "$CCOL_CACHE/torch-$1/bin/python"; }
step "pytest on torch 2.15.0: the Python package's whole suite (torch.compile on our protocol, real ranks)"
"$(torch_python 2.15.0)" -m pytest -q -p no:cacheprovider crates/python/tests
step "torch 2.14.1: the PyTorch oracle (PyTorch's exchange, the package, none)"
CCOL_TORCH_PYTHON="$(torch_python 2.14.1)" CCOL_TORCHRUN="$CCOL_CACHE/torch-2.14.1/bin/torchrun" \
    cargo test -p compiler-collectives-cli --test pytorch_oracle -- --quiet 2>&1
# The smoke set: enable and its refusals, the version table, train_lm.py at
# 2 ranks (compile counts and losses bitwise those without the package), the
# frame states Dynamo folds (each the one PyTorch's exchange gives), and every
# agreement (each version hooks AOTAutograd's cache and the partitioner its
# own way; docs/python.md, "Every agreement"); the agreement policy where
# votes turn on, and a notice over the TCPStore (each version's seams); the
# training stacks (torchrun+DDP, the accelerate example, the Lightning
# callback); compile_once between two cache directories, one transfer
# rejected and one loaded (each version's AOTAutograd and Inductor cache
# seams); shard_kernels, each kernel built once (each version's
# AsyncCompile seams).
smoke=(
    crates/python/tests/test_agreements.py
    crates/python/tests/test_enable.py
    crates/python/tests/test_versions.py
    "crates/python/tests/test_train.py::test_every_rank_compiles_the_same_and_losses_are_bitwise_those_without_the_package[2]"
    crates/python/tests/test_ranks.py::test_the_package_keeps_dynamos_fold_where_the_join_would_differ
    # The cases of the agreement policy's one job (tests/ranks/policy.py).
    crates/python/tests/test_policy.py::test_a_shorter_last_batch_on_one_rank_recompiles_there_alone
    crates/python/tests/test_policy.py::test_rank_zero_evaluating_with_the_compiled_function_runs
    crates/python/tests/test_policy.py::test_a_graph_holding_collectives_makes_every_rank_recompile_together
    crates/python/tests/test_policy.py::test_local_work_stands_aside_and_later_exchanges_fold_the_same_state
    crates/python/tests/test_policy.py::test_an_exchanged_recompile_folds_the_same_state_after_a_local_one
    crates/python/tests/test_policy.py::test_the_recompile_limit_of_an_exchanged_compile_counts_exchanged_compiles
    crates/python/tests/test_policy.py::test_compiled_ddp_with_a_shorter_last_batch_on_one_rank_runs
    crates/python/tests/test_policy.py::test_a_first_compile_on_one_rank_alone_inside_local_runs
    "crates/python/tests/test_policy.py::test_the_peer_of_a_failing_rank_says_why_within_the_deadline[tcpstore]"
    crates/python/tests/test_integrations.py::test_accelerate_runs_as_without_the_package
    crates/python/tests/test_integrations.py::test_lightning_fit_validate_and_test_with_the_callback
    crates/python/tests/test_compile_once.py::test_a_transfer_corrupted_in_flight_is_rejected_and_a_clean_one_loads
    crates/python/tests/test_shard.py::test_every_rank_lowers_and_each_kernel_is_built_once_in_the_job
)
step "pytest on torch 2.13.0 and 2.14.1: the package's smoke set"
for v in 2.13.0 2.14.1; do
    echo "-- torch $v"
    CCOL_SMOKE_SET=1 "$(torch_python "$v")" -m pytest -q -p no:cacheprovider "${smoke[@]}"
done
steps_done
