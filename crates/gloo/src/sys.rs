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

use crate::GlooError;
use compiler_collectives_core::{Deadline, Error, Store};
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The adapter's ABI version this crate was written against.
pub(crate) const ABI_VERSION: u32 = 2;

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

pub(crate) use compiler_collectives_ffi::sys::{append_to_vec, AppendFn};

/// A store's `set` (the vtable's and `ccol_gloo_store_set`): the store, the
/// key, `len` bytes of value.
pub(crate) type SetFn =
    unsafe extern "C" fn(*mut c_void, *const c_char, *const u8, usize, *mut RawError) -> i32;
/// A store's `get`: the store, the key, the timeout, the output and its
/// append function.
pub(crate) type GetFn = unsafe extern "C" fn(
    *mut c_void,
    *const c_char,
    i64,
    *mut c_void,
    AppendFn,
    *mut RawError,
) -> i32;
/// A store's `wait`: the store, `n` keys, the timeout.
pub(crate) type WaitKeysFn =
    unsafe extern "C" fn(*mut c_void, *const *const c_char, usize, i64, *mut RawError) -> i32;
/// `ccol_gloo_buffer_send` and `ccol_gloo_buffer_recv`: a buffer, the peer,
/// the slot, the offset and the length.
pub(crate) type PostFn =
    unsafe extern "C" fn(*mut c_void, i32, u64, usize, usize, *mut RawError) -> i32;
/// `ccol_gloo_buffer_wait_recv` and `ccol_gloo_buffer_wait_send`: a buffer,
/// the timeout, where the peer goes.
pub(crate) type WaitFn = unsafe extern "C" fn(*mut c_void, i64, *mut i32, *mut RawError) -> i32;

/// `ccol_gloo_store_vtable`.
#[repr(C)]
pub(crate) struct StoreVtable {
    pub(crate) ctx: *mut c_void,
    pub(crate) set: SetFn,
    pub(crate) get: GetFn,
    pub(crate) wait: WaitKeysFn,
    pub(crate) drop: unsafe extern "C" fn(*mut c_void),
}

