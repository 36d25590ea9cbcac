//! [`StoreHandle`]: one of Gloo's rendezvous stores (File, Redis, Hash,
//! Prefix), or a core [`Store`] reached through the `cb_*` table.

use super::callbacks::{cb_drop, cb_get, cb_set, cb_wait};
use super::{api, checked, free_on_drop, made, timeout_ms, Api, RawError, StoreVtable};
use crate::GlooError;
use compiler_collectives_core::Store;
use compiler_collectives_ffi::sys::append_to_vec;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// An adapter store handle: a heap object owning a
/// `std::shared_ptr<gloo::rendezvous::Store>` (a prefix store also keeps its
/// parent alive). Freed once, by Drop.
#[derive(Debug)]
pub(crate) struct StoreHandle {
    pub(super) api: &'static Api,
    pub(super) ptr: NonNull<c_void>,
    /// Held around every call into a store that is not thread-safe: Gloo's
    /// RedisStore talks over one hiredis connection without a lock. Shared
    /// by a Redis store and its prefixes; `None` for every other kind.
    serial: Option<Arc<Mutex<()>>>,
}

// SAFETY: the handle owns its heap object outright (no thread-local state in
// the adapter or in Gloo's stores), so it may be used and freed on any thread.
unsafe impl Send for StoreHandle {}
// SAFETY: concurrent calls through `&StoreHandle` never race inside a store:
// HashStore locks its own mutex, FileStore keeps no mutable state in memory
// (only files, each written under a temporary name and renamed), a
// PrefixStore forwards to its parent, the Rust store's callbacks reach a
// `Store: Send + Sync`, and RedisStore's connection is only used under
// `serial` (see `lock`).
unsafe impl Sync for StoreHandle {}

// SAFETY (`free_on_drop!`'s contract): `ptr` came from one of the adapter's
// store constructors (`StoreHandle::new` takes it from `made`) and is freed
// once, by this Drop; every use of it borrowed `self`. ccol_gloo_store_free
// catches exceptions.
free_on_drop!(StoreHandle, store_free);

impl StoreHandle {
    /// A handle over the store `entry` (one of the adapter's store
    /// constructors) makes.
    fn new(
        api: &'static Api,
        what: &str,
        serial: Option<Arc<Mutex<()>>>,
        entry: impl FnOnce(*mut RawError) -> *mut c_void,
    ) -> Result<Self, GlooError> {
        Ok(StoreHandle {
            api,
            ptr: made(what, entry)?,
            serial,
        })
    }

    /// Gloo's FileStore in the (existing) directory `dir`.
    pub(crate) fn file(dir: &CStr) -> Result<Self, GlooError> {
        let api = api()?;
        Self::new(api, "FileStore", None, |err| {
            // SAFETY: `dir` is NUL-terminated and outlives the call (the
            // adapter copies it); `err` is a writable ccol_gloo_error.
            unsafe { (api.store_file)(dir.as_ptr(), err) }
        })
    }

    /// Gloo's RedisStore at `host:port`.
    pub(crate) fn redis(host: &CStr, port: u16) -> Result<Self, GlooError> {
        let api = api()?;
        Self::new(api, "RedisStore", Some(Arc::default()), |err| {
            // SAFETY: as in `file`.
            unsafe { (api.store_redis)(host.as_ptr(), i32::from(port), err) }
        })
    }

    /// Gloo's in-memory HashStore.
    pub(crate) fn hash() -> Result<Self, GlooError> {
        let api = api()?;
        // SAFETY: `err` is a writable ccol_gloo_error.
        Self::new(api, "HashStore", None, |err| unsafe {
            (api.store_hash)(err)
        })
    }

