//! Loading the adapter: the embedded shared object is written to a cache
//! file once and opened with `dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)`,
//! so its Gloo symbols resolve against Debian's libgloo even in a process
//! that also holds libtorch's copy of Gloo (DESIGN §3).

use crate::GlooError;
use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The adapter's ABI version this crate was written against.
pub(crate) const ABI_VERSION: u32 = 2;

pub(crate) const OK: i32 = 0;
pub(crate) const TIMEOUT: i32 = 1;
pub(crate) const IO: i32 = 2;
pub(crate) const INVALID: i32 = 3;
pub(crate) const ABORTED: i32 = 5;

static ADAPTER: &[u8] = include_bytes!(env!("CCOL_GLOO_ADAPTER_SO"));

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
        let bytes: Vec<u8> = self
            .message
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c.to_ne_bytes()[0])
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub(crate) fn into_error(self, status: i32, what: &str) -> GlooError {
        GlooError::Engine {
            status,
            operation: what.to_owned(),
            message: self.message(),
        }
    }
}

pub(crate) type AppendFn = unsafe extern "C" fn(out: *mut c_void, data: *const u8, len: usize);

/// `ccol_gloo_store_vtable`.
#[repr(C)]
pub(crate) struct StoreVtable {
    pub(crate) ctx: *mut c_void,
    pub(crate) set:
        unsafe extern "C" fn(*mut c_void, *const c_char, *const u8, usize, *mut RawError) -> i32,
    pub(crate) get: unsafe extern "C" fn(
        *mut c_void,
        *const c_char,
        i64,
        *mut c_void,
        AppendFn,
        *mut RawError,
    ) -> i32,
    pub(crate) wait:
        unsafe extern "C" fn(*mut c_void, *const *const c_char, usize, i64, *mut RawError) -> i32,
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
    pub(crate) store_set:
        unsafe extern "C" fn(*mut c_void, *const c_char, *const u8, usize, *mut RawError) -> i32,
    pub(crate) store_get: unsafe extern "C" fn(
        *mut c_void,
        *const c_char,
        i64,
        *mut c_void,
        AppendFn,
        *mut RawError,
    ) -> i32,
    pub(crate) store_wait:
        unsafe extern "C" fn(*mut c_void, *const *const c_char, usize, i64, *mut RawError) -> i32,
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
    pub(crate) buffer_send:
        unsafe extern "C" fn(*mut c_void, i32, u64, usize, usize, *mut RawError) -> i32,
    pub(crate) buffer_recv:
        unsafe extern "C" fn(*mut c_void, i32, u64, usize, usize, *mut RawError) -> i32,
    pub(crate) buffer_wait_recv:
        unsafe extern "C" fn(*mut c_void, i64, *mut i32, *mut RawError) -> i32,
    pub(crate) buffer_wait_send:
        unsafe extern "C" fn(*mut c_void, i64, *mut i32, *mut RawError) -> i32,
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

/// Where the adapter is written: `$CCOL_CACHE`, else `$XDG_CACHE_HOME/compiler-collectives`,
/// else `$HOME/.cache/compiler-collectives`, else `compiler-collectives-<uid>` in the
/// temporary directory. A directory is used only if this user owns it and nobody else can
/// write it (see [`private_dir`]).
fn cache_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("CCOL_CACHE") {
        dirs.push(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        dirs.push(PathBuf::from(d).join("compiler-collectives"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(h).join(".cache").join("compiler-collectives"));
    }
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

fn load() -> Result<Api, GlooError> {
    let mut errors = Vec::new();
    let path = cache_dirs()
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
        })?;
    let flags = libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND;
    // SAFETY: the file is the adapter this crate's build script compiled; its
    // initialisers are those of a plain C++ shared object linking libgloo.
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

/// Appends `len` bytes at `data` to the `Vec<u8>` at `out`.
///
/// # Safety
/// `out` must point to a live `Vec<u8>`, `data` to `len` readable bytes.
pub(crate) unsafe extern "C" fn append_to_vec(out: *mut c_void, data: *const u8, len: usize) {
    let result = std::panic::catch_unwind(|| {
        if out.is_null() || (data.is_null() && len > 0) {
            return;
        }
        // SAFETY: guaranteed by the caller (the adapter passes the pointer we gave it).
        let v = unsafe { &mut *out.cast::<Vec<u8>>() };
        if len > 0 {
            // SAFETY: the adapter passes a pointer to `len` bytes of a live vector.
            v.extend_from_slice(unsafe { std::slice::from_raw_parts(data, len) });
        }
    });
    if result.is_err() {
        tracing::error!("panic while receiving bytes from the Gloo adapter");
    }
}

/// A NUL-terminated copy of `s`.
pub(crate) fn cstring(s: &str, what: &str) -> Result<std::ffi::CString, GlooError> {
    std::ffi::CString::new(s).map_err(|_| GlooError::Invalid(format!("{what} contains a NUL byte")))
}

/// Reads a C string the adapter handed over.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string alive for the call.
pub(crate) unsafe fn from_c(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
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
