# Shared settings of the project's scripts; source it, don't run it.
# Build outputs and downloaded toolchains live outside the checkout so that a
# fresh clone reuses them. Cargo decides freshness by file times: a clone has
# new times and rebuilds the project's crates; but an older working tree built
# after a newer clone can see the clone's outputs as fresh. If that happens,
# `touch` the sources (or give each tree its own CARGO_TARGET_DIR).
CCOL_CACHE="${CCOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/compiler-collectives}"
export CCOL_CACHE
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CCOL_CACHE/target}"
mkdir -p "$CCOL_CACHE"

# Run a command as root, or through sudo when not root.
as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Install Debian packages that are missing (idempotent).
apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "installing Debian packages: ${missing[*]}"
        as_root apt-get update -qq
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
}
