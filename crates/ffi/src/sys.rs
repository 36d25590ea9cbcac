//! The byte-append callback shims call to hand bytes to Rust.
#![allow(unsafe_code)]

use std::ffi::c_void;

/// The C signature of [`append_to_vec`]: `void (*)(void* out, const uint8_t*
/// data, size_t len)`.
pub type AppendFn = unsafe extern "C" fn(out: *mut c_void, data: *const u8, len: usize);

/// Appends `len` bytes at `data` to the `Vec<u8>` at `out`. A shim gets it
/// with the `out` pointer of the call in progress (e.g. a store `get`) and
/// calls it with each piece of the value. Null `out`, or null `data` with a
/// nonzero `len`, is ignored. Catches every panic: nothing unwinds into C++.
///
/// # Safety
/// `out` must be null or point to a live `Vec<u8>` that nothing else
/// accesses during the call; `data` must be null or point to `len` readable
/// bytes that do not overlap it.
pub unsafe extern "C" fn append_to_vec(out: *mut c_void, data: *const u8, len: usize) {
    let _ = std::panic::catch_unwind(|| {
        if out.is_null() || (data.is_null() && len > 0) {
            return;
        }
        // SAFETY: `out` is a live, unaliased `Vec<u8>` (the caller's
        // contract), checked non-null above.
        let v = unsafe { &mut *out.cast::<Vec<u8>>() };
        if len > 0 {
            // SAFETY: `data` points to `len` readable bytes not overlapping
            // `v` (the caller's contract), checked non-null above.
            v.extend_from_slice(unsafe { std::slice::from_raw_parts(data, len) });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_every_piece_and_ignores_null_pointers() {
        let mut v: Vec<u8> = b"ab".to_vec();
        let out = std::ptr::from_mut(&mut v).cast::<c_void>();
        let piece = b"cde";
        // SAFETY: `out` is `v`, alive and not otherwise used during the calls;
        // `piece` has 3 readable bytes.
        unsafe {
            append_to_vec(out, piece.as_ptr(), piece.len());
            append_to_vec(out, std::ptr::null(), 0);
            append_to_vec(out, std::ptr::null(), 5);
            append_to_vec(std::ptr::null_mut(), piece.as_ptr(), 3);
        }
        assert_eq!(v, b"abcde");
    }
}
