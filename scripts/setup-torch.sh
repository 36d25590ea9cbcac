#!/usr/bin/env bash
# Shared torch set-up: installs a pinned torch wheel (full install, so Python
# tests can `import torch`) and numpy into a virtual environment of its own
# outside the checkout ($CCOL_CACHE/torch-<version>, reused by fresh clones),
# verifies the version, and prints the variables that build tch-rs against it
# and find its tools:
#   eval "$(scripts/setup-torch.sh)"          # torch 2.13.0 (libtorch for tch-rs)
#   eval "$(scripts/setup-torch.sh 2.15.0)"   # another of TORCH_VERSIONS
# Idempotent: a second run only verifies. Progress goes to stderr (pip's
# download progress included: the first run of a version fetches about 4.7 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
# The versions the test command installs: the one libtorch (tch-rs, the
# c10d tests) and the PyTorch oracle's default build against, first; then the
# others the package is tested on (docs/python.md, "Support matrix").
TORCH_VERSIONS=(2.13.0 2.14.1 2.15.0)
version=${1:-${TORCH_VERSIONS[0]}}
case " ${TORCH_VERSIONS[*]} " in
    *" $version "*) ;;
    *)
        echo "setup-torch: torch $version is not one of the tested versions (${TORCH_VERSIONS[*]})" >&2
        exit 2
        ;;
esac
venv="$CCOL_CACHE/torch-$version"
check='import torch, numpy, sys; sys.exit(0 if torch.__version__.split("+")[0] == "'$version'" else 1)'
if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    echo "installing torch $version and numpy into $venv (about 4.7 GB on disk: CUDA wheels 2.7 GB," \
        "torch 1.2 GB, triton 0.7 GB; once)" >&2
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar on "torch==$version" numpy >&2
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# tch skips its own version check on the LIBTORCH path: check torch/version.py here.
grep -q "^__version__ = '$version" "$site/torch/version.py" || {
    echo "setup-torch: $site/torch/version.py is not torch $version" >&2
    exit 1
}
cat <<VARS
export CCOL_TORCH_PYTHON="$venv/bin/python"
export CCOL_TORCHRUN="$venv/bin/torchrun"
export LIBTORCH="$site/torch"
export LIBTORCH_CXX11_ABI=1
export LIBTORCH_BYPASS_VERSION_CHECK=1
VARS
