//! # compiler-collectives-tch
//!
//! libtorch's c10d process groups for tch-rs programs, and a compiler-collectives
//! [`Transport`] over them, so that compiler collectives run over the same
//! process-group machinery a training program uses.
//!
//! | item | what |
//! |---|---|
//! | [`C10dStore`] | c10d's `TCPStore` (server or client) and `PrefixStore`; a core [`Store`] |
//! | [`C10dProcessGroup`] | c10d's `ProcessGroupGloo`: all_gather, all_reduce, broadcast, barrier on [`tch::Tensor`], each with a timeout |
//! | [`C10dTransport`] | core's [`Transport`] over a process group: variable-length all_gather as a lengths round then a padded round |
//! | [`from_env`] | a group from torchrun's environment |
//! | [`observe`] | a tensor's sizes and strides as an [`Observation`] |
//!
//! `ProcessGroupNCCL` is not built into this crate's shim: it needs CUDA and
//! NCCL headers at build time and a GPU at run time, so
//! [`C10dProcessGroup::nccl`] returns [`C10dError::Unsupported`]; GPU jobs use
//! the `compiler-collectives-nccl` crate.
//!
//! Build requirement: libtorch 2.13.0 (`eval "$(scripts/setup-torch.sh)"`
//! exports `LIBTORCH`).

use compiler_collectives_core::shapes::Observation;
use compiler_collectives_core::{Deadline, DecodeError, Error, Store, Transport};
use std::ffi::{c_char, c_void, CString};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};

mod sys {
    use std::ffi::{c_char, c_void};

    pub(crate) const OK: i32 = 0;
    pub(crate) const TIMEOUT: i32 = 1;
    pub(crate) const INVALID: i32 = 3;
    pub(crate) const UNSUPPORTED: i32 = 5;
    pub(crate) const NETWORK: i32 = 6;

    #[repr(C)]
    pub(crate) struct RawError {
        pub(crate) status: i32,
        pub(crate) message: [c_char; 2048],
    }

    pub(crate) type AppendFn = unsafe extern "C" fn(*mut c_void, *const u8, usize);