/// The adapter's entry points.
pub(crate) struct Api {
    _lib: libloading::Library,
    pub(crate) path: PathBuf,
    pub(crate) store_file: unsafe extern "C" fn(*const c_char, *mut RawError) -> *mut c_void,
    pub(crate) store_hash: unsafe extern "C" fn(*mut RawError) -> *mut c_void,
    pub(crate) store_redis: unsafe extern "C" fn(*const c_char, i32, *mut RawError) -> *mut c_void,
    pub(crate) store_prefix:
        unsafe extern "C" fn(*mut c_void, *const c_char, *mut RawError) -> *mut c_void,
    pub(crate) store_callbacks:
        unsafe extern "C" fn(StoreVtable, i64, *mut RawError) -> *mut c_void,
    pub(crate) store_set: SetFn,
    pub(crate) store_get: GetFn,
    pub(crate) store_wait: WaitKeysFn,
    pub(crate) store_free: unsafe extern "C" fn(*mut c_void),
    pub(crate) context_new: unsafe extern "C" fn(
        *mut c_void,
        i32,
        i32,
        *const c_char,
        i64,
        *mut RawError,
    ) -> *mut c_void,
    pub(crate) context_close: unsafe extern "C" fn(*mut c_void),
    pub(crate) context_free: unsafe extern "C" fn(*mut c_void),
    pub(crate) buffer_new:
        unsafe extern "C" fn(*mut c_void, *mut c_void, usize, *mut RawError) -> *mut c_void,
    pub(crate) buffer_send: PostFn,
    pub(crate) buffer_recv: PostFn,
    pub(crate) buffer_wait_recv: WaitFn,
    pub(crate) buffer_wait_send: WaitFn,
    pub(crate) buffer_abort_wait: unsafe extern "C" fn(*mut c_void, i32),
    pub(crate) buffer_free: unsafe extern "C" fn(*mut c_void),
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

static API: OnceLock<Result<Api, GlooError>> = OnceLock::new();

/// The loaded adapter (loaded on first use).
pub(crate) fn api() -> Result<&'static Api, GlooError> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// The adapter file to load: set once, by [`use_adapter_file`] or, when
/// nobody named one before the first load, by [`load`] (`None`: the embedded
/// adapter). Whoever sets it first decides; the other gets an error.
static ADAPTER_FILE: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Loads the adapter from `path` instead of the embedded one: for a package
/// that ships the adapter as a file of its own (the Python wheel, whose
/// `auditwheel` pass gives the file the Gloo libraries the wheel carries).
/// Call it before the first use of the transport; the file is opened on that
/// first use. A relative path is made absolute against the current directory
/// now (so `dlopen` never searches the library path for it).
///
/// # Errors
/// [`GlooError::Load`] if another adapter was chosen already (another path,
/// or the embedded adapter by a first use), or if the current directory
/// cannot be read for a relative path. Naming the chosen path again is
/// `Ok`.
pub(crate) fn use_adapter_file(path: &Path) -> Result<(), GlooError> {
    let path = std::path::absolute(path)
        .map_err(|e| GlooError::Load(format!("cannot make {} absolute: {e}", path.display())))?;
    match ADAPTER_FILE.set(Some(path.clone())) {
        Ok(()) => Ok(()),
        Err(_) => match ADAPTER_FILE.get() {
            Some(Some(chosen)) if *chosen == path => Ok(()),
            Some(Some(chosen)) => Err(GlooError::Load(format!(
                "cannot use {}: this process already uses the adapter file {}",
                path.display(),
                chosen.display()
            ))),
            _ => Err(GlooError::Load(format!(
                "cannot use {}: this process already loaded the embedded adapter \
                 (use_adapter_file comes before the first use of the transport)",
                path.display()
            ))),
        },
    }
}

/// The path of the adapter to open: the chosen file, else the embedded
/// adapter written to a private cache directory.
fn adapter_file() -> Result<PathBuf, GlooError> {
    match ADAPTER_FILE.get_or_init(|| None) {
        Some(path) => Ok(path.clone()),
        None => embedded_file(),
    }
}

#[cfg(feature = "embedded-adapter")]
fn embedded_file() -> Result<PathBuf, GlooError> {
    embedded::write()
}

#[cfg(not(feature = "embedded-adapter"))]
fn embedded_file() -> Result<PathBuf, GlooError> {
    Err(GlooError::Load(
        "no adapter file was named: this build has no embedded adapter (feature \
         `embedded-adapter` is off), so compiler_collectives_gloo::use_adapter_file must \
         name the adapter file before the first use of the transport"
            .to_owned(),
    ))
}

fn load() -> Result<Api, GlooError> {
    let path = adapter_file()?;
    let flags = libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND;
    // SAFETY: the file is the adapter this crate's build script compiled (the
    // embedded copy, or the file a package shipped it as and named with
    // `use_adapter_file`); its initialisers are those of a plain C++ shared
    // object linking libgloo.
    let lib = unsafe { libloading::os::unix::Library::open(Some(&path), flags) }.map_err(|e| {
        GlooError::Load(format!(
            "cannot load the Gloo adapter {} ({e}); when the error names libgloo, install \
             Debian's libgloo0 (`sudo apt-get install -y libgloo-dev`)",
            path.display()
        ))
    })?;
    let lib = libloading::Library::from(lib);
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is declared in adapter/ccol_gloo.h with
            // exactly the signature of the field it is stored in.
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| GlooError::Load(format!("adapter lacks {}: {e}", $name)))?;
            *s
        }};
    }
    let abi: unsafe extern "C" fn() -> u32 = sym!("ccol_gloo_abi_version");
    // SAFETY: takes no arguments and returns a constant.
    let version = unsafe { abi() };
    if version != ABI_VERSION {
        return Err(GlooError::Load(format!(
            "adapter ABI {version}, this crate needs {ABI_VERSION}"
        )));
    }
    Ok(Api {
        store_file: sym!("ccol_gloo_store_file"),
        store_hash: sym!("ccol_gloo_store_hash"),
        store_redis: sym!("ccol_gloo_store_redis"),
        store_prefix: sym!("ccol_gloo_store_prefix"),
        store_callbacks: sym!("ccol_gloo_store_callbacks"),
        store_set: sym!("ccol_gloo_store_set"),
        store_get: sym!("ccol_gloo_store_get"),
        store_wait: sym!("ccol_gloo_store_wait"),
        store_free: sym!("ccol_gloo_store_free"),
        context_new: sym!("ccol_gloo_context_new"),
        context_close: sym!("ccol_gloo_context_close"),
        context_free: sym!("ccol_gloo_context_free"),
        buffer_new: sym!("ccol_gloo_buffer_new"),
        buffer_send: sym!("ccol_gloo_buffer_send"),
        buffer_recv: sym!("ccol_gloo_buffer_recv"),
        buffer_wait_recv: sym!("ccol_gloo_buffer_wait_recv"),
        buffer_wait_send: sym!("ccol_gloo_buffer_wait_send"),
        buffer_abort_wait: sym!("ccol_gloo_buffer_abort_wait"),
        buffer_free: sym!("ccol_gloo_buffer_free"),
        path,
        _lib: lib,
    })
}

