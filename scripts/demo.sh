#!/usr/bin/env bash
# README command 1: the main job. Installs Debian's Gloo when it is missing,
# builds `ccol` with the Gloo transport, and runs `ccol demo`: 4 rank
# processes over Gloo read their shards of a real text corpus
# (/usr/share/common-licenses by default), batch it like a
# DistributedSampler loader, and drive the reference compile cache; with
# compiler collectives every rank takes the same decisions. Extra arguments
# go to `ccol demo` (e.g. --no-collectives, --nproc 2, --corpus DIR, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
apt_install libgloo-dev
cargo build --release --quiet -p compiler-collectives-cli --features gloo
exec "$CARGO_TARGET_DIR/release/ccol" demo "$@"
