#!/usr/bin/env bash
# README command 1: the main job. Installs Debian's Gloo when it is missing,
# builds `ccol` with the Gloo transport and installs it as
# $CCOL_CACHE/bin/ccol (default ~/.cache/compiler-collectives/bin/ccol; it
# prints the line that puts it on PATH), and runs `ccol demo`: 4 rank
# processes over Gloo read their shards of a real text corpus
# (/usr/share/common-licenses by default), batch it like a
# DistributedSampler loader, and drive the reference compile cache; with
# compiler collectives every rank takes the same decisions. Extra arguments
# go to `ccol demo` (e.g. --no-collectives, --nproc 2, --corpus DIR, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
step "Debian packages"
apt_install libgloo-dev
# The first build takes a few minutes (cargo shows its progress); later runs
# reuse it.
step "build and install ccol"
install_ccol
steps_done
echo
exec "$CCOL_CACHE/bin/ccol" demo "$@"