/// A NUL-terminated copy of `s`.
pub(crate) fn cstring(s: &str, what: &str) -> Result<CString, GlooError> {
    CString::new(s).map_err(|_| GlooError::Invalid(format!("{what} contains a NUL byte")))
}

/// Whole milliseconds of `timeout`, saturating (the adapter takes `int64_t` ms).
pub(crate) fn timeout_ms(timeout: Duration) -> i64 {
    i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)
}

/// Milliseconds until `until`, rounded up (Gloo takes whole milliseconds; a
/// wait must not end before its deadline).
fn ms_until(until: Instant) -> i64 {
    let left = until.saturating_duration_since(Instant::now());
    let ms = left.as_millis() + u128::from(left.subsec_nanos() % 1_000_000 != 0);
    i64::try_from(ms).unwrap_or(i64::MAX)
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

fn rank_arg(rank: u32) -> Result<i32, GlooError> {
    i32::try_from(rank).map_err(|_| GlooError::Invalid("rank out of range".into()))
}

// ---------------------------------------------------------------------------
// Stores
// ---------------------------------------------------------------------------

/// An adapter store handle: a heap object owning a
/// `std::shared_ptr<gloo::rendezvous::Store>` (a prefix store also keeps its
/// parent alive). Freed once, by Drop.
#[derive(Debug)]
pub(crate) struct StoreHandle {
    api: &'static Api,
    ptr: NonNull<c_void>,
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
    fn lock(&self) -> Option<MutexGuard<'_, ()>> {
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
/// `ctx` must be the pointer [`StoreHandle::rust`] put in the vtable (the
/// `Box<Arc<dyn Store>>` it leaked), and the vtable's `drop` (`cb_drop`) must
/// not run on it until the returned reference is gone: the caller picks `'a`
/// no longer than the callback it is in. The adapter guarantees both (see
/// the SAFETY comment in [`StoreHandle::rust`]).
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
unsafe extern "C" fn cb_set(
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
        store.set(&key, value, Deadline::after(Duration::from_secs(300)))
    });
    // SAFETY: `err` is the adapter's writable ccol_gloo_error (this fn's contract).
    unsafe { report(err, result) }
}

/// The vtable's `get`.
///
/// # Safety
/// Called by the adapter only: `ctx` as for [`store_of`], `key`
/// NUL-terminated, `append` callable with `out`, `err` as for [`fill`].
unsafe extern "C" fn cb_get(
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
unsafe extern "C" fn cb_wait(
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

/// The vtable's `drop`: frees the box [`StoreHandle::rust`] leaked.
///
/// # Safety
/// Called by the adapter only, once, with the vtable's `ctx`, after every
/// other callback on it has returned.
unsafe extern "C" fn cb_drop(ctx: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `ctx` is the box made by `Box::into_raw` in
        // `StoreHandle::rust`, freed once, here (this fn's contract).
        drop(unsafe { Box::from_raw(ctx.cast::<Arc<dyn Store>>()) });
    });
}

// ---------------------------------------------------------------------------
// Contexts and buffers
// ---------------------------------------------------------------------------

/// An adapter context handle: a Gloo TCP full-mesh context and its device.
/// Freed once, by Drop (buffers made from it keep Gloo's transport context
/// alive on their own).
#[derive(Debug)]
pub(crate) struct Context {
    api: &'static Api,
    ptr: NonNull<c_void>,
}

