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

use crate::NcclError;
use cudarc::nccl::sys::{cudaStream_t, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclUniqueId};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};

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
type Broadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    c_int,
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
    broadcast: Broadcast,
    // Last: the function pointers above point into it.
    _lib: libloading::Library,
}

impl std::fmt::Debug for NcclLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclLib")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

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
            broadcast: symbol(&lib, path, "ncclBroadcast")?,
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
        comm: Option<ncclComm_t>,
    ) -> Result<(), NcclError> {
        if rc == SUCCESS || rc == IN_PROGRESS {
            return Ok(());
        }
        Err(self.error(rc, operation, comm))
    }

    pub(crate) fn error(&self, rc: c_int, operation: &str, comm: Option<ncclComm_t>) -> NcclError {
        // SAFETY: ncclGetErrorString accepts any code and returns a static
        // string (or null).
        let text = unsafe { cstr((self.get_error_string)(rc)) };
        // SAFETY: ncclGetLastError accepts null (the thread's last error) or
        // a communicator that has not been destroyed; it returns a string
        // owned by NCCL, copied at once.
        let last = unsafe { cstr((self.get_last_error)(comm.unwrap_or(std::ptr::null_mut()))) };
        NcclError::Nccl {
            operation: operation.to_owned(),
            code: rc,
            name: result_name(rc),
            text,
            last_error: last,
        }
    }

    /// `ncclCommInitRankConfig`.
    ///
    /// # Safety
    /// `comm` and `config` must be valid pointers.
    pub(crate) unsafe fn init_rank_config(
        &self,
        comm: *mut ncclComm_t,
        world: c_int,
        id: ncclUniqueId,
        rank: c_int,
        config: *mut ncclConfig_t,
    ) -> c_int {
        // SAFETY: forwarded from the caller.
        unsafe { (self.init_rank_config)(comm, world, id, rank, config) }
    }

    /// `ncclCommGetAsyncError`: the communicator's state (`ncclSuccess`,
    /// `ncclInProgress`, or an error code).
    ///
    /// # Safety
    /// `comm` must be a live communicator.
    pub(crate) unsafe fn async_error(&self, comm: ncclComm_t) -> c_int {
        let mut state: c_int = SUCCESS;
        // SAFETY: `comm` is live (caller), `state` a valid out pointer.
        let rc = unsafe { (self.get_async_error)(comm, &mut state) };
        if rc != SUCCESS {
            rc
        } else {
            state
        }
    }

    /// `ncclCommAbort`.
    ///
    /// # Safety
    /// `comm` must be a live communicator; it is freed.
    pub(crate) unsafe fn abort(&self, comm: ncclComm_t) -> c_int {
        // SAFETY: forwarded from the caller.
        unsafe { (self.comm_abort)(comm) }
    }

    /// `ncclCommFinalize`.
    ///
    /// # Safety
    /// `comm` must be a live communicator.
    pub(crate) unsafe fn finalize(&self, comm: ncclComm_t) -> c_int {
        // SAFETY: forwarded from the caller.
        unsafe { (self.comm_finalize)(comm) }
    }

    /// `ncclCommDestroy`.
    ///
    /// # Safety
    /// `comm` must be a live, finalized communicator; it is freed.
    pub(crate) unsafe fn destroy(&self, comm: ncclComm_t) -> c_int {
        // SAFETY: forwarded from the caller.
        unsafe { (self.comm_destroy)(comm) }
    }

    /// `ncclAllGather` of `count` bytes per rank.
    ///
    /// # Safety
    /// Device pointers of `count` and `count * world` bytes on the
    /// communicator's device; a live communicator and stream.
    pub(crate) unsafe fn all_gather_bytes(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> c_int {
        // SAFETY: forwarded from the caller.
        unsafe { (self.all_gather)(send, recv, count, ncclDataType_t::ncclUint8, comm, stream) }
    }

    /// `ncclBroadcast` of `count` bytes from `root`.
    ///
    /// # Safety
    /// Device pointers of `count` bytes on the communicator's device; a live
    /// communicator and stream.
    pub(crate) unsafe fn broadcast_bytes(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> c_int {
        // SAFETY: forwarded from the caller.
        unsafe {
            (self.broadcast)(
                send,
                recv,
                count,
                ncclDataType_t::ncclUint8,
                root,
                comm,
                stream,
            )
        }
    }
}

/// The loader's message with its causes (libloading keeps dlerror's text
/// in the source).
fn load_text(e: &libloading::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
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
pub(crate) fn config(blocking: bool) -> ncclConfig_t {
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