    /// A core [`Store`] seen by Gloo as a store: the adapter calls the
    /// trampolines below (`cb_*`) with `ctx` = the box leaked here. Gloo's
    /// waits use `timeout` when Gloo gives none.
    pub(crate) fn rust(store: Arc<dyn Store>, timeout: Duration) -> Result<Self, GlooError> {
        let api = api()?;
        let vt = StoreVtable {
            ctx: Box::into_raw(Box::new(store)).cast(),
            set: cb_set,
            get: cb_get,
            wait: cb_wait,
            drop: cb_drop,
        };
        Self::new(api, "Rust store", None, |err| {
            // SAFETY: the table's functions have the signatures of
            // ccol_gloo_store_vtable. From here on the adapter owns `ctx` (the
            // `Box<Arc<dyn Store>>` leaked above) and upholds `store_of`'s
            // contract: it passes `ctx` unchanged to every callback and calls
            // `drop` exactly once — before returning NULL if the store cannot
            // be made, else when the last handle referring to the store is
            // freed, which (every call borrowing a handle) is after every
            // callback.
            unsafe { (api.store_callbacks)(vt, timeout_ms(timeout), err) }
        })
    }

    /// Gloo's PrefixStore over this store (which it keeps alive).
    pub(crate) fn prefixed(&self, prefix: &CStr) -> Result<Self, GlooError> {
        Self::new(self.api, "PrefixStore", self.serial.clone(), |err| {
            // SAFETY: `self.ptr` is live (borrowed); `prefix` is
            // NUL-terminated and outlives the call; `err` is writable.
            unsafe { (self.api.store_prefix)(self.ptr.as_ptr(), prefix.as_ptr(), err) }
        })
    }

    /// Serialises calls into a store that is not thread-safe (see `serial`).
    pub(super) fn lock(&self) -> Option<MutexGuard<'_, ()>> {
        self.serial
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Gloo's `Store::set`.
    pub(crate) fn set(&self, key: &CStr, value: &[u8]) -> Result<(), GlooError> {
        let _serial = self.lock();
        checked("store set", |err| {
            // SAFETY: `self.ptr` is live (borrowed); `key` is NUL-terminated
            // and `value` is `value.len()` readable bytes, both alive for the
            // call (the adapter copies them); `err` is writable.
            unsafe {
                (self.api.store_set)(
                    self.ptr.as_ptr(),
                    key.as_ptr(),
                    value.as_ptr(),
                    value.len(),
                    err,
                )
            }
        })
    }

    /// Gloo's `Store::get`: waits until `key` is set (at most `timeout`).
    pub(crate) fn get(&self, key: &CStr, timeout: Duration) -> Result<Vec<u8>, GlooError> {
        let _serial = self.lock();
        let mut out: Vec<u8> = Vec::new();
        checked("store get", |err| {
            // SAFETY: `self.ptr` is live (borrowed); `key` is NUL-terminated
            // and alive for the call; `out` is a live `Vec<u8>`, the type
            // `append_to_vec` requires, and the adapter passes it to nothing
            // but `append_to_vec`, during this call; `err` is writable.
            unsafe {
                (self.api.store_get)(
                    self.ptr.as_ptr(),
                    key.as_ptr(),
                    timeout_ms(timeout),
                    std::ptr::from_mut(&mut out).cast(),
                    append_to_vec,
                    err,
                )
            }
        })
        .map(|()| out)
    }

    /// Gloo's `Store::wait`: waits until every key is set (at most `timeout`).
    pub(crate) fn wait(&self, keys: &[CString], timeout: Duration) -> Result<(), GlooError> {
        let ptrs: Vec<*const c_char> = keys.iter().map(|c| c.as_ptr()).collect();
        let _serial = self.lock();
        checked("store wait", |err| {
            // SAFETY: `self.ptr` is live (borrowed); `ptrs` holds `ptrs.len()`
            // pointers to the NUL-terminated `keys`, all alive for the call;
            // `err` is writable.
            unsafe {
                (self.api.store_wait)(
                    self.ptr.as_ptr(),
                    ptrs.as_ptr(),
                    ptrs.len(),
                    timeout_ms(timeout),
                    err,
                )
            }
        })
    }
}