// SAFETY: the handle owns its heap object outright; Gloo's context is not
// tied to the thread that made it (its event loop runs on its own thread).
unsafe impl Send for Context {}
// SAFETY: `&Context` allows only `Buffer::new` (createUnboundBuffer reads
// only state fixed at connect) and `close` (closeConnections closes each pair
// under that pair's own mutex), both safe to call concurrently in Gloo's TCP
// transport; GlooTransport also serialises them.
unsafe impl Sync for Context {}

// SAFETY (`free_on_drop!`'s contract): `ptr` came from
// ccol_gloo_context_new (in `connect`) and is freed once, by this Drop;
// every use of it borrowed `self`. ccol_gloo_context_free catches exceptions.
free_on_drop!(Context, context_free);

impl Context {
    /// A full-mesh TCP context of `size` ranks, rendezvousing through `store`
    /// (used only during the call); `hostname` is the address peers connect
    /// to for this rank.
    pub(crate) fn connect(
        store: &StoreHandle,
        rank: i32,
        size: i32,
        hostname: &CStr,
        timeout: Duration,
    ) -> Result<Self, GlooError> {
        let _serial = store.lock();
        let ptr = made("rendezvous", |err| {
            // SAFETY: `store.ptr` is live (borrowed) and used only during the
            // call; `hostname` is NUL-terminated and alive for the call (Gloo
            // copies it); `err` is writable.
            unsafe {
                (store.api.context_new)(
                    store.ptr.as_ptr(),
                    rank,
                    size,
                    hostname.as_ptr(),
                    timeout_ms(timeout),
                    err,
                )
            }
        })?;
        Ok(Context {
            api: store.api,
            ptr,
        })
    }

    /// Closes every connection (peers waiting on this rank see the close).
    pub(crate) fn close(&self) {
        // SAFETY: `ptr` is live (borrowed); closing is idempotent and
        // ccol_gloo_context_close catches exceptions.
        unsafe { (self.api.context_close)(self.ptr.as_ptr()) };
    }
}

