#!/usr/bin/env bash
# The one GPU check of the nccl crate, for a machine with NVIDIA GPUs that may
# have no Rust toolchain and no network. It runs binaries built beforehand by
# scripts/build-gpu-check.sh (on any x86-64 Linux machine with Rust):
#   gpu-check.sh [BIN_DIR]        # default: the directory of this script
# Steps: find the NCCL library (CCOL_NCCL_LIB, else Python's site-packages —
# the nvidia-nccl-cu13 wheel torch installs —, else the ld cache); run the
# CPU-level tests; run the conformance suite at every world size from 1 to
# min(GPUs, 8) (NCCL refuses two ranks on one GPU: one GPU means world size
# 1); measure exchange latency against a raw NCCL all_gather of the same
# bytes at each world size; print one summary table. Exits 1 if a step failed.
# Then, where CCOL_PYTHON (default python3) has torch with CUDA and the
# compiler_collectives package, Inductor's distributed GEMM autotuning on the
# package's channel (crates/python/examples/distributed_autotune_gpu.py,
# shipped next to the binaries by build-gpu-check.sh; one rank per GPU), and
# compile_once on CUDA (examples/compile_once_gpu.py: two ranks on GPU 0,
# each its own Inductor and Triton cache; capped at 45 s; prints whether it
# was active), and shard_kernels on CUDA (examples/shard_kernels_gpu.py, the
# same two ranks: each Triton kernel built by one of them; capped at 45 s).
# Knobs: CCOL_NCCL_LIB, CCOL_PYTHON, CCOL_BENCH_ITERS (default 200),
# CCOL_GPU_CHECK_STEP_S (time limit per step, default 900).
set -uo pipefail
bin="${1:-$(cd "$(dirname "$0")" && pwd)}"
iters="${CCOL_BENCH_ITERS:-200}"
limit="${CCOL_GPU_CHECK_STEP_S:-900}"
for f in nccl-cpu-tests nccl-conformance nccl_bench; do
    [ -x "$bin/$f" ] || { echo "gpu-check: $bin/$f missing: run scripts/build-gpu-check.sh first" >&2; exit 2; }
done

find_nccl() {
    if [ -n "${CCOL_NCCL_LIB:-}" ]; then echo "$CCOL_NCCL_LIB"; return; fi
    local py p
    for py in ${CCOL_PYTHON:-} python3 python; do
        command -v "$py" >/dev/null 2>&1 || continue
        p=$("$py" - 2>/dev/null <<'PY'
import os, site, sys
dirs = []
try: dirs += site.getsitepackages()
except Exception: pass
try: dirs.append(site.getusersitepackages())
except Exception: pass
for d in dirs + sys.path:
    f = os.path.join(d, "nvidia", "nccl", "lib", "libnccl.so.2")
    if os.path.isfile(f):
        print(f)
        break
PY
)
        if [ -n "$p" ]; then echo "$p"; return; fi
    done
    ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}'
}

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
lib=$(find_nccl)
echo "== GPUs: $gpus; NCCL: ${lib:-not found}"
[ -n "$lib" ] && export CCOL_NCCL_LIB="$lib"
# Here the library and the GPUs are meant to be present: a skip is a failure.
export CCOL_STRICT_SKIPS=1
export RUST_BACKTRACE=0
max=$(( gpus < 8 ? gpus : 8 ))
worlds=""
for ((w = 1; w <= max; w++)); do worlds="${worlds:+$worlds,}$w"; done

log=$(mktemp -d)
steps=()
failed=0
record() { # name, status, detail
    steps+=("$(printf '%-34s %-5s %s' "$1" "$2" "$3")")
    # A skip (what it needs is not installed here) is no failure.
    [ "$2" = ok ] || [ "$2" = skip ] || failed=1
}
summary_of() { grep -E '^test result:' "$1" | tail -1 | sed 's/^test result: //'; }

echo "== CPU-level tests (probe, unique id through a store)"
if timeout "$limit" "$bin/nccl-cpu-tests" --test-threads 1 >"$log/cpu" 2>&1; then
    record "cpu tests" ok "$(summary_of "$log/cpu")"
