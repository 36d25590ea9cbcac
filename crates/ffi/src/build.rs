//! For build scripts that compile a shim against libtorch's c10d (the
//! `build` feature): where torch 2.13 is, and the compiler and linker
//! settings measured for it (docs/environment.md).

use std::path::{Path, PathBuf};

/// A torch 2.13 install: its package directory's `include` and `lib`.
#[derive(Clone, Debug)]
pub struct Libtorch {
    /// `<LIBTORCH>/include` (holds `torch/csrc/distributed/c10d`).
    pub include: PathBuf,
    /// Where `libtorch_cpu.so` and `libc10.so` are: `<LIBTORCH>/lib`.
    pub lib: PathBuf,
}

/// The torch install named by `LIBTORCH` (what `scripts/setup-torch.sh`
/// prints), after checking it has c10d's headers. Prints the
/// `rerun-if-env-changed` line for it.
///
/// # Errors
/// A sentence for the build's output: `LIBTORCH` unset, or a directory
/// without c10d's headers.
pub fn libtorch() -> Result<Libtorch, String> {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let torch = std::env::var_os("LIBTORCH").map(PathBuf::from).ok_or(
        "LIBTORCH is not set: run `eval \"$(scripts/setup-torch.sh)\"` first \
         (it installs torch 2.13.0 outside the checkout and prints LIBTORCH)",
    )?;
    let include = torch.join("include");
    if !include
        .join("torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
        .exists()
    {
        return Err(format!(
            "{} has no c10d headers; LIBTORCH must be the `torch` package directory of torch 2.13.0",
            torch.display()
        ));
    }
    Ok(Libtorch {
        include,
        lib: torch.join("lib"),
    })
}

/// A C++20 `cc::Build` of `file` against `torch`'s c10d with the flags
/// docs/environment.md gives (`_GLIBCXX_USE_CXX11_ABI=1`, `USE_C10D_GLOO`), libtorch's
/// two include directories, the system's, and [`crate::write_include_dir`]'s
/// copy of `ccol_entry.hpp` in `OUT_DIR`;
/// warnings off (libtorch's headers are noisy). Prints its
/// `rerun-if-changed` line.
pub fn c10d_shim(torch: &Libtorch, file: &str) -> cc::Build {
    println!("cargo:rerun-if-changed={file}");
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let entry_include = match crate::write_include_dir(&out_dir) {
        Ok(dir) => dir,
        Err(e) => panic!(
            "cannot write ccol_entry.hpp into OUT_DIR ({}): {e}",
            out_dir.display()
        ),
    };
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file(file)
        .std("c++20")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("USE_C10D_GLOO", None)
        .include(&entry_include)
        .include(&torch.include)
        .include(torch.include.join("torch/csrc/api/include"))
        .include("/usr/include")
        .flag_if_supported("-w");
    build
}

/// Links libtorch's `torch_cpu` and `c10` (and the C++ runtime) from `lib`,
/// with an rpath to it, so programs find it at run time.
pub fn link_libtorch(lib: &Path) {
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=stdc++");
}
