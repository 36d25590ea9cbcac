#!/usr/bin/env bash
# The training stacks the package is tested under: accelerate and Lightning,
# pinned, installed into a torch environment of setup-torch.sh
# ($CCOL_CACHE/torch-<version>) with a constraint that keeps its torch and
# numpy as they are, then `pip check` (scripts/setup-python.sh runs it again
# after installing the package's wheel there):
#   scripts/setup-integrations.sh 2.15.0
# Idempotent: a second run only verifies the two versions.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ACCELERATE=1.16.0
LIGHTNING=2.6.6
version=${1:-2.15.0}
scripts/setup-torch.sh "$version" >/dev/null
py="$CCOL_CACHE/torch-$version/bin/python"
check="import accelerate, lightning, sys; sys.exit(0 if (accelerate.__version__, lightning.__version__) == ('$ACCELERATE', '$LIGHTNING') else 1)"
if ! "$py" -c "$check" 2>/dev/null; then
    echo "installing accelerate $ACCELERATE and lightning $LIGHTNING into $CCOL_CACHE/torch-$version" >&2
    constraints=$(mktemp)
    trap 'rm -f "$constraints"' EXIT
    "$py" -m pip freeze --disable-pip-version-check | grep -Ei '^(torch|numpy)==' >"$constraints"
    "$py" -m pip install --disable-pip-version-check -q -c "$constraints" \
        "accelerate==$ACCELERATE" "lightning==$LIGHTNING" >&2
    "$py" -m pip check --disable-pip-version-check >&2
fi
