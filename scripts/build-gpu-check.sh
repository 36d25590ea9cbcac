#!/usr/bin/env bash
# Builds, on an x86-64 Linux machine with the Rust toolchain, everything
# scripts/gpu-check.sh runs on a GPU machine that may have neither Rust nor
# network: the nccl crate's test binaries and its benchmark, in release mode,
# copied with fixed names into one directory (default: target dir/gpu-check)
# together with gpu-check.sh itself:
#   scripts/build-gpu-check.sh [OUT_DIR]
#   scp -r OUT_DIR gpu-host: && ssh gpu-host OUT_DIR/gpu-check.sh
# The binaries need only glibc at run time (NCCL and the CUDA driver are
# loaded at run time): build on a distribution no newer than the GPU
# machine's, or the loader will refuse them (GLIBC_2.xx not found).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
out="${1:-$CARGO_TARGET_DIR/gpu-check}"
mkdir -p "$out"
pkg=compiler-collectives-nccl
# Small binaries (about 5 MB each instead of 20): no debug info, stripped.
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
echo "building $pkg tests and benchmark (release)" >&2
cargo build --release --quiet -p "$pkg" --example nccl_bench
cp "$CARGO_TARGET_DIR/release/examples/nccl_bench" "$out/nccl_bench"
# The test executables' paths carry a hash: ask cargo for them.
cargo test --release --quiet -p "$pkg" --no-run --message-format=json-render-diagnostics \
    | python3 -c '
import json, shutil, sys
out = sys.argv[1]
names = {"cpu": "nccl-cpu-tests", "conformance": "nccl-conformance"}
done = set()
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        continue
    name = msg["target"]["name"]
    if name in names and "test" in msg["target"]["kind"]:
        shutil.copy(msg["executable"], f"{out}/{names[name]}")
        done.add(name)
missing = set(names) - done
if missing:
    sys.exit(f"cargo did not report test executables {sorted(missing)}")
' "$out"
cp scripts/gpu-check.sh "$out/gpu-check.sh"
cp crates/python/examples/distributed_autotune_gpu.py "$out/distributed_autotune_gpu.py"
cp crates/python/examples/compile_once_gpu.py "$out/compile_once_gpu.py"
cp crates/python/examples/shard_kernels_gpu.py "$out/shard_kernels_gpu.py"
chmod +x "$out"/*
echo "$out:" >&2
ls -l "$out" >&2
echo "$out"
