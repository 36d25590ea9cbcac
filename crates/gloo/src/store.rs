//! Gloo rendezvous stores: FileStore, RedisStore, HashStore, PrefixStore,
//! and any core [`Store`] written in Rust (through a table of C function
//! pointers).

use crate::sys::{self, api, RawError, StoreVtable};
use crate::GlooError;
use compiler_collectives_core::{Deadline, Error, Store};
use std::ffi::{c_char, c_void};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

/// Which kind of store a [`GlooStore`] is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// Gloo's FileStore in a directory (ranks on one host, or a shared filesystem).
    File(std::path::PathBuf),
    /// Gloo's RedisStore (ranks on several hosts).
    Redis {
        /// Host name or address.
        host: String,
        /// TCP port.
        port: u16,
    },
    /// Gloo's in-memory HashStore (ranks as threads of one process).
    Hash,
    /// A core [`Store`] written in Rust.
    Rust,
    /// A prefix over another store.
    Prefix(String),
}

/// A Gloo rendezvous store handle. Cloning shares the store.
#[derive(Clone, Debug)]
pub struct GlooStore {
    handle: Arc<StoreHandle>,
    kind: StoreKind,
}

#[derive(Debug)]
struct StoreHandle(NonNull<c_void>);

// SAFETY: the adapter's store handle is a heap object owning a
// std::shared_ptr<gloo::rendezvous::Store>; Gloo's stores guard their own
// state (FileStore uses files, HashStore a mutex), and the Rust-backed
// store's callbacks require `Store: Send + Sync`.
unsafe impl Send for StoreHandle {}
// SAFETY: as for Send: shared use goes through the adapter's thread-safe store.
unsafe impl Sync for StoreHandle {}

impl Drop for StoreHandle {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: the handle came from the adapter and is freed once, here.
            unsafe { (api.store_free)(self.0.as_ptr()) };
        }
    }
}

fn made(ptr: *mut c_void, err: RawError, what: &str) -> Result<StoreHandle, GlooError> {
    NonNull::new(ptr).map(StoreHandle).ok_or_else(|| {
        let status = err.status;
        err.into_error(status, what)
    })
}

fn timeout_ms(timeout: Duration) -> i64 {
    i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)
}

impl GlooStore {
    /// Gloo's FileStore in `dir` (created if missing).
    ///
    /// # Errors
    /// [`GlooError`] if the adapter cannot load or the directory cannot be used.
    pub fn file(dir: impl AsRef<std::path::Path>) -> Result<Self, GlooError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| GlooError::Invalid(format!("store directory {}: {e}", dir.display())))?;
        let path = sys::cstring(&dir.to_string_lossy(), "store directory")?;
        let api = api()?;
        let mut err = RawError::new();
        // SAFETY: `path` is NUL-terminated and outlives the call; `err` is writable.
        let p = unsafe { (api.store_file)(path.as_ptr(), &mut err) };
        Ok(GlooStore {
            handle: Arc::new(made(p, err, "FileStore")?),
            kind: StoreKind::File(dir.to_path_buf()),
        })
    }

    /// Gloo's RedisStore at `host:port`.
    ///
    /// # Errors
    /// [`GlooError`] if the server cannot be reached.
    pub fn redis(host: &str, port: u16) -> Result<Self, GlooError> {
        let h = sys::cstring(host, "redis host")?;
        let api = api()?;
        let mut err = RawError::new();
        // SAFETY: `h` is NUL-terminated and outlives the call; `err` is writable.
        let p = unsafe { (api.store_redis)(h.as_ptr(), i32::from(port), &mut err) };
        Ok(GlooStore {
            handle: Arc::new(made(p, err, "RedisStore")?),
            kind: StoreKind::Redis {
                host: host.to_owned(),
                port,
            },
        })
    }

    /// Gloo's in-memory HashStore (for ranks that are threads of one process).
    ///
    /// # Errors
    /// [`GlooError`] if the adapter cannot load.
    pub fn hash() -> Result<Self, GlooError> {
        let api = api()?;
        let mut err = RawError::new();
        // SAFETY: `err` is writable.
        let p = unsafe { (api.store_hash)(&mut err) };
        Ok(GlooStore {
            handle: Arc::new(made(p, err, "HashStore")?),
            kind: StoreKind::Hash,
        })
    }

    /// A Rust [`Store`] seen by Gloo as its rendezvous store. Gloo's waits use
    /// `timeout` when Gloo gives none.
    ///
    /// # Errors
    /// [`GlooError`] if the adapter cannot load.
    pub fn from_store(store: Arc<dyn Store>, timeout: Duration) -> Result<Self, GlooError> {
        let api = api()?;
        let boxed: Box<Arc<dyn Store>> = Box::new(store);
        let vt = StoreVtable {
            ctx: Box::into_raw(boxed).cast(),
            set: cb_set,
            get: cb_get,
            wait: cb_wait,
            drop: cb_drop,
        };
        let mut err = RawError::new();
        // SAFETY: the vtable's functions match the header; on failure the
        // adapter calls `drop` itself, so the box is freed exactly once.
        let p = unsafe { (api.store_callbacks)(vt, timeout_ms(timeout), &mut err) };
        Ok(GlooStore {
            handle: Arc::new(made(p, err, "Rust store")?),
            kind: StoreKind::Rust,
        })
    }

    /// A view of this store in which every key `k` is stored as `prefix/k`
    /// (Gloo's PrefixStore).
    ///
    /// # Errors
    /// [`GlooError`] if `prefix` contains NUL.
    pub fn prefixed(&self, prefix: &str) -> Result<Self, GlooError> {
        let p = sys::cstring(prefix, "prefix")?;
        let api = api()?;
        let mut err = RawError::new();
        // SAFETY: the parent handle is live (we hold it); `p` outlives the call.
        let h = unsafe { (api.store_prefix)(self.handle.0.as_ptr(), p.as_ptr(), &mut err) };
        Ok(GlooStore {
            handle: Arc::new(made(h, err, "PrefixStore")?),
            kind: StoreKind::Prefix(prefix.to_owned()),
        })
    }

    /// What kind of store this is.
    pub fn kind(&self) -> &StoreKind {
        &self.kind
    }

    pub(crate) fn raw(&self) -> *mut c_void {
        self.handle.0.as_ptr()
    }

    /// Sets `key` (Gloo's `Store::set`). Gloo's FileStore cannot hold an
    /// empty value (its read enforces a non-empty file).
    ///
    /// # Errors
    /// The store's error.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), GlooError> {
        let k = sys::cstring(key, "key")?;
        let api = api()?;
        let mut err = RawError::new();
        // SAFETY: handle live, `k` and `value` outlive the call.
        let s = unsafe {
            (api.store_set)(
                self.raw(),
                k.as_ptr(),
                value.as_ptr(),
                value.len(),
                &mut err,
            )
        };
        if s == sys::OK {
            Ok(())
        } else {
            Err(err.into_error(s, "store set"))
        }
    }

    /// Waits until `key` is set (at most `timeout`) and returns it.
    ///
    /// # Errors
    /// A timeout or the store's error.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, GlooError> {
        let k = sys::cstring(key, "key")?;
        let api = api()?;
        let mut out: Vec<u8> = Vec::new();
        let mut err = RawError::new();
        // SAFETY: handle live; `out` is a live Vec<u8> matching `append_to_vec`.
        let s = unsafe {
            (api.store_get)(
                self.raw(),
                k.as_ptr(),
                timeout_ms(timeout),
                std::ptr::from_mut(&mut out).cast(),
                sys::append_to_vec,
                &mut err,
            )
        };
        if s == sys::OK {
            Ok(out)
        } else {
            Err(err.into_error(s, "store get"))
        }
    }

    /// Waits until every key is set (at most `timeout`).
    ///
    /// # Errors
    /// A timeout or the store's error.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), GlooError> {
        let owned = keys
            .iter()
            .map(|k| sys::cstring(k, "key"))
            .collect::<Result<Vec<_>, _>>()?;
        let ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        let api = api()?;
        let mut err = RawError::new();
        // SAFETY: handle live; `ptrs` points at `owned`, both outlive the call.
        let s = unsafe {
            (api.store_wait)(
                self.raw(),
                ptrs.as_ptr(),
                ptrs.len(),
                timeout_ms(timeout),
                &mut err,
            )
        };
        if s == sys::OK {
            Ok(())
        } else {
            Err(err.into_error(s, "store wait"))
        }
    }
}

