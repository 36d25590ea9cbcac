#!/usr/bin/env bash
# The compiler_collectives Python package (crates/python): builds its wheel
# (maturin, release, abi3) in the shared target directory and installs it into
# the torch 2.13 environment of scripts/setup-torch.sh, with maturin and pytest
# (pinned). Prints the same variables as setup-torch.sh:
#   eval "$(scripts/setup-python.sh)"
# then `"$CCOL_TORCH_PYTHON" -c "import compiler_collectives.torch"` works.
# Idempotent: a second run rebuilds only what changed and reinstalls the wheel.
# Needs Debian's libgloo-dev (the Gloo transport): scripts/test.sh installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
vars=$(scripts/setup-torch.sh)
eval "$vars"
py=$CCOL_TORCH_PYTHON
bin=$(dirname "$py")
maturin_version=1.16
pytest_version=9
if ! "$bin/maturin" --version 2>/dev/null | grep -q "^maturin $maturin_version\." ||
    ! "$py" -c "import pytest, sys; sys.exit(0 if pytest.__version__.startswith('$pytest_version.') else 1)" 2>/dev/null; then
    echo "installing maturin $maturin_version and pytest $pytest_version into $(dirname "$bin")" >&2
    "$py" -m pip install --disable-pip-version-check -q "maturin==$maturin_version.*" "pytest==$pytest_version.*" >&2
fi
wheels="$CCOL_CACHE/wheels"
mkdir -p "$wheels"
rm -f "$wheels"/compiler_collectives-*.whl
echo "building the compiler_collectives wheel (maturin, release) into $wheels" >&2
PYO3_PYTHON="$py" "$bin/maturin" build --quiet --release --manifest-path crates/python/Cargo.toml \
    --interpreter "$py" --out "$wheels" >&2
wheel=$(ls "$wheels"/compiler_collectives-*.whl)
"$py" -m pip install --disable-pip-version-check -q --force-reinstall --no-deps "$wheel" >&2
"$py" -c "import compiler_collectives.torch" >&2 || {
    echo "setup-python: $wheel is installed but 'import compiler_collectives.torch' fails" >&2
    exit 1
}
echo "$vars"