    extern "C" {
        pub(crate) fn ccol_c10d_tcpstore_new(
            host: *const c_char,
            port: u16,
            world: i32,
            is_server: i32,
            wait_workers: i32,
            timeout_ms: i64,
            err: *mut RawError,
        ) -> *mut c_void;
        pub(crate) fn ccol_c10d_tcpstore_port(store: *mut c_void, err: *mut RawError) -> i32;
        pub(crate) fn ccol_c10d_prefixstore_new(
            prefix: *const c_char,
            store: *mut c_void,
            err: *mut RawError,
        ) -> *mut c_void;
        pub(crate) fn ccol_c10d_store_set(
            s: *mut c_void,
            key: *const c_char,
            data: *const u8,
            len: usize,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_store_get(
            s: *mut c_void,
            key: *const c_char,
            timeout_ms: i64,
            out: *mut c_void,
            append: AppendFn,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_store_add(
            s: *mut c_void,
            key: *const c_char,
            delta: i64,
            result: *mut i64,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_store_wait(
            s: *mut c_void,
            keys: *const *const c_char,
            n: usize,
            timeout_ms: i64,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_store_check(
            s: *mut c_void,
            keys: *const *const c_char,
            n: usize,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_store_delete(
            s: *mut c_void,
            key: *const c_char,
            existed: *mut i32,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_store_free(s: *mut c_void);
        pub(crate) fn ccol_c10d_pg_gloo_new(
            store: *mut c_void,
            rank: i32,
            size: i32,
            hostname: *const c_char,
            timeout_ms: i64,
            err: *mut RawError,
        ) -> *mut c_void;
        pub(crate) fn ccol_c10d_pg_nccl_new(
            store: *mut c_void,
            rank: i32,
            size: i32,
            timeout_ms: i64,
            err: *mut RawError,
        ) -> *mut c_void;
        pub(crate) fn ccol_c10d_pg_free(pg: *mut c_void);
        pub(crate) fn ccol_c10d_pg_allgather(
            pg: *mut c_void,
            input: *mut c_void,
            timeout_ms: i64,
            outputs: *mut *mut c_void,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_pg_allreduce(
            pg: *mut c_void,
            t: *mut c_void,
            op: i32,
            timeout_ms: i64,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_pg_broadcast(
            pg: *mut c_void,
            t: *mut c_void,
            root: i32,
            timeout_ms: i64,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_pg_barrier(
            pg: *mut c_void,
            timeout_ms: i64,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_pg_send(
            pg: *mut c_void,
            t: *mut c_void,
            dst: i32,
            tag: i32,
            timeout_ms: i64,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_pg_recv(
            pg: *mut c_void,
            t: *mut c_void,
            src: i32,
            tag: i32,
            timeout_ms: i64,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_pg_isend(
            pg: *mut c_void,
            t: *mut c_void,
            dst: i32,
            tag: i32,
            err: *mut RawError,
        ) -> *mut c_void;
        pub(crate) fn ccol_c10d_work_done(work: *mut c_void) -> i32;
        pub(crate) fn ccol_c10d_work_wait(
            work: *mut c_void,
            timeout_ms: i64,
            err: *mut RawError,
        ) -> i32;
        pub(crate) fn ccol_c10d_work_free(work: *mut c_void);
        pub(crate) fn ccol_c10d_pg_rank(pg: *mut c_void) -> i32;
        pub(crate) fn ccol_c10d_pg_size(pg: *mut c_void) -> i32;
    }
}

use sys::RawError;

/// Errors of the c10d backend, with libtorch's original text. Converted into
/// core's [`Error`] (timeouts into `Timeout`, the rest into `Backend`).
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum C10dError {
    /// libtorch raised an exception (`c10::DistError` and friends).
    #[error("c10d {operation} failed{}: {message}", if *timeout { " (timeout)" } else { "" })]
    Torch {
        /// What was being done.
        operation: String,
        /// Whether libtorch reported a timeout.
        timeout: bool,
        /// Whether it was a network error (a peer's connection broke).
        network: bool,
        /// libtorch's message, without its C++ backtrace.
        message: String,
    },
    /// The operation is not available in this build (e.g. ProcessGroupNCCL).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An argument was rejected before reaching libtorch.
    #[error("{0}")]
    Invalid(String),
}

impl RawError {
    fn new() -> Self {
        RawError {
            status: 0,
            message: [0; 2048],
        }
    }

    fn text(&self) -> String {
        let bytes: Vec<u8> = self
            .message
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c.to_ne_bytes()[0])
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn into_error(self, status: i32, operation: &str) -> C10dError {
        match status {
            sys::UNSUPPORTED => C10dError::Unsupported(self.text()),
            sys::INVALID => C10dError::Invalid(self.text()),
            _ => C10dError::Torch {
                operation: operation.to_owned(),
                timeout: status == sys::TIMEOUT,
                network: status == sys::NETWORK,
                message: self.text(),
            },
        }
    }
}

fn check(status: i32, err: RawError, operation: &str) -> Result<(), C10dError> {
    if status == sys::OK {
        Ok(())
    } else {
        Err(err.into_error(status, operation))
    }
}

fn cstr(s: &str, what: &str) -> Result<CString, C10dError> {
    CString::new(s).map_err(|_| C10dError::Invalid(format!("{what} contains a NUL byte")))
}

fn ms(d: Duration) -> i64 {
    let ms = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 != 0);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

impl From<C10dError> for Error {
    fn from(e: C10dError) -> Self {
        match e {
            C10dError::Torch { timeout: true, .. } => {
                tracing::debug!(error = %e, "c10d timeout");
                Error::Timeout {
                    missing_ranks: Vec::new(),
                    waited: Duration::ZERO,
                    during: None,
                }
            }
            C10dError::Invalid(m) => Error::InvalidArgument(m),
            C10dError::Unsupported(m) => Error::Unsupported(m),
            other => Error::Backend {
                backend: "c10d",
                message: other.to_string(),
                source: Some(Box::new(other)),
            },
        }
    }
}

unsafe extern "C" fn append_to_vec(out: *mut c_void, data: *const u8, len: usize) {
    let _ = std::panic::catch_unwind(|| {
        if out.is_null() || (data.is_null() && len > 0) {
            return;
        }
        // SAFETY: `out` is the Vec<u8> passed by `C10dStore::get`.
        let v = unsafe { &mut *out.cast::<Vec<u8>>() };
        if len > 0 {
            // SAFETY: the shim passes `len` readable bytes.
            v.extend_from_slice(unsafe { std::slice::from_raw_parts(data, len) });
        }
    });
}

/// A c10d store handle (`TCPStore` or `PrefixStore`).
#[derive(Debug)]
pub struct C10dStore(NonNull<c_void>);

// SAFETY: c10d stores are used concurrently by c10d itself (the process
// group's threads); TCPStore serialises its client socket internally.
unsafe impl Send for C10dStore {}
// SAFETY: as for Send.
unsafe impl Sync for C10dStore {}

impl Drop for C10dStore {
    fn drop(&mut self) {
        // SAFETY: the handle came from the shim and is freed once.
        unsafe { sys::ccol_c10d_store_free(self.0.as_ptr()) };
    }
}

impl C10dStore {
    /// c10d's `TCPStore` at `host:port`: the server (and a client of it) when
    /// `is_server`, else only a client. With `wait_workers`, every store
    /// counts itself in and the server waits until `world_size` have (as
    /// Python's `init_process_group` does: a client that does not count
    /// itself in leaves such a server waiting).
    ///
    /// # Errors
    /// [`C10dError`] with libtorch's text (connect timeouts included).
    pub fn tcp(
        host: &str,
        port: u16,
        world_size: u32,
        is_server: bool,
        wait_workers: bool,
        timeout: Duration,
    ) -> Result<Self, C10dError> {
        let h = cstr(host, "host")?;
        let world =
            i32::try_from(world_size).map_err(|_| C10dError::Invalid("world too large".into()))?;
        let mut err = RawError::new();
        // SAFETY: `h` is NUL-terminated and outlives the call; `err` is writable.
        let p = unsafe {
            sys::ccol_c10d_tcpstore_new(
                h.as_ptr(),
                port,
                world,
                i32::from(is_server),
                i32::from(wait_workers),
                ms(timeout),
                &mut err,
            )
        };
        NonNull::new(p).map(C10dStore).ok_or_else(|| {
            let s = err.status;
            err.into_error(s, "TCPStore")
        })
    }

    /// The port of this `TCPStore`: the one a server bound (port 0 in
    /// [`C10dStore::tcp`] lets the system pick a free one, which a test or
    /// launcher then publishes to the clients), or the one a client
    /// connected to.
    ///
    /// # Errors
    /// [`C10dError::Invalid`] for a store that is not a `TCPStore` (a
    /// prefixed one).
    pub fn port(&self) -> Result<u16, C10dError> {
        let mut err = RawError::new();
        // SAFETY: the handle is live; `err` is writable for the call.
        let p = unsafe { sys::ccol_c10d_tcpstore_port(self.0.as_ptr(), &mut err) };
        match u16::try_from(p) {
            Ok(port) if p >= 0 => Ok(port),
            _ => {
                let status = err.status;
                Err(err.into_error(status, "TCPStore port"))
            }
        }
    }

    /// Whether `key` is set, without waiting.
    ///
    /// # Errors
    /// [`C10dError`].
    pub fn check(&self, key: &str) -> Result<bool, C10dError> {
        let k = cstr(key, "key")?;
        let ptrs = [k.as_ptr()];
        let mut err = RawError::new();
        // SAFETY: handle live; `ptrs` points at `k`, both outlive the call.
        let s = unsafe { sys::ccol_c10d_store_check(self.0.as_ptr(), ptrs.as_ptr(), 1, &mut err) };
        match s {
            1 => Ok(true),
            0 => Ok(false),
            _ => {
                let status = err.status;
                Err(err.into_error(status, "store check"))
            }
        }
    }

    /// A `PrefixStore` over this store: key `k` is stored as `prefix/k`.
    ///
    /// # Errors
    /// [`C10dError`].
    pub fn prefixed(&self, prefix: &str) -> Result<Self, C10dError> {
        let p = cstr(prefix, "prefix")?;
        let mut err = RawError::new();
        // SAFETY: the parent handle is live; the shim shares ownership of it.
        let h = unsafe { sys::ccol_c10d_prefixstore_new(p.as_ptr(), self.0.as_ptr(), &mut err) };
        NonNull::new(h).map(C10dStore).ok_or_else(|| {
            let s = err.status;
            err.into_error(s, "PrefixStore")
        })
    }
}

fn store_err(e: C10dError) -> Error {
    e.into()
}

impl Store for C10dStore {
    fn set(
        &self,
        key: &str,
        value: &[u8],
        _deadline: Deadline,
    ) -> compiler_collectives_core::Result<()> {
        let k = cstr(key, "key").map_err(store_err)?;
        let mut err = RawError::new();
        // SAFETY: handle live; `k` and `value` outlive the call.
        let s = unsafe {
            sys::ccol_c10d_store_set(
                self.0.as_ptr(),
                k.as_ptr(),
                value.as_ptr(),
                value.len(),
                &mut err,
            )
        };
        check(s, err, "store set").map_err(store_err)
    }

    fn get(&self, key: &str, deadline: Deadline) -> compiler_collectives_core::Result<Vec<u8>> {
        let k = cstr(key, "key").map_err(store_err)?;
        let mut out: Vec<u8> = Vec::new();
        let mut err = RawError::new();
        // SAFETY: handle live; `out` is a live Vec<u8> matching `append_to_vec`.
        let s = unsafe {
            sys::ccol_c10d_store_get(
                self.0.as_ptr(),
                k.as_ptr(),
                ms(deadline.remaining()),
                std::ptr::from_mut(&mut out).cast(),
                append_to_vec,
                &mut err,
            )
        };
        check(s, err, "store get").map_err(store_err)?;
        Ok(out)
    }

    fn add(
        &self,
        key: &str,
        delta: i64,
        _deadline: Deadline,
    ) -> compiler_collectives_core::Result<i64> {
        let k = cstr(key, "key").map_err(store_err)?;
        let mut result = 0i64;
        let mut err = RawError::new();
        // SAFETY: handle live; `result` writable.
        let s = unsafe {
            sys::ccol_c10d_store_add(self.0.as_ptr(), k.as_ptr(), delta, &mut result, &mut err)
        };
        check(s, err, "store add").map_err(store_err)?;
        Ok(result)
    }

    fn wait(&self, keys: &[&str], deadline: Deadline) -> compiler_collectives_core::Result<()> {
        let owned = keys
            .iter()
            .map(|k| cstr(k, "key"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(store_err)?;
        let ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        let mut err = RawError::new();
        // SAFETY: handle live; `ptrs` points into `owned`, both outlive the call.
        let s = unsafe {
            sys::ccol_c10d_store_wait(
                self.0.as_ptr(),
                ptrs.as_ptr(),
                ptrs.len(),
                ms(deadline.remaining()),
                &mut err,
            )
        };
        check(s, err, "store wait").map_err(store_err)
    }

    fn delete(&self, key: &str, _deadline: Deadline) -> compiler_collectives_core::Result<bool> {
        let k = cstr(key, "key").map_err(store_err)?;
        let mut existed = 0i32;
        let mut err = RawError::new();
        // SAFETY: handle live; `existed` writable.
        let s = unsafe {
            sys::ccol_c10d_store_delete(self.0.as_ptr(), k.as_ptr(), &mut existed, &mut err)
        };
        check(s, err, "store delete").map_err(store_err)?;
        Ok(existed != 0)
    }
}

/// Reduction of [`C10dProcessGroup::all_reduce`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Product,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

/// A c10d `ProcessGroupGloo` (CPU tensors).
#[derive(Debug)]
pub struct C10dProcessGroup {
    pg: NonNull<c_void>,
    rank: u32,
    world: u32,
}

// SAFETY: c10d process groups are used from many threads by PyTorch itself;
// calls enqueue work on the group's own threads.
unsafe impl Send for C10dProcessGroup {}
// SAFETY: as for Send.
unsafe impl Sync for C10dProcessGroup {}

impl Drop for C10dProcessGroup {
    fn drop(&mut self) {
        // SAFETY: handle from the shim, freed once.
        unsafe { sys::ccol_c10d_pg_free(self.pg.as_ptr()) };
    }
}

fn tensor_ptr(t: &Tensor) -> *mut c_void {
    t.as_ptr().cast_mut().cast()
}

impl C10dProcessGroup {
    /// Joins a `ProcessGroupGloo` of `world_size` ranks through `store`;
    /// `hostname` is the address peers reach this rank at.
    ///
    /// # Errors
    /// [`C10dError`] with libtorch's text (rendezvous timeouts included).
    pub fn gloo(
        store: &C10dStore,
        rank: u32,
        world_size: u32,
        hostname: &str,
        timeout: Duration,
    ) -> Result<Self, C10dError> {
        let h = cstr(hostname, "hostname")?;
        let r = i32::try_from(rank).map_err(|_| C10dError::Invalid("rank too large".into()))?;
        let w =
            i32::try_from(world_size).map_err(|_| C10dError::Invalid("world too large".into()))?;
        let mut err = RawError::new();
        // SAFETY: the store is live; `h` outlives the call.
        let p = unsafe {
            sys::ccol_c10d_pg_gloo_new(store.0.as_ptr(), r, w, h.as_ptr(), ms(timeout), &mut err)
        };
        let pg = NonNull::new(p).ok_or_else(|| {
            let s = err.status;
            err.into_error(s, "ProcessGroupGloo")
        })?;
        Ok(C10dProcessGroup {
            pg,
            rank,
            world: world_size,
        })
    }

    /// `ProcessGroupNCCL`: not built into this shim (see the crate docs).
    ///
    /// # Errors
    /// Always [`C10dError::Unsupported`] with what is needed instead.
    pub fn nccl(
        store: &C10dStore,
        rank: u32,
        world_size: u32,
        timeout: Duration,
    ) -> Result<Self, C10dError> {
        let r = i32::try_from(rank).map_err(|_| C10dError::Invalid("rank too large".into()))?;
        let w =
            i32::try_from(world_size).map_err(|_| C10dError::Invalid("world too large".into()))?;
        let mut err = RawError::new();
        // SAFETY: the store is live.
        let p =
            unsafe { sys::ccol_c10d_pg_nccl_new(store.0.as_ptr(), r, w, ms(timeout), &mut err) };
        let pg = NonNull::new(p).ok_or_else(|| {
            let s = err.status;
            err.into_error(s, "ProcessGroupNCCL")
        })?;
        Ok(C10dProcessGroup {
            pg,
            rank,
            world: world_size,
        })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        // SAFETY: the handle is live.
        u32::try_from(unsafe { sys::ccol_c10d_pg_rank(self.pg.as_ptr()) }).unwrap_or(self.rank)
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        // SAFETY: the handle is live.
        u32::try_from(unsafe { sys::ccol_c10d_pg_size(self.pg.as_ptr()) }).unwrap_or(self.world)
    }

    /// Gathers `tensor` (same shape and kind on every rank) from every rank:
    /// `world_size` new tensors, index = rank.
    ///
    /// Cost: one c10d allgather.
    ///
    /// # Errors
    /// [`C10dError`]; a timeout when a rank does not join by `timeout`.
    pub fn all_gather(&self, tensor: &Tensor, timeout: Duration) -> Result<Vec<Tensor>, C10dError> {
        let t = tensor.contiguous();
        let mut outs: Vec<*mut c_void> = vec![std::ptr::null_mut(); self.world as usize];
        let mut err = RawError::new();
        // SAFETY: the group and tensor are live; `outs` has room for world_size pointers.
        let s = unsafe {
            sys::ccol_c10d_pg_allgather(
                self.pg.as_ptr(),
                tensor_ptr(&t),
                ms(timeout),
                outs.as_mut_ptr(),
                &mut err,
            )
        };
        check(s, err, "allgather")?;
        Ok(outs
            .into_iter()
            // SAFETY: each pointer is a new at::Tensor the shim allocated for us.
            .map(|p| unsafe { Tensor::from_ptr(p.cast()) })
            .collect())
    }

    /// Reduces `tensor` in place across every rank.
    ///
    /// Cost: one c10d allreduce.
    ///
    /// # Errors
    /// [`C10dError`].
    pub fn all_reduce(
        &self,
        tensor: &mut Tensor,
        op: ReduceOp,
        timeout: Duration,
    ) -> Result<(), C10dError> {
        let code = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Product => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
        };
        let mut err = RawError::new();
        // SAFETY: the group and tensor are live.
        let s = unsafe {
            sys::ccol_c10d_pg_allreduce(
                self.pg.as_ptr(),
                tensor_ptr(tensor),
                code,
                ms(timeout),
                &mut err,
            )
        };
        check(s, err, "allreduce")
    }

    /// Broadcasts `tensor` from `root` in place.
    ///
    /// # Errors
    /// [`C10dError`].
    pub fn broadcast(
        &self,
        tensor: &mut Tensor,
        root: u32,
        timeout: Duration,
    ) -> Result<(), C10dError> {
        let r = i32::try_from(root).map_err(|_| C10dError::Invalid("root too large".into()))?;
        let mut err = RawError::new();
        // SAFETY: the group and tensor are live.
        let s = unsafe {
            sys::ccol_c10d_pg_broadcast(
                self.pg.as_ptr(),
                tensor_ptr(tensor),
                r,
                ms(timeout),
                &mut err,
            )
        };
        check(s, err, "broadcast")
    }

    /// Waits for every rank.
    ///
    /// # Errors
    /// [`C10dError`].
    pub fn barrier(&self, timeout: Duration) -> Result<(), C10dError> {
        let mut err = RawError::new();
        // SAFETY: the group is live.
        let s = unsafe { sys::ccol_c10d_pg_barrier(self.pg.as_ptr(), ms(timeout), &mut err) };
        check(s, err, "barrier")
    }

    /// Sends `tensor` to `dst` under `tag` (blocks until it is taken).
    ///
    /// # Errors
    /// [`C10dError`].
    pub fn send(
        &self,
        tensor: &Tensor,
        dst: u32,
        tag: u32,
        timeout: Duration,
    ) -> Result<(), C10dError> {
        let t = tensor.contiguous();
        let (d, g) = (i32::try_from(dst), i32::try_from(tag));
        let (Ok(d), Ok(g)) = (d, g) else {
            return Err(C10dError::Invalid("rank or tag too large".into()));
        };
        let mut err = RawError::new();
        // SAFETY: the group and tensor are live.
        let s = unsafe {
            sys::ccol_c10d_pg_send(
                self.pg.as_ptr(),
                tensor_ptr(&t),
                d,
                g,
                ms(timeout),
                &mut err,
            )
        };
        check(s, err, "send")
    }

    /// Receives into `tensor` from `src` under `tag`.
    ///
    /// # Errors
    /// [`C10dError`].
    pub fn recv(
        &self,
        tensor: &mut Tensor,
        src: u32,
        tag: u32,
        timeout: Duration,
    ) -> Result<(), C10dError> {
        let (s_, g) = (i32::try_from(src), i32::try_from(tag));
        let (Ok(s_), Ok(g)) = (s_, g) else {
            return Err(C10dError::Invalid("rank or tag too large".into()));
        };
        let mut err = RawError::new();
        // SAFETY: the group and tensor are live.
        let s = unsafe {
            sys::ccol_c10d_pg_recv(
                self.pg.as_ptr(),
                tensor_ptr(tensor),
                s_,
                g,
                ms(timeout),
                &mut err,
            )
        };
        check(s, err, "recv")
    }
}

/// A send in flight (c10d `Work`), freed on drop.
#[derive(Debug)]
struct PendingSend(NonNull<c_void>);

// SAFETY: c10d work objects are completed by the group's threads and may be
// polled or waited from any thread.
unsafe impl Send for PendingSend {}

impl PendingSend {
    /// 1 finished, 0 running, -1 failed.
    fn done(&self) -> i32 {
        // SAFETY: the handle is live.
        unsafe { sys::ccol_c10d_work_done(self.0.as_ptr()) }
    }

    fn wait(&self, timeout: Duration) -> Result<(), C10dError> {
        let mut err = RawError::new();
        // SAFETY: the handle is live.
        let s = unsafe { sys::ccol_c10d_work_wait(self.0.as_ptr(), ms(timeout), &mut err) };
        check(s, err, "send")
    }
}

impl Drop for PendingSend {
    fn drop(&mut self) {
        // SAFETY: handle from the shim, freed once.
        unsafe { sys::ccol_c10d_work_free(self.0.as_ptr()) };
    }
}

impl C10dProcessGroup {
    /// Starts sending `tensor` to `dst` under `tag` without waiting for the
    /// receiver (a ring of sends then receives must not deadlock).
    fn isend(&self, tensor: &Tensor, dst: u32, tag: u32) -> Result<PendingSend, C10dError> {
        let (Ok(d), Ok(g)) = (i32::try_from(dst), i32::try_from(tag)) else {
            return Err(C10dError::Invalid("rank or tag too large".into()));
        };
        let mut err = RawError::new();
        // SAFETY: the group and tensor are live; the work handle keeps its own reference.
        let p = unsafe {
            sys::ccol_c10d_pg_isend(self.pg.as_ptr(), tensor_ptr(tensor), d, g, &mut err)
        };
        NonNull::new(p).map(PendingSend).ok_or_else(|| {
            let s = err.status;
            err.into_error(s, "send")
        })
    }
}

/// How long a failed rank, once a single rank is left silent, waits for it
/// to check in before naming it. Short: every survivor's error must arrive
/// within the deadline + 1 s, and at a timeout the window comes after it.
pub const POST_MORTEM: Duration = Duration::from_millis(250);

/// How long a failed rank may take to record its own check-in.
const CHECK_IN_LIMIT: Duration = Duration::from_millis(500);

/// How long after an operation's deadline a failed rank still waits for
/// peers to check in (peers started the operation a little later).
const LATE_CHECK_IN: Duration = Duration::from_millis(900);

/// How long `shutdown` and drop wait for peers to take this rank's sends.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// A tensor's sizes and strides (in elements) as an [`Observation`].
pub fn observe(t: &Tensor) -> Observation {
    let to_u64 = |v: Vec<i64>| {
        v.into_iter()
            .map(|x| u64::try_from(x).unwrap_or(0))
            .collect::<Vec<u64>>()
    };
    Observation::strided(to_u64(t.size()), to_u64(t.stride()))
}

/// core's [`Transport`] over a [`C10dProcessGroup`]: byte strings travel as
/// uint8 tensors; a variable-length all_gather is a lengths round (one int64
/// per rank) then a round padded to the longest.
///
/// c10d cannot tell which rank a timeout waited for, nor which peer a broken
/// connection belonged to. After a failed collective this transport finds out
/// through the store: every rank that failed sets `postmortem/<rank>`,
/// and until the operation's deadline plus [`POST_MORTEM`] the failing rank
/// collects the others' keys (stopping early when a single rank stayed
/// silent for the window);
/// ranks that set none are named (missing on a timeout, lost on a network
/// error).
/// The store is touched only after a failure. A rank that shuts down cannot
/// interrupt peers blocked in c10d; they fail at their deadline.
#[derive(Debug)]
pub struct C10dTransport {
    pg: C10dProcessGroup,
    lock: Mutex<bool>,
    pending: Mutex<Vec<PendingSend>>,
    /// Keeps the store alive as long as the group.
    _store: C10dStore,
}

impl C10dTransport {
    /// A transport over `pg`, keeping `store` alive with it.
    pub fn new(pg: C10dProcessGroup, store: C10dStore) -> Self {
        C10dTransport {
            pg,
            lock: Mutex::new(false),
            pending: Mutex::new(Vec::new()),
            _store: store,
        }
    }

    /// The process group underneath.
    pub fn group(&self) -> &C10dProcessGroup {
        &self.pg
    }

    /// Frees the sends their receivers have taken.
    fn reap(&self) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|w| w.done() == 0);
    }

    /// Waits (at most [`DRAIN_LIMIT`] in all) for peers to take the sends
    /// still in flight.
    fn drain(&self) {
        let until = Instant::now() + DRAIN_LIMIT;
        for w in self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || w.wait(left).is_err() {
                break;
            }
        }
    }

    /// Turns a failed operation into core's error, naming the ranks that did
    /// not check in after it (see the type's docs).
    fn failed(&self, start: Instant, deadline: Deadline, e: C10dError) -> Error {
        let network = matches!(e, C10dError::Torch { network: true, .. });
        let timeout = matches!(e, C10dError::Torch { timeout: true, .. });
        if !(network || timeout) {
            return e.into();
        }
        // Ranks may fail in different operations (one in a lengths round,
        // another in the padded round), and a transport fails only once: the
        // key is per rank, not per operation.
        let me = self.pg.rank;
        let key = |r: u32| format!("postmortem/{r}");
        // Live peers check in when they fail too: at once after a broken
        // connection, at the latest at this operation's deadline (they may be
        // blocked on a rank that is itself reporting). Wait for them until
        // then, plus the post-mortem window.
        let until = Instant::now().max(deadline.instant()) + LATE_CHECK_IN;
        let mut silent: Vec<u32> = (0..self.pg.world).filter(|&r| r != me).collect();
        if self
            ._store
            .set(&key(me), b"", Deadline::after(CHECK_IN_LIMIT))
            .is_ok()
        {
            // One silent rank, quiet for the post-mortem window, is the usual
            // single failure: stop there. Several silent ranks may include
            // live ones blocked until their deadline: wait for them.
            let mut changed = Instant::now();
            while !silent.is_empty() && Instant::now() < until {
                let before = silent.len();
                silent.retain(|&r| !self._store.check(&key(r)).unwrap_or(false));
                if silent.len() != before {
                    changed = Instant::now();
                }
                if silent.len() == 1 && changed.elapsed() >= POST_MORTEM {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        tracing::debug!(error = %e, ?silent, "c10d operation failed");
        if network && !silent.is_empty() {
            Error::PeerLost {
                ranks: silent,
                reason: compiler_collectives_core::PeerLoss::Disconnected,
                detail: e.to_string(),
                during: None,
            }
        } else if timeout {
            Error::Timeout {
                missing_ranks: silent,
                waited: start.elapsed(),
                during: None,
            }
        } else {
            e.into()
        }
    }

    fn guard(&self) -> compiler_collectives_core::Result<std::sync::MutexGuard<'_, bool>> {
        self.reap();
        let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if *g {
            return Err(Error::InvalidArgument(
                "this c10d transport is shut down".into(),
            ));
        }
        Ok(g)
    }
}

fn bytes_of(t: &Tensor) -> Vec<u8> {
    let n = t.numel();
    let mut out = vec![0u8; n];
    t.copy_data(&mut out, n);
    out
}

fn as_i64(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}

impl Transport for C10dTransport {
    fn rank(&self) -> u32 {
        self.pg.rank
    }

    fn world_size(&self) -> u32 {
        self.pg.world
    }

    fn backend(&self) -> &'static str {
        "c10d"
    }

    fn all_gather(
        &self,
        data: &[u8],
        max_bytes: usize,
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<Vec<Vec<u8>>> {
        if data.len() > max_bytes {
            return Err(Error::InvalidArgument(format!(
                "all_gather of {} bytes exceeds max_bytes {max_bytes}",
                data.len()
            )));
        }
        let _g = self.guard()?;
        let start = Instant::now();
        let lens = self
            .pg
            .all_gather(
                &Tensor::from_slice(&[as_i64(data.len())]),
                deadline.remaining(),
            )
            .map_err(|e| self.failed(start, deadline, e))?;
        let mut sizes = Vec::with_capacity(lens.len());
        for (r, t) in (0u32..).zip(&lens) {
            let n = t.int64_value(&[0]);
            let n = usize::try_from(n).map_err(|_| Error::Decode {
                rank: Some(r),
                source: DecodeError::Invalid {
                    field: "length",
                    detail: format!("{n}"),
                },
            })?;
            if n > max_bytes {
                return Err(Error::message_too_large(r, n, max_bytes));
            }
            sizes.push(n);
        }
        let longest = sizes.iter().copied().max().unwrap_or(0);
        if longest == 0 {
            return Ok(vec![Vec::new(); sizes.len()]);
        }
        let mut padded = data.to_vec();
        padded.resize(longest, 0);
        let parts = self
            .pg
            .all_gather(&Tensor::from_slice(&padded), deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))?;
        Ok(parts
            .iter()
            .zip(&sizes)
            .map(|(t, &n)| {
                let mut b = bytes_of(t);
                b.truncate(n);
                b
            })
            .collect())
    }

    fn all_gather_fixed(
        &self,
        data: &[u8],
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        let _g = self.guard()?;
        let start = Instant::now();
        let parts = self
            .pg
            .all_gather(&Tensor::from_slice(data), deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))?;
        Ok(parts.iter().flat_map(bytes_of).collect())
    }

    fn broadcast(
        &self,
        data: &[u8],
        root: u32,
        max_bytes: usize,
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        if root >= self.pg.world {
            return Err(Error::InvalidArgument(format!(
                "broadcast root {root} is not a rank"
            )));
        }
        let _g = self.guard()?;
        let start = Instant::now();
        let mine = if root == self.pg.rank { data } else { &[] };
        let mut len = Tensor::from_slice(&[as_i64(mine.len())]);
        self.pg
            .broadcast(&mut len, root, deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))?;
        let n = usize::try_from(len.int64_value(&[0])).unwrap_or(usize::MAX);
        if n > max_bytes {
            return Err(Error::message_too_large(root, n, max_bytes));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut body = if root == self.pg.rank {
            Tensor::from_slice(mine)
        } else {
            Tensor::zeros([as_i64(n)], (Kind::Uint8, tch::Device::Cpu))
        };
        self.pg
            .broadcast(&mut body, root, deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))?;
        Ok(bytes_of(&body))
    }

    fn barrier(&self, deadline: Deadline) -> compiler_collectives_core::Result<()> {
        let _g = self.guard()?;
        let start = Instant::now();
        self.pg
            .barrier(deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))
    }

    fn send(
        &self,
        peer: u32,
        tag: u32,
        data: &[u8],
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<()> {
        if peer >= self.pg.world || peer == self.pg.rank {
            return Err(Error::InvalidArgument(format!(
                "peer {peer} is not another rank"
            )));
        }
        let _g = self.guard()?;
        let _ = deadline;
        let len = self
            .pg
            .isend(&Tensor::from_slice(&[as_i64(data.len())]), peer, tag)?;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.push(len);
        if !data.is_empty() {
            pending.push(self.pg.isend(&Tensor::from_slice(data), peer, tag)?);
        }
        Ok(())
    }

    fn recv(
        &self,
        peer: u32,
        tag: u32,
        max_bytes: usize,
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        if peer >= self.pg.world || peer == self.pg.rank {
            return Err(Error::InvalidArgument(format!(
                "peer {peer} is not another rank"
            )));
        }
        let _g = self.guard()?;
        let start = Instant::now();
        let mut len = Tensor::zeros([1], (Kind::Int64, tch::Device::Cpu));
        self.pg
            .recv(&mut len, peer, tag, deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))?;
        let n = usize::try_from(len.int64_value(&[0])).unwrap_or(usize::MAX);
        if n > max_bytes {
            return Err(Error::message_too_large(peer, n, max_bytes));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut body = Tensor::zeros([as_i64(n)], (Kind::Uint8, tch::Device::Cpu));
        self.pg
            .recv(&mut body, peer, tag, deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))?;
        Ok(bytes_of(&body))
    }

    fn shutdown(&self) -> compiler_collectives_core::Result<()> {
        self.drain();
        *self.lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        Ok(())
    }
}

impl Drop for C10dTransport {
    fn drop(&mut self) {
        self.drain();
    }
}

/// What [`from_env`] reads: torchrun's `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
/// `MASTER_PORT`, `TORCHELASTIC_USE_AGENT_STORE` (when `True`, torchrun's
/// agent already serves the TCPStore and rank 0 is only a client), and
/// `CCOL_TIMEOUT_S` (default 300 s).
///
/// # Errors
/// [`Error::InvalidArgument`] naming a missing or malformed variable; the
/// store's or group's errors.
pub fn from_env() -> compiler_collectives_core::Result<C10dTransport> {
    let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
    let num = |n: &str| -> compiler_collectives_core::Result<u32> {
        var(n)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{n} is not set: start the ranks with `ccol run` or `torchrun`"
                ))
            })?
            .parse()
            .map_err(|_| Error::InvalidArgument(format!("{n} is not a non-negative integer")))
    };
    let rank = num("RANK")?;
    let world = num("WORLD_SIZE")?;
    if world == 0 || rank >= world {
        return Err(Error::InvalidArgument(format!(
            "RANK={rank} is not below WORLD_SIZE={world}"
        )));
    }
    let addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
    let port: u16 = var("MASTER_PORT")
        .ok_or_else(|| Error::InvalidArgument("MASTER_PORT is not set".into()))?
        .parse()
        .map_err(|_| Error::InvalidArgument("MASTER_PORT is not a port number".into()))?;
    let agent = var("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let timeout = compiler_collectives_core::protocol::timeout_from_env()?
        .unwrap_or(Duration::from_secs(300));
    let store = C10dStore::tcp(&addr, port, world, rank == 0 && !agent, !agent, timeout)?;
    let run = var("TORCHELASTIC_RUN_ID").unwrap_or_else(|| "job".into());
    let restart = var("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into());
    let scoped = store.prefixed(&format!("ccol/{run}/{restart}"))?;
    let host = if addr == "localhost" || addr.starts_with("127.") {
        "127.0.0.1".to_string()
    } else {
        addr
    };
    let pg = C10dProcessGroup::gloo(&scoped, rank, world, &host, timeout)?;
    drop(store);
    Ok(C10dTransport::new(pg, scoped))
}
