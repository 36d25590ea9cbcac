# Shared settings of the project's scripts; source it, don't run it.
# shellcheck shell=bash
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

# Install Debian packages that are missing (idempotent). Says in one line
# what it installs; apt's own output goes to $CCOL_CACHE/apt.log, and its
# last lines are printed when apt fails.
apt_install() {
    local missing=() p log="$CCOL_CACHE/apt.log"
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "installing Debian packages: ${missing[*]} (apt's output: $log)" >&2
        if ! { as_root apt-get update &&
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
            echo "apt could not install ${missing[*]}; the last lines of $log:" >&2
            tail -n 30 "$log" >&2
            return 1
        fi
    fi
}

# Builds `ccol` (release, with Gloo) in the shared target directory (what
# `cargo build --release -p compiler-collectives-cli --features gloo` built
# is reused, and the other way round) and installs it as $CCOL_CACHE/bin/ccol;
# prints the line that puts it on PATH when it is not there yet.
install_ccol() {
    cargo install --locked --path crates/cli --features gloo \
        --root "$CCOL_CACHE" --target-dir "$CARGO_TARGET_DIR"
    case ":$PATH:" in
        *":$CCOL_CACHE/bin:"*) echo "ccol: $CCOL_CACHE/bin/ccol (on your PATH)" ;;
        *)
            echo "ccol is installed as $CCOL_CACHE/bin/ccol; to run it as \`ccol\` (the README's commands):"
            echo "  export PATH=\"$CCOL_CACHE/bin:\$PATH\""
            ;;
    esac
}

# Progress of a script's long steps. `step "what"` ends the step before it
# (printing how long it took) and starts the next, numbered against the
# number of lines of the script that start with `step `:
#   == [3/9] cargo clippy …
#   == [3/9] cargo clippy: done in 41 s
# `steps_done` ends the last step and prints the total. A script that exits
# during a step says which step failed, after how long.
CCOL_STEP=0
CCOL_STEPS=""
CCOL_STEP_TITLE=""
CCOL_STEP_START=0
CCOL_STEPS_START=$SECONDS

# "41 s", "3 min 5 s".
ccol_duration() {
    if [ "$1" -lt 60 ]; then echo "$1 s"; else echo "$(($1 / 60)) min $(($1 % 60)) s"; fi
}

ccol_step_end() {
    if [ -n "$CCOL_STEP_TITLE" ]; then
        echo "== [$CCOL_STEP/$CCOL_STEPS] $CCOL_STEP_TITLE: done in $(ccol_duration $((SECONDS - CCOL_STEP_START)))"
        CCOL_STEP_TITLE=""
    fi
}

ccol_steps_exit() {
    local status=$1
    if [ "$status" != 0 ] && [ -n "$CCOL_STEP_TITLE" ]; then
        echo "== [$CCOL_STEP/$CCOL_STEPS] $CCOL_STEP_TITLE: FAILED after $(ccol_duration $((SECONDS - CCOL_STEP_START))) (exit status $status)" >&2
    fi
}

step() {
    if [ -z "$CCOL_STEPS" ]; then
        # The script has `cd`ed to the repository root: count its step lines.
        CCOL_STEPS=$(grep -c '^ *step ' "scripts/$(basename "$0")" 2>/dev/null || true)
        CCOL_STEPS=${CCOL_STEPS:-?}
        trap 'ccol_steps_exit $?' EXIT
    fi
    ccol_step_end
    CCOL_STEP=$((CCOL_STEP + 1))
    CCOL_STEP_TITLE="$1"
    CCOL_STEP_START=$SECONDS
    echo "== [$CCOL_STEP/$CCOL_STEPS] $1 …"
}

steps_done() {
    ccol_step_end
    echo "== all $CCOL_STEP steps done in $(ccol_duration $((SECONDS - CCOL_STEPS_START)))"
}