/// A Gloo unbound buffer over memory it owns.
///
/// Gloo's event loop writes the memory of a posted receive (within its
/// range: `send`/`recv` check ranges against the memory) until that receive
/// completes, and reads a posted send's range until it completes. The
/// transport touches those bytes only after `wait_recv`/`wait_send` said
/// so, except through [`Buffer::read_volatile`]; after an error, when a
/// transfer may still be in flight, it [`leak`](Buffer::leak)s the buffer
/// instead of freeing memory Gloo may still touch. Dropping frees the Gloo
/// buffer before the memory.
pub(crate) struct Buffer {
    api: &'static Api,
    ptr: NonNull<c_void>,
    mem: Vec<u8>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("len", &self.mem.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: a Gloo unbound buffer may be posted to, waited on and freed from
// any thread (its state is guarded by its own mutex; the event loop
// completes it from Gloo's thread); the memory is an owned `Vec<u8>`.
unsafe impl Send for Buffer {}

// SAFETY (`free_on_drop!`'s contract): `ptr` came from ccol_gloo_buffer_new
// (in `Buffer::new`) and is freed once, by this Drop, before `mem` (fields
// drop after it); every use of it borrowed `self`; ccol_gloo_buffer_free
// catches exceptions. A buffer whose transfers may be in flight is leaked,
// never dropped (type docs).
free_on_drop!(Buffer, buffer_free);

impl Buffer {
    /// An unbound buffer of `ctx` over `mem`.
    pub(crate) fn new(ctx: &Context, mut mem: Vec<u8>) -> Result<Self, GlooError> {
        // Gloo needs a non-null pointer even for zero bytes.
        if mem.capacity() == 0 {
            mem.reserve(1);
        }
        let ptr = made("create buffer", |err| {
            // SAFETY: `ctx.ptr` is live (borrowed). The `mem.len()` bytes at
            // `mem`'s pointer stay valid for the Gloo buffer's whole life: the
            // returned Buffer owns `mem` and never reallocates it, Drop frees
            // the Gloo buffer before `mem`, `leak` keeps both for ever, and
            // `take_bytes` moves the allocation out without freeing it.
            unsafe {
                (ctx.api.buffer_new)(ctx.ptr.as_ptr(), mem.as_mut_ptr().cast(), mem.len(), err)
            }
        })?;
        Ok(Buffer {
            api: ctx.api,
            ptr,
            mem,
        })
    }

    fn in_range(&self, offset: usize, n: usize) -> Result<(), GlooError> {
        match offset.checked_add(n) {
            Some(end) if end <= self.mem.len() => Ok(()),
            _ => Err(GlooError::Invalid(format!(
                "bytes {offset}..+{n} are outside a buffer of {}",
                self.mem.len()
            ))),
        }
    }

    /// Posts, through `entry` (the adapter's `buffer_send` or
    /// `buffer_recv`), a transfer of `n` bytes at `offset` with `peer` on
    /// `slot`.
    fn post(
        &self,
        entry: PostFn,
        what: &str,
        peer: u32,
        slot: u64,
        offset: usize,
        n: usize,
    ) -> Result<(), GlooError> {
        let peer = rank_arg(peer)?;
        self.in_range(offset, n)?;
        checked(what, |err| {
            // SAFETY: `entry` is ccol_gloo_buffer_send or
            // ccol_gloo_buffer_recv (what `send` and `recv`, the only callers,
            // pass), resolved with this signature; `ptr` is live (borrowed);
            // `offset + n` lies within the memory (checked above), so Gloo
            // reads (send) or writes (recv) only there; `err` is writable.
            unsafe { entry(self.ptr.as_ptr(), peer, slot, offset, n, err) }
        })
    }

    /// Posts a send of `n` bytes at `offset` to `dst` on `slot`.
    pub(crate) fn send(
        &self,
        dst: u32,
        slot: u64,
        offset: usize,
        n: usize,
    ) -> Result<(), GlooError> {
        self.post(self.api.buffer_send, "send", dst, slot, offset, n)
    }

    /// Posts a receive of `n` bytes at `offset` from `src` on `slot`.
    pub(crate) fn recv(
        &self,
        src: u32,
        slot: u64,
        offset: usize,
        n: usize,
    ) -> Result<(), GlooError> {
        self.post(self.api.buffer_recv, "recv", src, slot, offset, n)
    }

    /// Waits, through `entry` (the adapter's `buffer_wait_recv` or
    /// `buffer_wait_send`), until `until` for one transfer to complete;
    /// returns its peer.
    fn wait(&self, entry: WaitFn, what: &str, until: Instant) -> Result<i32, GlooError> {
        let mut rank = -1;
        checked(what, |err| {
            // SAFETY: `entry` is ccol_gloo_buffer_wait_recv or
            // ccol_gloo_buffer_wait_send (what `wait_recv` and `wait_send`,
            // the only callers, pass), resolved with this signature; `ptr` is
            // live (borrowed); `rank` and `err` are writable.
            unsafe { entry(self.ptr.as_ptr(), ms_until(until), &mut rank, err) }
        })
        .map(|()| rank)
    }

    /// Waits until `until` for one receive to complete; returns its peer.
    /// Gloo's timeout closes every pair of the context.
    pub(crate) fn wait_recv(&self, until: Instant) -> Result<i32, GlooError> {
        self.wait(self.api.buffer_wait_recv, "wait recv", until)
    }

    /// Waits until `until` for one send to complete.
    pub(crate) fn wait_send(&self, until: Instant) -> Result<(), GlooError> {
        self.wait(self.api.buffer_wait_send, "wait send", until)
            .map(|_peer| ())
    }

    /// The memory (read only after the receives into it completed: type docs).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.mem
    }

    /// The memory, writable (only while no receive into it is in flight).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.mem
    }

    /// Copies `n` bytes at `at` (clamped to the memory) with volatile reads,
    /// byte by byte: for memory Gloo may still be writing, when the copy only
    /// serves to name the ranks whose bytes did not arrive.
    pub(crate) fn read_volatile(&self, at: usize, n: usize) -> Vec<u8> {
        let end = at.saturating_add(n).min(self.mem.len());
        let base = self.mem.as_ptr();
        (at.min(end)..end)
            // SAFETY: `i < mem.len()`, so the read is inside the allocation;
            // volatile, as another thread may be writing the byte.
            .map(|i| unsafe { std::ptr::read_volatile(base.add(i)) })
            .collect()
    }