else
    record "cpu tests" FAIL "$(summary_of "$log/cpu") (log below)"
fi
cat "$log/cpu"

if [ "$gpus" -eq 0 ] || [ -z "$lib" ]; then
    record "conformance" FAIL "needs a GPU and NCCL (GPUs: $gpus, NCCL: ${lib:-none})"
else
    echo "== conformance at world sizes $worlds"
    if CCOL_NCCL_WORLDS="$worlds" timeout "$limit" "$bin/nccl-conformance" >"$log/conf" 2>&1; then
        record "conformance (worlds $worlds)" ok "$(summary_of "$log/conf")"
    else
        record "conformance (worlds $worlds)" FAIL "$(summary_of "$log/conf")"
    fi
    cat "$log/conf"
    for ((w = 1; w <= max; w++)); do
        echo "== benchmark, world size $w"
        if timeout "$limit" "$bin/nccl_bench" --world "$w" --iters "$iters" >"$log/bench-$w" 2>&1; then
            record "benchmark world $w" ok "$iters iterations"
        else
            record "benchmark world $w" FAIL "$(tail -1 "$log/bench-$w")"
        fi
        grep -v '^RESULT ' "$log/bench-$w"
    done
fi

py="${CCOL_PYTHON:-python3}"
# package_step NAME SCRIPT RANKS STEP_LIMIT TITLE OK_PATTERN: runs SCRIPT (a
# torch example of the package) under torchrun with RANKS ranks, where $py
# has CUDA torch and the package; OK_PATTERN counts the ranks that passed.
package_step() {
    local name=$1 script=$2 ranks=$3 cap=$4 title=$5 pattern=$6
    if [ ! -f "$script" ]; then
        record "$name" skip "$script missing"
    elif ! "$py" -c "import torch, compiler_collectives.torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
        record "$name" skip "$py has no CUDA torch with compiler_collectives"
    else
        echo "== $title"
        if timeout "$cap" "$py" -m torch.distributed.run --standalone --nproc-per-node "$ranks" \
            "$script" >"$log/$name" 2>&1; then
            record "$name" ok "$(grep -c "$pattern" "$log/$name") rank(s) $pattern"
        else
            record "$name" FAIL "(log below)"
        fi
        cat "$log/$name"
    fi
}

package_step "distributed autotune (package)" "$bin/distributed_autotune_gpu.py" "$max" "$limit" \
    "Inductor distributed autotuning on the package's channel, $max rank(s)" '"ok": true'
# Two ranks on GPU 0, each its own Inductor and Triton cache: one compiles,
# the other receives the entry (Triton bundled into it) and loads.
package_step "compile once (package)" "$bin/compile_once_gpu.py" 2 45 \
    "compile_once on CUDA: 2 ranks on one GPU (capped at 45 s)" '"active": true'
# Two ranks on GPU 0, each its own Inductor and Triton cache, shard_kernels:
# each Triton kernel built by one rank, its cache entries sent to the other
# and loaded as Triton cache hits; losses equal to the bit. Both ranks are
# cuda:0: it cannot show ranks of different device indices naming a kernel
# alike (tests/test_shard.py does, on CPU).
package_step "shard kernels (package)" "$bin/shard_kernels_gpu.py" 2 45 \
    "shard_kernels on CUDA: 2 ranks on one GPU (capped at 45 s)" '"active": true'

echo
echo "================ gpu-check summary ================"
echo "GPUs: $gpus   NCCL: ${lib:-not found}"
printf '%s\n' "${steps[@]}"
if ls "$log"/bench-* >/dev/null 2>&1; then
    echo
    printf '%5s %-18s %8s %10s %10s %12s %8s\n' world op bytes "p50 us" "p90 us" "raw p50 us" "x raw"
    cat "$log"/bench-* | awk '$1 == "RESULT" {
        ratio = ($7 > 0) ? $5 / $7 : 0
        printf "%5s %-18s %8s %10s %10s %12s %8.2f\n", $2, $3, $4, $5, $6, $7, ratio }'
fi
rm -rf "$log"
exit "$failed"
