//! What the backends' C++ shims share, written once (the Gloo adapter and
//! the libtorch c10d shim each call into C++ and back):
//!
//! - [`sys::append_to_vec`], the callback through which a shim hands bytes
//!   to Rust, and its type [`sys::AppendFn`];
//! - `include/ccol_entry.hpp` ([`ENTRY_HEADER`], [`write_include_dir`]): the templates that guard a
//!   C entry point (clear the error, run the body, turn any exception into
//!   the shim's status and text, never unwind into Rust);
//! - with the `build` feature, for build scripts: [`build::libtorch`] (where
//!   torch 2.13's headers and libraries are) and [`build::c10d_shim`] (a
//!   `cc::Build` with the flags of docs/environment.md).
//!
//! Unsafe code lives only in [`sys`], as in every backend crate.

#![deny(unsafe_code)]

#[cfg(feature = "build")]
pub mod build;
pub mod sys;

/// The text of a shim's fixed-size error message buffer: the bytes up to
/// the first NUL (all of them when the shim wrote none), invalid UTF-8
/// replaced.
pub fn message_text(buf: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The text of `include/ccol_entry.hpp`, embedded (a change to the file
/// rebuilds this crate, and so reruns the build scripts that use it).
pub const ENTRY_HEADER: &str = include_str!("../include/ccol_entry.hpp");

/// Writes `ccol_entry.hpp` into `out_dir/ccol-ffi-include` (a build
/// script's `OUT_DIR`) and returns that directory, to pass to the C++
/// compiler as an include directory.
///
/// A build script's own copy, not a path into this crate's source: a
/// build output shared by several checkouts (one `CARGO_TARGET_DIR`) would
/// otherwise keep the path of the checkout that built this crate first.
///
/// # Errors
/// The I/O error of creating the directory or writing the file.
pub fn write_include_dir(out_dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    let dir = out_dir.join("ccol-ffi-include");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("ccol_entry.hpp");
    // Rewritten only when it changed, so the C++ compiler's inputs keep
    // their times.
    if std::fs::read_to_string(&file).ok().as_deref() != Some(ENTRY_HEADER) {
        std::fs::write(&file, ENTRY_HEADER)?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    #[test]
    fn message_text_stops_at_the_nul_and_keeps_unterminated_text() {
        let mut buf = [0 as std::ffi::c_char; 8];
        for (b, c) in buf.iter_mut().zip(b"timeout\0x") {
            *b = std::ffi::c_char::from_ne_bytes([*c]);
        }
        assert_eq!(super::message_text(&buf), "timeout");
        let full = [std::ffi::c_char::from_ne_bytes([b'a']); 4];
        assert_eq!(super::message_text(&full), "aaaa");
        assert_eq!(super::message_text(&[]), "");
    }
}
