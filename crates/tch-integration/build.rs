//! Compiles the c10d shim (`shim/ccol_c10d.cpp`) against the libtorch that
//! tch builds with (`LIBTORCH`, from `scripts/setup-torch.sh`), with the flags
//! of DESIGN §9, and links it with an rpath to libtorch's libraries.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-changed=shim/ccol_c10d.cpp");
    let Some(torch) = std::env::var_os("LIBTORCH").map(PathBuf::from) else {
        eprintln!(
            "error: LIBTORCH is not set: run `eval \"$(scripts/setup-torch.sh)\"` first \
             (it installs torch 2.13.0 outside the checkout and prints LIBTORCH)"
        );
        std::process::exit(1);
    };
    let include = torch.join("include");
    if !include
        .join("torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
        .exists()
    {
        eprintln!(
            "error: {} has no c10d headers; LIBTORCH must be the `torch` package directory of torch 2.13.0",
            torch.display()
        );
        std::process::exit(1);
    }
    let lib = std::env::var_os("DEP_TCH_LIBTORCH_LIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| torch.join("lib"));
    cc::Build::new()
        .cpp(true)
        .file("shim/ccol_c10d.cpp")
        .std("c++20")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("USE_C10D_GLOO", None)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include("/usr/include")
        .flag_if_supported("-w")
        .compile("ccol_c10d_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=stdc++");
}
