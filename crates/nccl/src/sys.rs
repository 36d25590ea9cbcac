//! NCCL's entry points, resolved from the library file the probe found.
//!
//! cudarc's own NCCL loader opens the library by a fixed list of names
//! (`libnccl.so`, `libnccl.so.13`, …) and panics when none opens; the pip
//! wheels ship only `libnccl.so.2`, and glibc reads `LD_LIBRARY_PATH` once at
//! start-up, so a library found at run time cannot be handed to it. This
//! module therefore opens the found file itself (by full path) and resolves
//! the few entry points the transport uses, with cudarc's `nccl::sys` types
//! and ABI (feature `nccl-02029`: `ncclConfig_t` is the 2.28+ layout).
//!
//! NCCL results are read as plain `c_int`, not as cudarc's Rust enum: a code
//! the enum does not list (a newer NCCL) must not be undefined behaviour.
//!
//! This is the crate's only unsafe code. Over the entry points it builds
//! safe handles: [`Comm`] (a communicator, `NonNull` inside, freed once;
//! collectives between a [`Cuda`]'s buffers, sizes checked) and [`Cuda`]
//! (primary context, stream, event and staging buffers through cudarc's
//! result layer, freed only when idle); [`driver_present`] guards cudarc's
//! first driver call.

use crate::NcclError;
use cudarc::driver::{result as cu, sys as cusys};
use cudarc::nccl::sys::{
    cudaStream_t, ncclComm, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclUniqueId,
};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

/// `ncclSuccess`.
pub(crate) const SUCCESS: c_int = 0;
/// `ncclUnhandledCudaError`.
pub const UNHANDLED_CUDA_ERROR: i32 = 1;
/// `ncclInProgress` (non-blocking communicators).
pub(crate) const IN_PROGRESS: c_int = 7;

/// NCCL's name of a result code (`ncclUnhandledCudaError`, …), from nccl.h.
pub fn result_name(code: i32) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "unknown NCCL result",
    }
}

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut ncclUniqueId) -> c_int;
type InitRankConfig =
    unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int, *mut ncclConfig_t) -> c_int;
type CommFn = unsafe extern "C" fn(ncclComm_t) -> c_int;
type GetAsyncError = unsafe extern "C" fn(ncclComm_t, *mut c_int) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type GetLastError = unsafe extern "C" fn(ncclComm_t) -> *const c_char;
type AllGather = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclComm_t,
    cudaStream_t,
) -> c_int;

/// An opened NCCL library and the entry points this crate uses.
pub struct NcclLib {
    path: PathBuf,
    version: i32,
    get_unique_id: GetUniqueId,
    init_rank_config: InitRankConfig,
    comm_abort: CommFn,
    comm_finalize: CommFn,
    comm_destroy: CommFn,
    get_async_error: GetAsyncError,
    get_error_string: GetErrorString,
    get_last_error: GetLastError,
    all_gather: AllGather,
    // Last: the function pointers above point into it.
    _lib: libloading::Library,
}

/// Implements `Debug` for a type of this module showing only the listed
/// fields (`"name" => field.path`), marked non-exhaustive: entry-point
/// tables, raw CUDA handles and bookkeeping stay out of the output.
macro_rules! debug_fields {
    ($ty:ident { $($name:literal => $($field:ident).+),* $(,)? }) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    $(.field($name, &self.$($field).+))*
                    .finish_non_exhaustive()
            }
        }
    };
}

debug_fields!(NcclLib { "path" => path, "version" => version });