    /// Moves the memory out (after every transfer on it completed), leaving
    /// an empty buffer: later sends and receives on it are refused as out of
    /// range.
    pub(crate) fn take_bytes(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.mem)
    }

    /// Keeps the Gloo buffer and its memory alive for ever (after an error,
    /// when a transfer may still be in flight).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

/// Lets another thread interrupt a buffer's wait (`ccol_gloo_buffer_abort_wait`)
/// without closing any connection. The target is set only for the span of
/// [`Interrupter::with_target`], which borrows the buffer, so an interrupt
/// never reaches a buffer that has been freed.
#[derive(Debug, Default)]
pub(crate) struct Interrupter {
    target: Mutex<Option<Target>>,
}

#[derive(Debug)]
struct Target {
    api: &'static Api,
    buf: NonNull<c_void>,
    recv: bool,
}

// SAFETY: a Target is only used, under the Interrupter's lock, to call
// ccol_gloo_buffer_abort_wait, which Gloo allows from any thread (it takes
// the buffer's mutex); the buffer is alive while the Target is set
// (`with_target` borrows it and clears the Target before returning).
unsafe impl Send for Target {}

/// Clears the target when `with_target` ends, also on unwind.
struct ClearTarget<'a>(&'a Mutex<Option<Target>>);

impl Drop for ClearTarget<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl Interrupter {
    /// Runs `f` with `buf`'s receive (`recv`) or send wait as the target of
    /// [`Interrupter::interrupt`]; the target is cleared before this returns.
    pub(crate) fn with_target<R>(&self, buf: &Buffer, recv: bool, f: impl FnOnce() -> R) -> R {
        *self.target.lock().unwrap_or_else(PoisonError::into_inner) = Some(Target {
            api: buf.api,
            buf: buf.ptr,
            recv,
        });
        let _clear = ClearTarget(&self.target);
        f()
    }

    /// Interrupts the target's wait in progress (or its next one); the wait
    /// returns [`ABORTED`]. Returns whether a target was set.
    pub(crate) fn interrupt(&self) -> bool {
        let target = self.target.lock().unwrap_or_else(PoisonError::into_inner);
        match &*target {
            Some(t) => {
                // SAFETY: the buffer is alive while it is the target (the
                // lock is held, and `with_target` clears the target under it
                // before its borrow of the buffer ends);
                // ccol_gloo_buffer_abort_wait catches exceptions.
                unsafe { (t.api.buffer_abort_wait)(t.buf.as_ptr(), i32::from(t.recv)) };
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The only test of this process that chooses or loads an adapter (the
    // choice is process-wide).
    #[test]
    fn the_first_adapter_file_named_is_the_one_loaded() {
        use_adapter_file(Path::new("no-such-adapter.so")).expect("the first choice");
        let absolute = std::env::current_dir()
            .expect("cwd")
            .join("no-such-adapter.so");
        assert_eq!(ADAPTER_FILE.get(), Some(&Some(absolute.clone())));
        use_adapter_file(&absolute).expect("the same file again");
        let e = use_adapter_file(Path::new("/elsewhere/adapter.so")).expect_err("another file");
        assert!(
            e.to_string().contains("already uses the adapter file"),
            "{e}"
        );
        // Loaded from that file, not from the embedded copy: its absence is the error.
        let e = api().expect_err("no such file");
        assert!(
            e.to_string().contains(&absolute.display().to_string()),
            "{e}"
        );
    }
}

/// The adapter embedded in this crate (feature `embedded-adapter`), written
/// to a private cache file on first use.
#[cfg(feature = "embedded-adapter")]
mod embedded {
    use crate::GlooError;
    use std::path::{Path, PathBuf};

    static ADAPTER: &[u8] = include_bytes!(env!("CCOL_GLOO_ADAPTER_SO"));

    /// Writes the adapter into the first usable cache directory (see
    /// [`cache_dirs`]); its path.
    ///
    /// # Errors
    /// [`GlooError::Load`] naming each directory and why it was not usable.
    pub(super) fn write() -> Result<PathBuf, GlooError> {
        let mut errors = Vec::new();
        cache_dirs()
            .into_iter()
            .find_map(|d| match write_adapter(&d) {
                Ok(p) => Some(p),
                Err(e) => {
                    errors.push(format!("{}: {e}", d.display()));
                    None
                }
            })
            .ok_or_else(|| {
                GlooError::Load(format!("cannot write the adapter: {}", errors.join("; ")))
            })
    }

    /// Where the adapter is written: the project's cache directories in core's
    /// order ([`compiler_collectives_core::persistence::paths::cache_dirs`]: `$CCOL_CACHE`, else
    /// `$XDG_CACHE_HOME/compiler-collectives`, else `$HOME/.cache/compiler-collectives`),
    /// else `compiler-collectives-<uid>` in the temporary directory. A directory is
    /// used only if this user owns it and nobody else can write it (see [`private_dir`]).
    fn cache_dirs() -> Vec<PathBuf> {
        let mut dirs = compiler_collectives_core::persistence::paths::cache_dirs();
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        dirs.push(std::env::temp_dir().join(format!("compiler-collectives-{uid}")));
        dirs
    }

    /// Creates `dir` (mode 0700) if needed and checks that it is a directory
    /// owned by this user that no other user can write: another user who could
    /// write it could plant a library in it for this process to load.
    ///
    /// # Errors
    /// An I/O error, or `PermissionDenied` naming what is wrong.
    fn private_dir(dir: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let m = std::fs::symlink_metadata(dir)?;
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "not a private directory (owner uid {}, mode {:o}; this process runs as uid {uid}): \
                     the adapter library is only written to and loaded from a directory that no \
                     other user can write",
                    m.uid(),
                    m.mode() & 0o7777
                ),
            ));
        }
        Ok(())
    }

