"""The build backend of ``pip install ./crates/python`` (pyproject.toml's
``backend-path``): maturin's, after a check of what a build from source needs.

A build from source needs Rust (cargo), a C++ compiler and Debian's Gloo
(``libgloo-dev``: crates/gloo/build.rs compiles the adapter against it). When
one is missing, the first line of the build's output names what to install,
rather than cargo's or the compiler's output a page later. The search for
Gloo is crates/gloo/build.rs's: ``GLOO_INCLUDE_DIR``, ``GLOO_LIB_DIR``,
``GLOO_ROOT``, then the system's directories.

An sdist needs none of it: its hooks are maturin's, unchanged.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

import maturin
from maturin import build_sdist, get_requires_for_build_sdist  # noqa: F401 (hooks)

# The workspace's rust-version (Cargo.toml).
_RUST_VERSION = (1, 85)

_GLOO_HINT = (
    "Debian's Gloo (`sudo apt-get install -y --no-install-recommends libgloo-dev`, "
    "or set GLOO_ROOT to a prefix holding include/gloo and lib/libgloo.so)"
)


def _gloo_found() -> bool:
    """crates/gloo/build.rs's search: headers and libgloo.so."""
    root = os.environ.get("GLOO_ROOT")
    include = os.environ.get("GLOO_INCLUDE_DIR") or (root and os.path.join(root, "include"))
    includes = [include] if include else ["/usr/include", "/usr/local/include"]
    if not any(os.path.exists(os.path.join(d, "gloo/config.h")) for d in includes):
        return False
    libs = [d for d in (os.environ.get("GLOO_LIB_DIR"), root and os.path.join(root, "lib")) if d]
    libs += ["/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/lib"]
    return any(os.path.exists(os.path.join(d, "libgloo.so")) for d in libs)


def _cxx_found() -> bool:
    """The compiler the `cc` crate runs: $CXX's first word, else `c++`."""
    words = shlex.split(os.environ.get("CXX", "")) or ["c++"]
    return shutil.which(words[0]) is not None


def _rust_problem() -> "str | None":
    cargo = shutil.which("cargo")
    if cargo is None:
        return "Rust (cargo on PATH: https://rustup.rs)"
    try:
        out = subprocess.run([cargo, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return f"Rust ({cargo} --version fails: reinstall it from https://rustup.rs)"
    m = re.search(r"(\d+)\.(\d+)", out)
    if m and (int(m.group(1)), int(m.group(2))) < _RUST_VERSION:
        want = ".".join(map(str, _RUST_VERSION))
        return f"Rust {want} or newer (this is {out.strip()}: `rustup update`)"
    return None


def _check() -> None:
    """Exits with a message whose first line names what is missing."""
    if not sys.platform.startswith("linux"):
        missing = ["Linux: compiler-collectives builds and runs on Linux only"]
    else:
        missing = []
        rust = _rust_problem()
        if rust:
            missing.append(rust)
        if not _cxx_found():
            missing.append(
                "a C++ compiler (`sudo apt-get install -y --no-install-recommends g++`, or set CXX)"
            )
        if not _gloo_found():
            missing.append(_GLOO_HINT)
    if missing:
        sys.stderr.write(
            "compiler-collectives: building from source needs " + "; ".join(missing) + "\n"
            "(a wheel from `scripts/build-wheel.sh` installs with none of these)\n"
        )
        sys.stderr.flush()
        raise SystemExit(1)


def get_requires_for_build_wheel(config_settings=None):
    _check()
    return maturin.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings=None):
    _check()
    return maturin.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _check()
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _check()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _check()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)
