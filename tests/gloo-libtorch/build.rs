//! Compiles the c10d shim against the libtorch of `scripts/setup-torch.sh`
//! (`LIBTORCH`, a torch install's package directory) with the flags of docs/environment.md,
//! and links libtorch normally — the situation in which a process also holds
//! libtorch's copy of Gloo's symbols.

fn main() {
    let torch = match compiler_collectives_ffi::build::libtorch() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    compiler_collectives_ffi::build::c10d_shim(&torch, "shim/c10d_gloo.cpp")
        .flag_if_supported("-Wno-unused-parameter")
        .compile("ccol_c10d_gloo_shim");
    compiler_collectives_ffi::build::link_libtorch(&torch.lib);
}
