//! Puts the Gloo adapter the `compiler-collectives-gloo` build compiled
//! (`DEP_CCOL_GLOO_ADAPTER`, through that crate's `links` key) into the
//! package's source directory, `python/compiler_collectives/`, under the name
//! it has in the wheel ([`ADAPTER_FILE`], gitignored). maturin packs it
//! with the Python sources; `auditwheel repair` then grafts the Gloo
//! libraries it links into the wheel and points it at them. The package's
//! `__init__.py` has `_native` load it from there (`_use_gloo_adapter`),
//! never from a cache directory.

use std::path::{Path, PathBuf};

/// The adapter's file name in the package; `_native` gets it as
/// `CCOL_WHEEL_ADAPTER`.
const ADAPTER_FILE: &str = "libccol_gloo_adapter.so";

fn main() {
    if let Err(e) = run() {
        eprintln!("error: compiler-collectives-python: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    println!("cargo:rustc-env=CCOL_WHEEL_ADAPTER={ADAPTER_FILE}");
    let built = PathBuf::from(std::env::var_os("DEP_CCOL_GLOO_ADAPTER").ok_or(
        "DEP_CCOL_GLOO_ADAPTER is not set: compiler-collectives-gloo's build script gives it",
    )?);
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR is not set")?;
    let dest = Path::new(&manifest)
        .join("python/compiler_collectives")
        .join(ADAPTER_FILE);
    // Run again when the adapter is rebuilt, or when another build (another
    // profile, another feature set) replaced the copy in the package.
    println!("cargo:rerun-if-changed={}", built.display());
    println!("cargo:rerun-if-changed={}", dest.display());
    println!("cargo:rerun-if-changed=build.rs");
    copy_if_changed(&built, &dest)
        .map_err(|e| format!("cannot copy {} to {}: {e}", built.display(), dest.display()))
}

/// Copies `from` to `to` unless `to` already holds the same bytes; writes a
/// temporary file and renames it, so a Python process loading `to` never
/// sees half a file.
fn copy_if_changed(from: &Path, to: &Path) -> std::io::Result<()> {
    let bytes = std::fs::read(from)?;
    if std::fs::read(to).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let tmp = to.with_extension(format!("so.{}.tmp", std::process::id()));
    std::fs::write(&tmp, &bytes)?;
    std::fs::rename(&tmp, to)
}
