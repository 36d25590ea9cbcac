//! Compiles the c10d shim against the libtorch of `scripts/setup-torch.sh`
//! (`LIBTORCH`, a torch install's package directory) with DESIGN §9's flags,
//! and links libtorch normally — the situation in which a process also holds
//! libtorch's copy of Gloo's symbols.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=shim/c10d_gloo.cpp");
    let Some(torch) = std::env::var_os("LIBTORCH").map(PathBuf::from) else {
        eprintln!(
            "error: LIBTORCH is not set: run `eval \"$(scripts/setup-torch.sh)\"` first \
             (it installs torch 2.13.0 outside the checkout and prints LIBTORCH)"
        );
        std::process::exit(1);
    };
    let include = torch.join("include");
    let lib = torch.join("lib");
    if !include
        .join("torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
        .exists()
    {
        eprintln!(
            "error: {} has no c10d headers; is LIBTORCH a torch 2.13.0 package directory?",
            torch.display()
        );
        std::process::exit(1);
    }
    cc::Build::new()
        .cpp(true)
        .file("shim/c10d_gloo.cpp")
        .std("c++20")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("USE_C10D_GLOO", None)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include("/usr/include")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-w")
        .compile("ccol_c10d_gloo_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=stdc++");
}