fn deadline_in(ms: i64) -> Deadline {
    Deadline::after(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

fn fill(err: *mut RawError, status: i32, e: &Error) -> i32 {
    if err.is_null() {
        return status;
    }
    let text = e.to_string();
    // SAFETY: the adapter passes a writable ccol_gloo_error.
    let out = unsafe { &mut *err };
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
        Error::Timeout { .. } => sys::TIMEOUT,
        Error::InvalidArgument(_) => sys::INVALID,
        _ => sys::IO,
    }
}

fn store_of<'a>(ctx: *mut c_void) -> &'a Arc<dyn Store> {
    // SAFETY: ctx is the Box<Arc<dyn Store>> made in `from_store`, alive until `cb_drop`.
    unsafe { &*ctx.cast::<Arc<dyn Store>>() }
}

fn guarded(err: *mut RawError, f: impl FnOnce() -> Result<(), Error>) -> i32 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => sys::OK,
        Ok(Err(e)) => fill(err, status_of(&e), &e),
        Err(_) => fill(
            err,
            sys::IO,
            &Error::InvalidArgument("the Rust store panicked".into()),
        ),
    }
}

unsafe extern "C" fn cb_set(
    ctx: *mut c_void,
    key: *const c_char,
    data: *const u8,
    len: usize,
    err: *mut RawError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the adapter passes a NUL-terminated key.
        let key = unsafe { sys::from_c(key) };
        let value = if len == 0 || data.is_null() {
            &[][..]
        } else {
            // SAFETY: the adapter passes `len` readable bytes.
            unsafe { std::slice::from_raw_parts(data, len) }
        };
        store_of(ctx).set(&key, value, Deadline::after(Duration::from_secs(300)))
    })
}

unsafe extern "C" fn cb_get(
    ctx: *mut c_void,
    key: *const c_char,
    timeout_ms: i64,
    out: *mut c_void,
    append: sys::AppendFn,
    err: *mut RawError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the adapter passes a NUL-terminated key.
        let key = unsafe { sys::from_c(key) };
        let value = store_of(ctx).get(&key, deadline_in(timeout_ms))?;
        // SAFETY: `append` and `out` are the adapter's pair; `value` is alive.
        unsafe { append(out, value.as_ptr(), value.len()) };
        Ok(())
    })
}

unsafe extern "C" fn cb_wait(
    ctx: *mut c_void,
    keys: *const *const c_char,
    n: usize,
    timeout_ms: i64,
    err: *mut RawError,
) -> i32 {
    guarded(err, || {
        let keys: Vec<String> = (0..n)
            // SAFETY: the adapter passes `n` NUL-terminated strings.
            .map(|i| unsafe { sys::from_c(*keys.add(i)) })
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        store_of(ctx).wait(&refs, deadline_in(timeout_ms))
    })
}

unsafe extern "C" fn cb_drop(ctx: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: ctx is the Box made in `from_store`; the adapter calls drop once.
        drop(unsafe { Box::from_raw(ctx.cast::<Arc<dyn Store>>()) });
    });
}