    /// Writes the embedded adapter into `dir` unless an identical file is
    /// already there, and returns its path. A file of that name with other
    /// contents (a stale or planted one) is replaced.
    fn write_adapter(dir: &Path) -> std::io::Result<PathBuf> {
        private_dir(dir)?;
        let digest = xxhash_rust::xxh3::xxh3_64(ADAPTER);
        let path = dir.join(format!("gloo-adapter-{digest:016x}.so"));
        let same = std::fs::symlink_metadata(&path)
            .is_ok_and(|m| m.is_file() && m.len() == ADAPTER.len() as u64)
            && std::fs::read(&path).is_ok_and(|bytes| bytes == ADAPTER);
        if same {
            return Ok(path);
        }
        // Write under a unique name, then rename: concurrent ranks never load a
        // half-written file.
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!(".gloo-adapter-{digest:016x}."))
            .tempfile_in(dir)?;
        std::io::Write::write_all(&mut tmp, ADAPTER)?;
        tmp.persist(&path).map_err(|e| e.error)?;
        Ok(path)
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::os::unix::fs::PermissionsExt;

        #[test]
        fn a_directory_others_can_write_is_refused() {
            let tmp = tempfile::tempdir().expect("tempdir");
            let dir = tmp.path().join("shared");
            std::fs::create_dir(&dir).expect("mkdir");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
            let e = write_adapter(&dir).expect_err("a world-writable directory");
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
            assert!(e.to_string().contains("mode 777"), "{e}");
            assert_eq!(std::fs::read_dir(&dir).expect("list").count(), 0);
        }

        #[test]
        fn a_directory_of_another_user_is_refused() {
            // SAFETY: getuid has no preconditions.
            if unsafe { libc::getuid() } != 0 {
                println!("skipped: only root can give a directory to another user");
                return;
            }
            let tmp = tempfile::tempdir().expect("tempdir");
            let dir = tmp.path().join("theirs");
            std::fs::create_dir(&dir).expect("mkdir");
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            let e = write_adapter(&dir).expect_err("another user's directory");
            assert!(e.to_string().contains("owner uid 65534"), "{e}");
        }

        #[test]
        fn a_planted_file_of_the_right_size_is_replaced() {
            let tmp = tempfile::tempdir().expect("tempdir");
            let dir = tmp.path().join("cache");
            let digest = xxhash_rust::xxh3::xxh3_64(ADAPTER);
            std::fs::create_dir(&dir).expect("mkdir");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
            let planted = dir.join(format!("gloo-adapter-{digest:016x}.so"));
            std::fs::write(&planted, vec![0u8; ADAPTER.len()]).expect("plant");
            let path = write_adapter(&dir).expect("write");
            assert_eq!(path, planted);
            assert!(std::fs::read(&path).expect("read") == ADAPTER);
        }
    }
}
