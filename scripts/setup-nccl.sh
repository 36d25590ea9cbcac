#!/usr/bin/env bash
# The NCCL library the nccl crate's tests load: NCCL 2.29.7 from the pip wheel
# nvidia-nccl-cu13 (the one torch 2.13 uses). Reuses the torch set-up's copy
# when present, else installs the wheel into a virtual environment in the
# cache (outside the checkout, reused by fresh clones). Prints the variable
# that names it:
#   eval "$(scripts/setup-nccl.sh)"
# Idempotent; progress goes to stderr (pip's download progress included).
# Needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
version=2.29.7
venv="$CCOL_CACHE/nccl-$version"
lib=""
for site in "$CCOL_CACHE"/torch-2.13.0/lib/python3*/site-packages "$venv"/lib/python3*/site-packages; do
    if [ -d "$site/nvidia_nccl_cu13-$version.dist-info" ] && [ -f "$site/nvidia/nccl/lib/libnccl.so.2" ]; then
        lib="$site/nvidia/nccl/lib/libnccl.so.2"
        break
    fi
done
if [ -z "$lib" ]; then
    echo "installing nvidia-nccl-cu13==$version into $venv (about 250 MB, once)" >&2
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar on "nvidia-nccl-cu13==$version" >&2
    lib=$(ls "$venv"/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2)
fi
echo "export CCOL_NCCL_LIB=\"$lib\""
