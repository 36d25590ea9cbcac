#!/usr/bin/env bash
# The compiler_collectives Python package (crates/python) in a torch
# environment of scripts/setup-torch.sh:
#   eval "$(scripts/setup-python.sh [TORCH_VERSION])"     # default 2.13.0
# then `"$CCOL_TORCH_PYTHON" -c "import compiler_collectives.torch"` works.
# Installs the one wheel scripts/build-wheel.sh builds (once, into
# $CCOL_CACHE/wheels: every torch version gets the same file) with
# `pip install --force-reinstall --no-deps`, then runs `pip check`; adds
# pytest (pinned) to the environment. Prints setup-torch.sh's variables and
# CCOL_WHEEL, the wheel's path. Idempotent.
# Building the wheel needs Debian's libgloo-dev (scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
version=${1:-2.13.0}
vars=$(scripts/setup-torch.sh "$version")
eval "$vars"
py=$CCOL_TORCH_PYTHON
pytest_version=9
if ! "$py" -c "import pytest, sys; sys.exit(0 if pytest.__version__.startswith('$pytest_version.') else 1)" 2>/dev/null; then
    echo "installing pytest $pytest_version into $(dirname "$(dirname "$py")")" >&2
    "$py" -m pip install --disable-pip-version-check -q "pytest==$pytest_version.*" >&2
fi
wheel=$(scripts/build-wheel.sh)
echo "installing $(basename "$wheel") into $(dirname "$(dirname "$py")")" >&2
"$py" -m pip install --disable-pip-version-check -q --force-reinstall --no-deps "$wheel" >&2
"$py" -m pip check >&2 || {
    echo "setup-python: pip check fails in $(dirname "$(dirname "$py")") after installing $wheel" >&2
    exit 1
}
"$py" -c "import compiler_collectives.torch" >&2 || {
    echo "setup-python: $wheel is installed but 'import compiler_collectives.torch' fails" >&2
    exit 1
}
echo "$vars"
echo "export CCOL_WHEEL=\"$wheel\""
