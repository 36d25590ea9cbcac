//! What the backends' C++ shims share, written once (the Gloo adapter and
//! the libtorch c10d shim each call into C++ and back):
//!
//! - [`sys::append_to_vec`], the callback through which a shim hands bytes
//!   to Rust, and its type [`sys::AppendFn`];
//! - `include/ccol_entry.hpp` ([`INCLUDE_DIR`]): the templates that guard a
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

/// The directory holding `ccol_entry.hpp`, to pass to the C++ compiler as
/// an include directory (an absolute path inside this crate's source).
pub const INCLUDE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/include");

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
