//! Compiles the c10d shim (`shim/ccol_c10d.cpp`) against the libtorch that
//! tch builds with (`LIBTORCH`, from `scripts/setup-torch.sh`), with the flags
//! of DESIGN §9, and links it with an rpath to libtorch's libraries.
//!
//! It also generates `$OUT_DIR/status.rs` from the shim's header
//! (`shim/ccol_c10d.h`): one `Status` variant per `#define CCOL_C10D_<NAME>
//! <number>` line, so the Rust side has the shim's status codes from their
//! one source and its exhaustive `match` fails to compile when one is added.

use std::path::{Path, PathBuf};

const HEADER: &str = "shim/ccol_c10d.h";
const PREFIX: &str = "CCOL_C10D_";

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-changed=shim/ccol_c10d.cpp");
    println!("cargo:rerun-if-changed={HEADER}");
    if let Err(e) = write_status() {
        eprintln!("error: {HEADER}: {e}");
        std::process::exit(1);
    }
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
        .include("shim")
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

/// The `(NAME, code)` of every `#define CCOL_C10D_<NAME> <number>` line.
/// A prefixed define without a value (the include guard) is skipped; one
/// whose value is not a number, a repeated name or code, a negative code, or
/// no `OK = 0` is an error.
fn parse_status(header: &str) -> Result<Vec<(String, i32)>, String> {
    let mut codes: Vec<(String, i32)> = Vec::new();
    for (n, line) in (1..).zip(header.lines()) {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let Some(name) = words.next().and_then(|w| w.strip_prefix(PREFIX)) else {
            continue;
        };
        let Some(value) = words.next() else {
            continue;
        };
        let code: i32 = value
            .parse()
            .map_err(|_| format!("line {n}: {PREFIX}{name} is `{value}`, not a status number"))?;
        if let Some(rest) = words
            .next()
            .filter(|w| !w.starts_with("/*") && !w.starts_with("//"))
        {
            return Err(format!(
                "line {n}: unexpected `{rest}` after {PREFIX}{name}"
            ));
        }
        if code < 0 {
            return Err(format!("line {n}: {PREFIX}{name} is negative"));
        }
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(format!(
                "line {n}: `{PREFIX}{name}` is not an upper-case name"
            ));
        }
        if let Some((other, _)) = codes.iter().find(|(o, c)| o == name || *c == code) {
            return Err(format!(
                "line {n}: {PREFIX}{name} repeats {PREFIX}{other}'s name or code"
            ));
        }
        codes.push((name.to_owned(), code));
    }
    if !codes.iter().any(|(name, code)| name == "OK" && *code == 0) {
        return Err(format!("no `#define {PREFIX}OK 0`"));
    }
    Ok(codes)
}

/// `TIMEOUT` → `Timeout`, `SOME_CODE` → `SomeCode`.
fn camel(name: &str) -> String {
    name.split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let lower = w.to_ascii_lowercase();
            let mut chars = lower.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn status_rs(codes: &[(String, i32)]) -> String {
    let mut out = String::from(
        "// Generated by build.rs from shim/ccol_c10d.h: do not edit.\n\n\
         /// A status code of the c10d shim (`CCOL_C10D_*` in `shim/ccol_c10d.h`).\n\
         #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]\n\
         #[repr(i32)]\n\
         pub(crate) enum Status {\n",
    );
    for (name, code) in codes {
        out += &format!("    /// `{PREFIX}{name}`.\n    {} = {code},\n", camel(name));
    }
    out += "}\n\nimpl Status {\n";
    out += &format!(
        "    /// Every status, in the header's order.\n    #[allow(dead_code)]\n    pub(crate) const ALL: [Status; {}] = [{}];\n\n",
        codes.len(),
        codes
            .iter()
            .map(|(n, _)| format!("Status::{}", camel(n)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out += "    /// The status with this code; `None` for a code the header does not define.\n    \
             pub(crate) fn from_code(code: i32) -> Option<Status> {\n        match code {\n";
    for (name, code) in codes {
        out += &format!("            {code} => Some(Status::{}),\n", camel(name));
    }
    out += "            _ => None,\n        }\n    }\n\n";
    out += "    /// The header's name of this status.\n    #[allow(dead_code)]\n    pub(crate) fn name(self) -> &'static str {\n        match self {\n";
    for (name, _) in codes {
        out += &format!(
            "            Status::{} => \"{PREFIX}{name}\",\n",
            camel(name)
        );
    }
    out += "        }\n    }\n}\n";
    out
}

fn write_status() -> Result<(), String> {
    let header = std::fs::read_to_string(HEADER).map_err(|e| format!("cannot read: {e}"))?;
    let codes = parse_status(&header)?;
    let out = std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?;
    let path = Path::new(&out).join("status.rs");
    std::fs::write(&path, status_rs(&codes))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
