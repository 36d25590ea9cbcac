//! # compiler-collectives-gloo
//!
//! A CPU transport for compiler-collectives over Facebook Gloo (Debian's
//! `libgloo-dev`), with TCP connections between ranks.
//!
//! The crate compiles a small C++ adapter with a plain C ABI into a shared
//! object, embeds it, writes it to a cache file on first use and loads it
//! with `dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)` (a package that ships
//! the adapter as a file of its own names it with [`use_adapter_file`]
//! instead). The Rust binary
//! never links libgloo, so a process can also hold libtorch (which carries
//! its own copy of Gloo's symbols) without the two colliding. Every adapter
//! entry catches C++ exceptions and returns a status plus Gloo's message.
//!
//! | item | what |
//! |---|---|
//! | [`GlooStore`] | rendezvous stores: FileStore, RedisStore, HashStore, prefix, any core `Store` |
//! | [`GlooTransport`] | core's `Transport`: all_gather (variable length), broadcast, barrier, send/recv, shutdown |
//! | [`from_env`] | a transport from torchrun's environment (`RANK`, `WORLD_SIZE`, …) |
//! | [`use_adapter_file`] | load the adapter from a file a package ships, not the embedded copy |
//!
//! | feature | default | what |
//! |---|---|---|
//! | `embedded-adapter` | on | the adapter's bytes are compiled into the crate and written to a private cache file on first use; without it, [`use_adapter_file`] must name the file |
//!
//! The build script also hands the compiled adapter's path to dependent
//! build scripts (`links = "ccol_gloo"`: `DEP_CCOL_GLOO_ADAPTER`), so a
//! package can ship it as a file.
//!
//! Build requirement: `sudo apt-get install -y --no-install-recommends libgloo-dev`
//! (the build script says so when it is missing).
//!
//! ```no_run
//! use compiler_collectives_core::{Channel, Transport};
//! use compiler_collectives_gloo::from_env;
//! // Under `ccol run --nproc-per-node 2 -- prog` or `torchrun --standalone --no-python prog`:
//! let transport = from_env()?;
//! let mut channel = Channel::new(std::sync::Arc::new(transport))?;
//! # Ok::<(), compiler_collectives_core::Error>(())
//! ```
//!
//! Unsafe code lives only in the private `sys` module (loading the adapter,
//! handle newtypes over its C ABI, the Rust store's callbacks); every other
//! module is safe code.

#![deny(unsafe_code)]

mod env;
mod store;
#[allow(unsafe_code)]
mod sys;
mod transport;

pub use env::{advertised_hostname, from_env, store_from_env, EnvConfig, StoreSpec, STORE_ENV};
pub use store::{GlooStore, StoreKind};
pub use transport::{GlooInterrupt, GlooOptions, GlooTransport};

/// Errors of the Gloo backend. Converted into core's
/// [`Error::Backend`](compiler_collectives_core::Error::Backend) (or
/// `InvalidArgument`) keeping the text.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GlooError {
    /// The adapter could not be written or loaded.
    #[error("cannot load the Gloo adapter: {0}")]
    Load(String),
    /// An argument was rejected before reaching Gloo.
    #[error("{0}")]
    Invalid(String),
    /// Gloo raised an exception.
    #[error("gloo {operation} failed ({}): {message}", status_name(*status))]
    Engine {
        /// The adapter's status code (timeout, io, invalid, other).
        status: i32,
        /// What was being done.
        operation: String,
        /// Gloo's exception text.
        message: String,
    },
    /// The environment does not describe a process group.
    #[error("{0}")]
    Env(String),
}

fn status_name(status: i32) -> &'static str {
    match status {
        sys::TIMEOUT => "timeout",
        sys::IO => "io",
        sys::INVALID => "invalid",
        sys::ABORTED => "interrupted at the deadline",
        _ => "exception",
    }
}

impl GlooError {
    /// The adapter's status code, for errors Gloo raised.
    pub fn status(&self) -> Option<i32> {
        match self {
            GlooError::Engine { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The path of the loaded adapter (loading it if needed), for diagnostics.
///
/// # Errors
/// [`GlooError::Load`] if it cannot be written or loaded.
pub fn adapter_path() -> Result<std::path::PathBuf, GlooError> {
    sys::api().map(|a| a.path.clone())
}

/// Loads the adapter from the file at `path` rather than the embedded copy:
/// for a package that ships the adapter as a file (the Python wheel, where
/// `auditwheel` points it at the Gloo libraries the wheel carries). Call it
/// before the transport's first use, which opens the file. A build without
/// the `embedded-adapter` feature needs this call.
///
/// # Errors
/// [`GlooError::Load`] if a different adapter was chosen already (another
/// path, or the embedded adapter by an earlier first use). Naming the same
/// path again is `Ok`.
pub fn use_adapter_file(path: &std::path::Path) -> Result<(), GlooError> {
    sys::use_adapter_file(path)
}
