//! The crate's only unsafe code: loading the adapter and safe handles over
//! its C ABI.
//!
//! - Loading: the adapter file — the one [`use_adapter_file`] named (the
//!   Python wheel's), else the embedded shared object written to a cache file
//!   once (feature `embedded-adapter`) — is opened with
//!   `dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)`, so its Gloo symbols
//!   resolve against the libgloo it links (Debian's, or the copy a wheel
//!   carries) even in a process that also holds libtorch's copy of Gloo
//!   (docs/environment.md).
//! - Handles: [`StoreHandle`], [`Context`], [`Buffer`] own one adapter object
//!   each (`NonNull` inside, freed once by a Drop that never panics) and
//!   expose safe methods over slices, `&CStr` and durations;
//!   [`Interrupter`] lets another thread interrupt a buffer's wait.
//! - A core `Store` written in Rust reaches Gloo through a table of C
//!   function pointers (`cb_*`): each catches panics, and the pointer-to-store
//!   conversion (`store_of`) states the contract the adapter keeps.
//!
//! This file holds the adapter's status codes, its error record and the
//! helpers every entry call goes through; beside it, under `sys/`:
//! - `adapter` — the adapter's entry points ([`Api`]) and loading them;
//!   `embedded` — writing the embedded copy to a private cache file;
//! - `store` — [`StoreHandle`]; `callbacks` — the `cb_*` table through
//!   which Gloo calls a Rust store;
//! - `context` — [`Context`]; `buffer` — [`Buffer`] and [`Interrupter`].

mod adapter;
mod buffer;
mod callbacks;
mod context;
#[cfg(feature = "embedded-adapter")]
mod embedded;
mod store;

pub(crate) use adapter::{api, use_adapter_file, Api, PostFn, StoreVtable, WaitFn};
pub(crate) use buffer::{Buffer, Interrupter};
pub(crate) use context::Context;
pub(crate) use store::StoreHandle;

use crate::GlooError;
use std::ffi::{c_char, c_void, CString};
use std::ptr::NonNull;
use std::time::Duration;

pub(crate) const OK: i32 = 0;
pub(crate) const TIMEOUT: i32 = 1;
pub(crate) const IO: i32 = 2;
pub(crate) const INVALID: i32 = 3;
pub(crate) const ABORTED: i32 = 5;

/// `ccol_gloo_error`.
#[repr(C)]
pub(crate) struct RawError {
    pub(crate) status: i32,
    pub(crate) message: [c_char; 1024],
}

impl RawError {
    pub(crate) fn new() -> Self {
        RawError {
            status: 0,
            message: [0; 1024],
        }
    }

    pub(crate) fn message(&self) -> String {
        // The adapter always NUL-terminates (snprintf); guard anyway.
        compiler_collectives_ffi::message_text(&self.message)
    }

    pub(crate) fn into_error(self, status: i32, what: &str) -> GlooError {
        GlooError::Engine {
            status,
            operation: what.to_owned(),
            message: self.message(),
        }
    }
}

/// A NUL-terminated copy of `s`.
pub(crate) fn cstring(s: &str, what: &str) -> Result<CString, GlooError> {
    CString::new(s).map_err(|_| GlooError::Invalid(format!("{what} contains a NUL byte")))
}

/// Whole milliseconds of `timeout`, saturating (the adapter takes `int64_t` ms).
pub(crate) fn timeout_ms(timeout: Duration) -> i64 {
    i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)
}

/// Calls an adapter entry with a fresh [`RawError`] for it to fill (`entry`
/// gets the pointer, valid and writable until `entry` returns); what the
/// entry returned, and the error it filled.
fn called<T>(entry: impl FnOnce(*mut RawError) -> T) -> (T, RawError) {
    let mut err = RawError::new();
    let returned = entry(&mut err);
    (returned, err)
}

/// [`called`] for an entry returning a new adapter object: the object, or
/// the error the adapter filled in when it returned NULL.
fn made(
    what: &str,
    entry: impl FnOnce(*mut RawError) -> *mut c_void,
) -> Result<NonNull<c_void>, GlooError> {
    let (ptr, err) = called(entry);
    NonNull::new(ptr).ok_or_else(|| {
        let status = err.status;
        err.into_error(status, what)
    })
}

/// [`called`] for an entry returning a status: `Ok` for [`OK`], else the
/// error the adapter filled in.
fn checked(what: &str, entry: impl FnOnce(*mut RawError) -> i32) -> Result<(), GlooError> {
    let (status, err) = called(entry);
    if status == OK {
        Ok(())
    } else {
        Err(err.into_error(status, what))
    }
}

/// Implements `Drop` for an adapter handle (a struct with `api: &'static
/// Api` and `ptr: NonNull<c_void>`): frees `ptr` with the entry `api.$free`.
///
/// # Safety contract
/// Each use states, in a `// SAFETY:` comment, that `ptr` came from the
/// adapter's constructor for that kind of object, that nothing else frees it
/// and every other use of it borrows the handle (so this free is its only
/// one, and the last use), and that `$free` is that kind's `_free` entry,
/// which catches every exception (so Drop never panics), together with
/// anything its kind needs besides.
macro_rules! free_on_drop {
    ($handle:ty, $free:ident) => {
        impl Drop for $handle {
            fn drop(&mut self) {
                // SAFETY: the macro's contract, stated at its use: `ptr` came
                // from the adapter and is freed once, here, by its kind's
                // `_free` entry.
                unsafe { (self.api.$free)(self.ptr.as_ptr()) };
            }
        }
    };
}
// Imported by path in `store`, `context` and `buffer`, whose handles it frees.
use free_on_drop;
