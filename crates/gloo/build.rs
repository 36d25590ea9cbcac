//! Compiles the C++ adapter (`adapter/ccol_gloo.cpp`) into a shared object
//! that links Debian's libgloo. The crate embeds the object (feature
//! `embedded-adapter`) and loads it at run time with `RTLD_DEEPBIND`, so the
//! Rust binary itself never links libgloo (see docs/environment.md: libgloo
//! and libtorch collide in one process).
//!
//! Outputs: `CCOL_GLOO_ADAPTER_SO` (the object's path, for `include_bytes!`)
//! and, through the `links = "ccol_gloo"` key, `DEP_CCOL_GLOO_ADAPTER` (the
//! same path) for the build scripts of dependent crates: the Python package
//! ships the object as a file of its wheel.
//!
//! Honoured variables: `GLOO_ROOT` (a prefix with `include/gloo` and `lib`),
//! `GLOO_INCLUDE_DIR`, `GLOO_LIB_DIR`, `HIREDIS_INCLUDE_DIR`, and the `cc`
//! crate's `CXX`/`CXXFLAGS`.

use std::path::{Path, PathBuf};
use std::process::Command;

const INSTALL_HINT: &str =
    "install Debian's Gloo: `sudo apt-get install -y --no-install-recommends libgloo-dev` \
     (or set GLOO_ROOT to a prefix holding include/gloo and lib/libgloo.so)";

fn env_path(name: &str) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed={name}");
    std::env::var_os(name).map(PathBuf::from)
}

fn first_existing(candidates: &[PathBuf], probe: &str) -> Option<PathBuf> {
    candidates.iter().find(|d| d.join(probe).exists()).cloned()
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: compiler-collectives-gloo: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    println!("cargo:rerun-if-changed=adapter/ccol_gloo.cpp");
    println!("cargo:rerun-if-changed=adapter/ccol_gloo.h");
    let root = env_path("GLOO_ROOT");
    let include = env_path("GLOO_INCLUDE_DIR")
        .or_else(|| root.as_ref().map(|r| r.join("include")))
        .or_else(|| {
            first_existing(
                &[
                    PathBuf::from("/usr/include"),
                    PathBuf::from("/usr/local/include"),
                ],
                "gloo/config.h",
            )
        })
        .filter(|d| d.join("gloo/config.h").exists())
        .ok_or_else(|| format!("Gloo headers (gloo/config.h) not found; {INSTALL_HINT}"))?;
    let lib_candidates: Vec<PathBuf> = env_path("GLOO_LIB_DIR")
        .into_iter()
        .chain(root.as_ref().map(|r| r.join("lib")))
        .chain(
            [
                "/usr/lib",
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu",
                "/usr/local/lib",
            ]
            .iter()
            .map(PathBuf::from),
        )
        .collect();
    let lib = first_existing(&lib_candidates, "libgloo.so")
        .ok_or_else(|| format!("libgloo.so not found in {lib_candidates:?}; {INSTALL_HINT}"))?;
    let hiredis =
        env_path("HIREDIS_INCLUDE_DIR").unwrap_or_else(|| PathBuf::from("/usr/include/hiredis"));

    let out_dir = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let entry_include = compiler_collectives_ffi::write_include_dir(&out_dir).map_err(|e| {
        format!(
            "cannot write ccol_entry.hpp into {}: {e}",
            out_dir.display()
        )
    })?;
    let object = out_dir.join("libccol_gloo_adapter.so");
    let compiler = cc::Build::new()
        .cpp(true)
        .cargo_metadata(false)
        .get_compiler();
    let mut cmd = Command::new(compiler.path());
    cmd.args(compiler.args())
        .args([
            "-std=c++17",
            "-O2",
            "-fPIC",
            "-shared",
            "-fvisibility=default",
        ])
        .arg("-I")
        .arg(Path::new("adapter"))
        .arg("-I")
        .arg(&entry_include)
        .arg("-I")
        .arg(&include)
        .arg("-I")
        .arg(&hiredis)
        .arg("adapter/ccol_gloo.cpp")
        .arg("-o")
        .arg(&object)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-Wl,-z,defs", "-lgloo", "-lpthread"]);
    let status = cmd.status().map_err(|e| {
        format!(
            "cannot run the C++ compiler {:?} ({e}); install one: `sudo apt-get install -y \
                 --no-install-recommends g++` (or set CXX)",
            compiler.path()
        )
    })?;
    if !status.success() {
        return Err(format!(
            "compiling the Gloo adapter failed ({status}): {cmd:?}; {INSTALL_HINT}"
        ));
    }
    println!("cargo:rustc-env=CCOL_GLOO_ADAPTER_SO={}", object.display());
    println!("cargo:adapter={}", object.display());
    Ok(())
}
