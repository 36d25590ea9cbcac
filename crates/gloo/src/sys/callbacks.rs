//! The table of C function pointers through which Gloo calls a core
//! [`Store`] written in Rust: each `cb_*` catches panics (nothing unwinds
//! into C++) and writes an error's text into the adapter's error record.

use super::{RawError, INVALID, IO, OK, TIMEOUT};
use compiler_collectives_core::protocol::DEFAULT_TIMEOUT;
use compiler_collectives_core::{Deadline, Error, Store};
use compiler_collectives_ffi::sys::AppendFn;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;
use std::time::Duration;

/// Reads a C string the adapter handed over ("" for NULL).
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string alive for the call.
unsafe fn from_c(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn deadline_in(ms: i64) -> Deadline {
    Deadline::after(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// Writes `e` into the adapter's error slot (if any) and returns `status`.
///
/// # Safety
/// `err` must be NULL or point to a writable `ccol_gloo_error` that nothing
/// else accesses during the call.
unsafe fn fill(err: *mut RawError, status: i32, e: &Error) -> i32 {
    // SAFETY: NULL or writable and unaliased (the caller's contract).
    let Some(out) = (unsafe { err.as_mut() }) else {
        return status;
    };
    let text = e.to_string();
    out.status = status;
    let n = text.len().min(out.message.len() - 1);
    for (dst, &b) in out.message.iter_mut().zip(&text.as_bytes()[..n]) {
        *dst = c_char::from_ne_bytes([b]);
    }
    out.message[n] = 0;
    status
}

fn status_of(e: &Error) -> i32 {
    match e {
        Error::Timeout { .. } => TIMEOUT,
        Error::InvalidArgument(_) => INVALID,
        _ => IO,
    }
}

/// The Rust store behind a callback's `ctx`.
///
/// # Safety
/// `ctx` must be the pointer [`StoreHandle::rust`](super::StoreHandle::rust) put in the vtable (the
/// `Box<Arc<dyn Store>>` it leaked), and the vtable's `drop` (`cb_drop`) must
/// not run on it until the returned reference is gone: the caller picks `'a`
/// no longer than the callback it is in. The adapter guarantees both (see
/// the SAFETY comment in [`StoreHandle::rust`](super::StoreHandle::rust)).
unsafe fn store_of<'a>(ctx: *mut c_void) -> &'a Arc<dyn Store> {
    // SAFETY: `ctx` is a live `Box<Arc<dyn Store>>` for `'a` (the caller's
    // contract); only shared references to it are ever made.
    unsafe { &*ctx.cast::<Arc<dyn Store>>() }
}

/// Runs a callback's body, catching its panic: nothing unwinds into C++.
/// An error comes back with the status the adapter gets for it.
fn guarded(f: impl FnOnce() -> Result<(), Error>) -> Result<(), (i32, Error)> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err((status_of(&e), e)),
        Err(_) => Err((IO, Error::InvalidArgument("the Rust store panicked".into()))),
    }
}

/// A callback's status, with its error's text written into `err`.
///
/// # Safety
/// As [`fill`] for `err`.
unsafe fn report(err: *mut RawError, result: Result<(), (i32, Error)>) -> i32 {
    match result {
        Ok(()) => OK,
        // Formatting the error runs its Display: keep a panic there from
        // unwinding into C++ too.
        Err((status, e)) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: forwarded from the caller.
            unsafe { fill(err, status, &e) }
        }))
        .unwrap_or(status),
    }
}

/// The vtable's `set`.
///
/// # Safety
/// Called by the adapter only: `ctx` as for [`store_of`], `key`
/// NUL-terminated, `data` NULL or `len` readable bytes, `err` as for [`fill`].
pub(super) unsafe extern "C" fn cb_set(
    ctx: *mut c_void,
    key: *const c_char,
    data: *const u8,
    len: usize,
    err: *mut RawError,
) -> i32 {
    let result = guarded(|| {
        // SAFETY: the adapter passes a NUL-terminated key (`key.c_str()`).
        let key = unsafe { from_c(key) };
        let value = if len == 0 || data.is_null() {
            &[][..]
        } else {
            // SAFETY: the adapter passes `len` readable bytes (`data.data()`).
            unsafe { std::slice::from_raw_parts(data, len) }
        };
        // SAFETY: the adapter's `ctx` during one of its callbacks (this fn's contract).
        let store = unsafe { store_of(ctx) };
        store.set(&key, value, Deadline::after(DEFAULT_TIMEOUT))
    });
    // SAFETY: `err` is the adapter's writable ccol_gloo_error (this fn's contract).
    unsafe { report(err, result) }
}

/// The vtable's `get`.
///
/// # Safety
/// Called by the adapter only: `ctx` as for [`store_of`], `key`
/// NUL-terminated, `append` callable with `out`, `err` as for [`fill`].
pub(super) unsafe extern "C" fn cb_get(
    ctx: *mut c_void,
    key: *const c_char,
    timeout_ms: i64,
    out: *mut c_void,
    append: AppendFn,
    err: *mut RawError,
) -> i32 {
    let result = guarded(|| {
        // SAFETY: the adapter passes a NUL-terminated key (`key.c_str()`).
        let key = unsafe { from_c(key) };
        // SAFETY: the adapter's `ctx` during one of its callbacks (this fn's contract).
        let store = unsafe { store_of(ctx) };
        let value = store.get(&key, deadline_in(timeout_ms))?;
        // SAFETY: `append` and `out` are the adapter's pair (its
        // `append_to_vector` and a live std::vector<char>); `value` is
        // `value.len()` readable bytes, alive for the call.
        unsafe { append(out, value.as_ptr(), value.len()) };
        Ok(())
    });
    // SAFETY: `err` is the adapter's writable ccol_gloo_error (this fn's contract).
    unsafe { report(err, result) }
}

/// The vtable's `wait`.
///
/// # Safety
/// Called by the adapter only: `ctx` as for [`store_of`], `keys` `n`
/// NUL-terminated strings, `err` as for [`fill`].
pub(super) unsafe extern "C" fn cb_wait(
    ctx: *mut c_void,
    keys: *const *const c_char,
    n: usize,
    timeout_ms: i64,
    err: *mut RawError,
) -> i32 {
    let result = guarded(|| {
        let keys: Vec<String> = (0..n)
            // SAFETY: the adapter passes `n` pointers to NUL-terminated
            // strings (`c_str()` of its key vector).
            .map(|i| unsafe { from_c(*keys.add(i)) })
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        // SAFETY: the adapter's `ctx` during one of its callbacks (this fn's contract).
        let store = unsafe { store_of(ctx) };
        store.wait(&refs, deadline_in(timeout_ms))
    });
    // SAFETY: `err` is the adapter's writable ccol_gloo_error (this fn's contract).
    unsafe { report(err, result) }
}

/// The vtable's `drop`: frees the box
/// [`StoreHandle::rust`](super::StoreHandle::rust) leaked.
///
/// # Safety
/// Called by the adapter only, once, with the vtable's `ctx`, after every
/// other callback on it has returned.
pub(super) unsafe extern "C" fn cb_drop(ctx: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `ctx` is the box made by `Box::into_raw` in
        // `StoreHandle::rust`, freed once, here (this fn's contract).
        drop(unsafe { Box::from_raw(ctx.cast::<Arc<dyn Store>>()) });
    });
}
