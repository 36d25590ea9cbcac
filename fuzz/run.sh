#!/usr/bin/env bash
# Fuzzes every target for SECONDS each (default 120) in one process (one
# core), then minimizes its corpus into fuzz/corpus/<target>. Prints
# libFuzzer's final execution count per target. Needs the nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`). Not part of scripts/test.sh: the committed
# corpus is replayed by the stable tests (tests/fuzz-checks).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-120}
targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^compiler-collectives')
cargo +nightly fuzz build -s none -a
total=0
for t in $targets; do
    mkdir -p corpus-full/"$t" corpus/"$t" artifacts/"$t"
    cp -n corpus/"$t"/* corpus-full/"$t"/ 2>/dev/null || true
    log=$(mktemp)
    cargo +nightly fuzz run -s none -a "$t" corpus-full/"$t" -- \
        -max_total_time="$secs" -max_len=65536 -print_final_stats=1 \
        -artifact_prefix=artifacts/"$t"/ >"$log" 2>&1 || { tail -40 "$log"; exit 1; }
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "$t: $n executions in ${secs} s"
    total=$((total + n))
    cargo +nightly fuzz cmin -s none -a "$t" corpus-full/"$t" >/dev/null 2>&1
    rm -rf corpus/"$t" && cp -r corpus-full/"$t" corpus/"$t"
    rm -f "$log"
done
echo "total: $total executions"
