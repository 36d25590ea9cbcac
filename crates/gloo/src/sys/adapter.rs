//! The adapter's C ABI (the entry points' types, [`Api`]) and loading it:
//! the file [`use_adapter_file`] named, else the embedded copy, opened with
//! `dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)`.

use super::RawError;
use crate::GlooError;
use compiler_collectives_ffi::sys::AppendFn;
use std::ffi::{c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The adapter's ABI version this crate was written against.
pub(crate) const ABI_VERSION: u32 = 2;

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
    super::embedded::write()
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

/// Opens the adapter file at `path` (`dlopen(RTLD_NOW | RTLD_LOCAL |
/// RTLD_DEEPBIND)`).
///
/// # Errors
/// [`GlooError::Load`] naming the file, with the loader's whole message
/// (dlerror's text names the file that is missing: the adapter or libgloo).
///
/// # Safety
/// `path` is the adapter this crate's build script compiled (the embedded
/// copy, or the file a package shipped it as and named with
/// [`use_adapter_file`]) or a file that does not load: opening it runs its
/// initialisers.
unsafe fn open(path: &Path) -> Result<libloading::Library, GlooError> {
    let flags = libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND;
    // SAFETY: the caller names the adapter, whose initialisers are those of
    // a plain C++ shared object linking libgloo.
    let lib = unsafe { libloading::os::unix::Library::open(Some(path), flags) }.map_err(|e| {
        GlooError::Load(format!(
            "cannot load the Gloo adapter {} ({}); when the error names libgloo, install \
             Debian's libgloo0 (`sudo apt-get install -y libgloo-dev`)",
            path.display(),
            load_text(&e)
        ))
    })?;
    Ok(libloading::Library::from(lib))
}

/// The loader's message with its causes: libloading's Display says only
/// which call failed ("dlopen failed"); dlerror's text is its `source()`.
fn load_text(e: &libloading::Error) -> String {
    compiler_collectives_core::with_sources(e)
}

fn load() -> Result<Api, GlooError> {
    let path = adapter_file()?;
    // SAFETY: the file is the adapter this crate's build script compiled or
    // the one a package named with `use_adapter_file`.
    let lib = unsafe { open(&path) }?;
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is declared in adapter/ccol_gloo.h with
            // exactly the signature of the field it is stored in.
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                GlooError::Load(format!("adapter lacks {}: {}", $name, load_text(&e)))
            })?;
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

    #[test]
    fn a_load_error_carries_dlerrors_text() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("libccol-missing-adapter.so");
        // SAFETY: the file does not exist; nothing is loaded.
        let e = unsafe { open(&missing) }.expect_err("no such file");
        let text = e.to_string();
        // dlerror's text, which libloading 0.9 keeps in `source()`: the file
        // and why it did not open.
        assert!(text.contains("dlopen failed: "), "{text}");
        assert!(
            text.contains(&format!(
                "{}: cannot open shared object file",
                missing.display()
            )),
            "{text}"
        );
        assert!(text.contains("No such file or directory"), "{text}");
        assert!(text.contains("libgloo-dev"), "{text}");
    }

    #[test]
    fn a_missing_entry_point_names_it() {
        // SAFETY: the C library is loaded in every process already.
        let lib = unsafe { libloading::Library::new("libc.so.6") }.expect("libc");
        // SAFETY: the symbol does not exist; nothing is called.
        let e = unsafe { lib.get::<unsafe extern "C" fn()>(b"ccol_gloo_abi_version\0") }
            .map(|_| ())
            .expect_err("libc has no adapter entry points");
        let text = load_text(&e);
        assert!(text.starts_with("dlsym failed: "), "{text}");
        assert!(
            text.contains("undefined symbol: ccol_gloo_abi_version"),
            "{text}"
        );
    }
}