fn symbol<T: Copy>(lib: &libloading::Library, path: &Path, name: &str) -> Result<T, NcclError> {
    let cname = format!("{name}\0");
    // SAFETY: every `T` this module asks for is the C signature nccl.h
    // declares for `name`; the pointer is used only while `lib` is alive
    // (it is kept in the same `NcclLib`).
    unsafe { lib.get::<T>(cname.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| NcclError::LibraryLoad {
            path: path.display().to_string(),
            message: format!("missing entry point {name}: {}", load_text(&e)),
        })
}

impl NcclLib {
    /// Opens the NCCL library at `path` (a full path, or a bare name the
    /// dynamic linker searches for) and resolves its entry points.
    ///
    /// # Errors
    /// [`NcclError::LibraryLoad`] if it does not open or lacks an entry
    /// point; [`NcclError::Version`] if it is older than NCCL 2.28 (the
    /// `ncclConfig_t` layout this crate passes).
    pub fn open(path: &Path) -> Result<Self, NcclError> {
        // SAFETY: opening a shared object runs its initialisers; NCCL's only
        // set up its own state. The caller chose the file.
        let lib =
            unsafe { libloading::Library::new(path) }.map_err(|e| NcclError::LibraryLoad {
                path: path.display().to_string(),
                message: load_text(&e),
            })?;
        let get_version: GetVersion = symbol(&lib, path, "ncclGetVersion")?;
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid out pointer.
        let rc = unsafe { get_version(&mut version) };
        if rc != SUCCESS || version < 22800 {
            return Err(NcclError::Version {
                path: path.display().to_string(),
                found: version,
            });
        }
        Ok(NcclLib {
            path: path.to_path_buf(),
            version,
            get_unique_id: symbol(&lib, path, "ncclGetUniqueId")?,
            init_rank_config: symbol(&lib, path, "ncclCommInitRankConfig")?,
            comm_abort: symbol(&lib, path, "ncclCommAbort")?,
            comm_finalize: symbol(&lib, path, "ncclCommFinalize")?,
            comm_destroy: symbol(&lib, path, "ncclCommDestroy")?,
            get_async_error: symbol(&lib, path, "ncclCommGetAsyncError")?,
            get_error_string: symbol(&lib, path, "ncclGetErrorString")?,
            get_last_error: symbol(&lib, path, "ncclGetLastError")?,
            all_gather: symbol(&lib, path, "ncclAllGather")?,
            _lib: lib,
        })
    }

    /// The file (or name) it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// NCCL's version code, `major * 10000 + minor * 100 + patch` (e.g. 22907).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The version as `major.minor.patch`.
    pub fn version_string(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
    }

    /// A fresh 128-byte unique id (`ncclGetUniqueId`). Needs no GPU: NCCL
    /// only opens its bootstrap socket.
    ///
    /// # Errors
    /// [`NcclError::Nccl`] with NCCL's code and text (e.g. no network interface).
    pub fn unique_id(&self) -> Result<crate::UniqueId, NcclError> {
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is a valid, writable ncclUniqueId.
        let rc = unsafe { (self.get_unique_id)(&mut id) };
        self.check(rc, "ncclGetUniqueId", None)?;
        Ok(crate::UniqueId::from_raw(&id))
    }

    /// Turns a result code into `Ok` or a typed error carrying NCCL's code,
    /// its name, its string and the last-error text (of `comm` when given).
    pub(crate) fn check(
        &self,
        rc: c_int,
        operation: &str,
        comm: Option<&Comm>,
    ) -> Result<(), NcclError> {
        if rc == SUCCESS || rc == IN_PROGRESS {
            return Ok(());
        }
        Err(self.error(rc, operation, comm))
    }

    pub(crate) fn error(&self, rc: c_int, operation: &str, comm: Option<&Comm>) -> NcclError {
        // SAFETY: ncclGetErrorString accepts any code and returns a static
        // string (or null).
        let text = unsafe { cstr((self.get_error_string)(rc)) };
        let comm = comm.map_or(std::ptr::null_mut(), Comm::raw);
        // SAFETY: ncclGetLastError accepts null (the thread's last error) or
        // a communicator that has not been freed (a borrowed `Comm` is live);
        // it returns a string owned by NCCL, copied at once.
        let last = unsafe { cstr((self.get_last_error)(comm)) };
        NcclError::Nccl {
            operation: operation.to_owned(),
            code: rc,
            name: result_name(rc),
            text,
            last_error: last,
        }
    }
}

/// The loader's message with its causes: libloading's Display says only
/// which call failed ("dlopen failed"); dlerror's text is its `source()`.
fn load_text(e: &libloading::Error) -> String {
    compiler_collectives_core::with_sources(e)
}

/// Copies a C string NCCL returned (null gives "").
///
/// # Safety
/// `p` is null or a NUL-terminated string alive for the call.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: non-null and NUL-terminated (caller).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// `NCCL_CONFIG_INITIALIZER` of nccl.h 2.29 with `blocking` set: every
/// field "undefined" (`INT_MIN` / null) so NCCL uses its defaults.
fn config(blocking: bool) -> ncclConfig_t {
    const UNDEF: c_int = c_int::MIN;
    ncclConfig_t {
        size: std::mem::size_of::<ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: 22900,
        blocking: c_int::from(blocking),
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
    }
}

/// `ncclInvalidArgument`: what a wrapper below returns, without calling
/// NCCL, for buffers too small for the call.
const INVALID_ARGUMENT: c_int = 4;
/// `ncclInternalError`.
const INTERNAL_ERROR: c_int = 3;

/// Whether the CUDA driver library can be opened, checked before any other
/// cudarc call (cudarc panics on a missing library).
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to open the driver library by cudarc's list of
    // names; loads nothing into cudarc's cache when absent.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

// ---------------------------------------------------------------------------
// Communicators
// ---------------------------------------------------------------------------

/// One NCCL communicator (`ncclComm_t`, never null) with the library it came
/// from. Freed once: by [`Comm::destroy`] or [`Comm::abort`], else by Drop
/// (an abort, which never blocks). Drop never panics.
pub(crate) struct Comm {
    lib: Arc<NcclLib>,
    ptr: NonNull<ncclComm>,
    world: usize,
    freed: bool,
}

// SAFETY: NCCL lets a communicator be used from any thread as long as calls
// on it are not concurrent; `Comm` is not `Sync` and all its calls take
// `&self`/`self` on the owning thread, so they never are.
unsafe impl Send for Comm {}

debug_fields!(Comm { "ptr" => ptr, "world" => world });

impl Drop for Comm {
    fn drop(&mut self) {
        let rc = self.free(false);
        if rc != SUCCESS && rc != IN_PROGRESS {
            tracing::debug!(code = rc, "ncclCommAbort failed");
        }
    }
}

impl Comm {
    /// `ncclCommInitRankConfig` on the calling thread's current CUDA device
    /// (non-blocking unless `blocking`): the communicator may still be
    /// `ncclInProgress` ([`Comm::state`]). On an error, a communicator NCCL
    /// handed out anyway is aborted.
    pub(crate) fn init(
        lib: Arc<NcclLib>,
        id: ncclUniqueId,
        world: c_int,
        rank: c_int,
        blocking: bool,
    ) -> Result<Self, NcclError> {
        let mut config = config(blocking);
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` and `config` are valid, writable and alive for the
        // call (NCCL copies the config).
        let rc = unsafe { (lib.init_rank_config)(&mut comm, world, id, rank, &mut config) };
        if rc != SUCCESS && rc != IN_PROGRESS {
            let err = lib.error(rc, "ncclCommInitRankConfig", None);
            if !comm.is_null() {
                // SAFETY: NCCL handed out this communicator; it is freed here
                // and never used again.
                unsafe { (lib.comm_abort)(comm) };
            }
            return Err(err);
        }
        let Some(ptr) = NonNull::new(comm) else {
            return Err(lib.error(INTERNAL_ERROR, "ncclCommInitRankConfig", None));
        };
        Ok(Comm {
            lib,
            ptr,
            world: usize::try_from(world).unwrap_or(0),
            freed: false,
        })
    }

    /// The raw handle (for display and for callers' own NCCL calls).
    pub(crate) fn raw(&self) -> ncclComm_t {
        self.ptr.as_ptr()
    }

    /// `ncclCommGetAsyncError`: `ncclSuccess`, `ncclInProgress`, or an
    /// error code.
    pub(crate) fn state(&self) -> c_int {
        let mut state: c_int = SUCCESS;
        // SAFETY: the communicator is live (not freed: `destroy`/`abort`
        // consume `self`); `state` is a valid out pointer.
        let rc = unsafe { (self.lib.get_async_error)(self.raw(), &mut state) };
        if rc != SUCCESS {
            rc
        } else {
            state
        }
    }

    /// A typed error for `rc`, with this communicator's last-error text.
    pub(crate) fn error(&self, rc: c_int, operation: &str) -> NcclError {
        self.lib.error(rc, operation, Some(self))
    }

    /// `ncclCommFinalize` (then poll [`Comm::state`] until it is done).
    pub(crate) fn finalize(&self) -> c_int {
        // SAFETY: the communicator is live (as in `state`); it stays valid
        // (for polling, destroy or abort) after finalizing.
        unsafe { (self.lib.comm_finalize)(self.raw()) }
    }

    /// `ncclCommDestroy` (after a completed finalize).
    pub(crate) fn destroy(mut self) -> c_int {
        self.free(true)
    }

    /// `ncclCommAbort`: frees the communicator at once, interrupting NCCL
    /// work in flight.
    pub(crate) fn abort(mut self) -> c_int {
        self.free(false)
    }

    /// Frees the communicator the first time it is called.
    fn free(&mut self, destroy: bool) -> c_int {
        if std::mem::replace(&mut self.freed, true) {
            return SUCCESS;
        }
        let f = if destroy {
            self.lib.comm_destroy
        } else {
            self.lib.comm_abort
        };
        // SAFETY: the communicator is live and freed exactly once (`freed`
        // was false and is now true; nothing uses `ptr` afterwards: `free`
        // runs from `destroy`/`abort`, which consume `self`, or from Drop).
        unsafe { f(self.raw()) }
    }

    /// `ncclAllGather` of `count` bytes per rank from `cuda`'s send buffer
    /// into its receive buffer, on `cuda`'s stream. Buffers too small for
    /// the call give `ncclInvalidArgument` without calling NCCL.
    pub(crate) fn all_gather(&self, cuda: &Cuda, count: usize) -> c_int {
        let fits = cuda.send.len >= count
            && count
                .checked_mul(self.world)
                .is_some_and(|total| cuda.recv.len >= total);
        if !fits {
            return INVALID_ARGUMENT;
        }
        // SAFETY: the communicator is live (as in `state`); NCCL reads
        // `count` bytes of the send buffer and writes `count * world` bytes
        // of the receive buffer, both device allocations of at least that
        // size (checked above) owned by `cuda`, which is borrowed for the
        // call and frees them only when the stream is idle (see `Cuda`);
        // the stream is `cuda`'s, live while `cuda` is.
        unsafe {
            (self.lib.all_gather)(
                cuda.send.as_ptr(),
                cuda.recv.as_ptr(),
                count,
                ncclDataType_t::ncclUint8,
                self.raw(),
                cuda.nccl_stream(),
            )
        }
    }
}

// ---------------------------------------------------------------------------
// CUDA resources (through cudarc's result layer)
// ---------------------------------------------------------------------------

/// A device buffer from `cuMemAlloc` (`len == 0`: none).
struct DevBuf {
    ptr: cusys::CUdeviceptr,
    len: usize,
}

impl DevBuf {
    const fn empty() -> Self {
        DevBuf { ptr: 0, len: 0 }
    }

    /// Makes room for `need` bytes (at least 1). The owning context must be
    /// current and the stream idle (the old buffer is freed).
    fn reserve(&mut self, need: usize) -> Result<(), NcclError> {
        if self.len >= need.max(1) {
            return Ok(());
        }
        self.release();
        let len = need.max(256).next_power_of_two();
        // SAFETY: allocates device memory in the current context (the
        // caller made `Cuda`'s context current); nothing else is touched.
        self.ptr =
            unsafe { cu::malloc_sync(len) }.map_err(|e| NcclError::cuda("cuMemAlloc", &e))?;
        self.len = len;
        Ok(())
    }

    fn release(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated by `reserve` and freed once (reset to empty
            // below); the caller guarantees no work in flight uses it (the
            // stream is idle, else `Cuda` leaks instead of releasing).
            if let Err(e) = unsafe { cu::free_sync(self.ptr) } {
                tracing::debug!(error = %e, "cuMemFree failed");
            }
        }
        *self = DevBuf::empty();
    }

    fn as_ptr(&self) -> *mut c_void {
        // A device address handed to NCCL as a pointer, never dereferenced
        // by Rust (64-bit on every target CUDA supports).
        std::ptr::with_exposed_provenance_mut(usize::try_from(self.ptr).unwrap_or(0))
    }
}

/// The CUDA side of a transport: the device's primary context (retained),
/// a non-blocking stream, an event, and two staging buffers (send and
/// receive, grown on demand, never shrunk).
///
/// Every operation on the buffers is ordered on the stream; a buffer is
/// freed (grown, or dropped) only when the stream is idle: every method that
/// enqueues work is followed by the transport waiting for the event, and
/// after an abort whose work does not drain, [`Cuda::mark_leaked`] makes
/// Drop free nothing (freeing memory a kernel still touches is worse than a
/// leak).
pub(crate) struct Cuda {
    device: cusys::CUdevice,
    ctx: cusys::CUcontext,
    stream: cusys::CUstream,
    event: cusys::CUevent,
    send: DevBuf,
    recv: DevBuf,
    leaked: bool,
}

// SAFETY: CUDA driver handles are not tied to the thread that made them: any
// thread may use them once the context is current there, which the methods
// that need it ensure (`make_current` first); `Cuda` is not `Sync`, so calls
// on it never run concurrently.
unsafe impl Send for Cuda {}

debug_fields!(Cuda { "device" => device, "send" => send.len, "recv" => recv.len });

impl Cuda {
    /// Retains device `ordinal`'s primary context, makes it current on this
    /// thread, and creates the stream and event.
    pub(crate) fn new(ordinal: usize) -> Result<Self, NcclError> {
        let ord = c_int::try_from(ordinal).map_err(|_| NcclError::DeviceOutOfRange {
            device: ordinal,
            count: 0,
        })?;
        let device = cu::device::get(ord).map_err(|e| NcclError::cuda("cuDeviceGet", &e))?;
        // SAFETY: `device` came from cuDeviceGet; the retain is released
        // once, by Drop.
        let ctx = unsafe { cu::primary_ctx::retain(device) }
            .map_err(|e| NcclError::cuda("cuDevicePrimaryCtxRetain", &e))?;
        let mut this = Cuda {
            device,
            ctx,
            stream: std::ptr::null_mut(),
            event: std::ptr::null_mut(),
            send: DevBuf::empty(),
            recv: DevBuf::empty(),
            leaked: false,
        };
        this.make_current()?;
        this.stream = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(|e| NcclError::cuda("cuStreamCreate", &e))?;
        this.event = cu::event::create(cusys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|e| NcclError::cuda("cuEventCreate", &e))?;
        Ok(this)
    }

    /// Makes the context current on the calling thread.
    pub(crate) fn make_current(&self) -> Result<(), NcclError> {
        // SAFETY: `ctx` is a primary context retained by `new` and released
        // only by Drop.
        unsafe { cu::ctx::set_current(self.ctx) }
            .map_err(|e| NcclError::cuda("cuCtxSetCurrent", &e))
    }

    /// Makes the context current and the buffers at least `send` and `recv`
    /// bytes long. The stream must be idle (the transport waits for every
    /// operation before the next).
    pub(crate) fn reserve(&mut self, send: usize, recv: usize) -> Result<(), NcclError> {
        self.make_current()?;
        self.send.reserve(send)?;
        self.recv.reserve(recv)
    }

    /// [`Cuda::reserve`] for `input.len()` and `out_len` bytes, then copies
    /// `input` into the send buffer on the stream.
    pub(crate) fn stage_in(&mut self, input: &[u8], out_len: usize) -> Result<(), NcclError> {
        self.reserve(input.len(), out_len)?;
        if !input.is_empty() {
            // SAFETY: the send buffer holds at least `input.len()` bytes
            // (reserved above) in the current context; from pageable memory
            // the call returns once `input` is staged, so it may be released
            // afterwards.
            unsafe { cu::memcpy_htod_async(self.send.ptr, input, self.stream) }
                .map_err(|e| NcclError::cuda("cuMemcpyHtoDAsync", &e))?;
        }
        Ok(())
    }

    /// Copies the first `out.len()` bytes of the receive buffer into `out`,
    /// ordered after the work on the stream (into pageable memory the call
    /// blocks until done).
    pub(crate) fn copy_out(&self, out: &mut [u8]) -> Result<(), NcclError> {
        if out.is_empty() {
            return Ok(());
        }
        if out.len() > self.recv.len {
            return Err(NcclError::cuda(
                "cuMemcpyDtoHAsync",
                &cudarc::driver::DriverError(cusys::cudaError_enum::CUDA_ERROR_INVALID_VALUE),
            ));
        }
        self.make_current()?;
        // SAFETY: the receive buffer holds at least `out.len()` bytes
        // (checked above) in the current context; `out` is writable for the
        // call, which for pageable memory returns only once the copy is done.
        unsafe { cu::memcpy_dtoh_async(out, self.recv.ptr, self.stream) }
            .map_err(|e| NcclError::cuda("cuMemcpyDtoHAsync", &e))
    }

    pub(crate) fn nccl_stream(&self) -> cudaStream_t {
        self.stream.cast()
    }

    /// Records the event after the work enqueued so far on the stream.
    pub(crate) fn record(&self) -> Result<(), cudarc::driver::DriverError> {
        // SAFETY: event and stream were created together by `new` (one
        // context) and are live until Drop.
        unsafe { cu::event::record(self.event, self.stream) }
    }

    /// Whether the work before the last [`Cuda::record`] is done (`false`:
    /// not yet).
    pub(crate) fn query(&self) -> Result<bool, cudarc::driver::DriverError> {
        // SAFETY: the event was created by `new` and is live until Drop.
        match unsafe { cu::event::query(self.event) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == cusys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Work may still run on the stream (an abort that did not drain): Drop
    /// then frees nothing.
    pub(crate) fn mark_leaked(&mut self) {
        self.leaked = true;
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        if self.make_current().is_err() || self.leaked {
            return;
        }
        self.send.release();
        self.recv.release();
        // SAFETY: event and stream were created by `new` (or are null) and
        // are idle (not leaked: every operation was waited for); each is
        // destroyed once, here, and the primary context retained by `new` is
        // released once, after them.
        unsafe {
            if !self.event.is_null() {
                let _ = cu::event::destroy(self.event);
            }
            if !self.stream.is_null() {
                let _ = cu::stream::destroy(self.stream);
            }
            let _ = cu::primary_ctx::release(self.device);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_error_carries_dlerrors_text() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("libnccl.so.2");
        let e = NcclLib::open(&missing).expect_err("no such file");
        let NcclError::LibraryLoad { path, message } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(path, &missing.display().to_string());
        // dlerror's text, which libloading 0.9 keeps in `source()`.
        assert!(message.starts_with("dlopen failed: "), "{message}");
        assert!(
            message.contains(&format!("{path}: cannot open shared object file")),
            "{message}"
        );
        assert!(message.contains("No such file or directory"), "{message}");
    }

    #[test]
    fn a_missing_entry_point_names_it() {
        let libc = Path::new("libc.so.6");
        // SAFETY: the C library is loaded in every process already.
        let lib = unsafe { libloading::Library::new(libc) }.expect("libc");
        let e = symbol::<GetVersion>(&lib, libc, "ncclGetVersion").expect_err("not NCCL");
        let text = e.to_string();
        assert!(
            text.starts_with("cannot load NCCL from libc.so.6: missing entry point ncclGetVersion: dlsym failed: "),
            "{text}"
        );
        assert!(text.contains("undefined symbol: ncclGetVersion"), "{text}");
    }
}
