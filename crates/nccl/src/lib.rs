//! # compiler-collectives-nccl
//!
//! A GPU transport for compiler-collectives over NVIDIA NCCL, with cudarc
//! for the CUDA driver and NCCL's types. Everything is loaded at run time:
//! the crate builds with only the Rust toolchain, on machines without CUDA.
//!
//! | item | what |
//! |---|---|
//! | [`probe`] | is NCCL usable here (library, driver, device)? never panics |
//! | [`NcclSearch`], [`find_library`] | where the NCCL library is looked for (`CCOL_NCCL_LIB`, linker path, pip wheels) |
//! | [`UniqueId`], [`publish_unique_id`], [`fetch_unique_id`] | the 128-byte bootstrap id, through a core `Store` |
//! | [`NcclTransport`] | core's `Transport`: variable-length all_gather, barrier, send/recv (broadcast is core's, over all_gather) |
//! | [`FileStore`] | a core `Store` on a directory shared by the ranks (no native code) |
//! | [`from_env`] | a transport from torchrun's environment; device = `LOCAL_RANK` |
//!
//! Run-time requirements: the NVIDIA driver (`libcuda.so.1`), a GPU per rank
//! (NCCL refuses two ranks on one GPU: multi-rank needs ≥ 2 GPUs), and NCCL
//! ≥ 2.28 — `pip install nvidia-nccl-cu13==2.29.7` (the version torch 2.13's
//! wheels use) is found without further set-up; elsewhere set
//! `CCOL_NCCL_LIB=/path/to/libnccl.so.2`.
//!
//! ## Deadlines: what is guaranteed
//! Communicators are created non-blocking (`ncclConfig_t.blocking = 0`).
//! Every operation enqueues NCCL work on the transport's own stream, then
//! polls the stream and `ncclCommGetAsyncError` (sleeping 20 µs – 1 ms
//! between polls) until done or until the deadline. At the deadline this
//! rank checks in to core's store post-mortem
//! ([`PostMortem`](compiler_collectives_core::transport::toolkit::PostMortem): "I was
//! in this operation"), aborts the communicator (`ncclCommAbort`), gives the
//! stream up to 500 ms to drain, and waits until
//! [`NcclOptions::post_mortem`] (250 ms by default) after its check-in for
//! the other ranks'. It then returns
//! [`Error::Timeout`](compiler_collectives_core::Error::Timeout) naming
//! every rank without a check-in (NCCL itself cannot tell which rank is
//! missing), with those that had shut down or aborted grouped by how, or
//! [`Error::PeerLost`](compiler_collectives_core::Error::PeerLost) when all
//! of them had. So a call returns at most about deadline + max(abort +
//! 500 ms, 250 ms) after it started, and the transport is unusable
//! afterwards. A rank that was itself blocked by a third one counts as
//! present: only ranks that never reached a blocked NCCL call are named.
//!
//! A rank that shuts down or aborts records that in the store; a peer whose
//! operation has waited 20 ms checks for such records every 100 ms. Once it
//! sees one it checks in too and waits until every rank is accounted for
//! (checked in, or left) — so the error names every rank that left, not the
//! first it noticed — or until its deadline plus the window. Operations that
//! complete in time never touch the store. What is not guaranteed: a peer that hangs
//! *inside* the CUDA driver (a crashed GPU) can still block `ncclCommAbort`;
//! buffers of work still running 500 ms after the abort are leaked rather
//! than freed under the kernel; and ranks with very different deadlines can
//! name a late (not absent) rank.
//!
//! ```no_run
//! use compiler_collectives_core::{Channel, Transport};
//! // Under `torchrun --standalone --nproc-per-node 2 --no-python prog` (a
//! // fresh run id per launch), or with CCOL_NCCL_STORE=/shared/fresh-dir:
//! let transport = compiler_collectives_nccl::from_env()?;
//! let mut channel = Channel::new(std::sync::Arc::new(transport))?;
//! # Ok::<(), compiler_collectives_core::Error>(())
//! ```
//!
//! Unsafe code lives only in the private `sys` module (the resolved NCCL
//! entry points, and safe handles over them and over cudarc's CUDA calls);
//! every other module is safe code.

#![deny(unsafe_code)]

mod bootstrap;
mod env;
mod probe;
#[allow(unsafe_code)]
mod sys;
mod transport;

pub use bootstrap::{fetch_unique_id, publish_unique_id, UniqueId, UNIQUE_ID_BYTES};
/// The pure-Rust directory store, now in core (`compiler_collectives_core::FileStore`).
pub use compiler_collectives_core::FileStore;
pub use env::{from_env, EnvConfig, NcclStore, STORE_ENV};
pub use probe::{
    cache_dir, device_count, find_library, library, probe, Availability, Found, NcclSearch,
    NCCL_LIB_ENV,
};
pub use sys::{result_name, NcclLib, UNHANDLED_CUDA_ERROR};
pub use transport::{Communicator, NcclOptions, NcclTransport};

/// The pip package that provides NCCL 2.29 (`libnccl.so.2`) for CUDA 13.
pub const NCCL_WHEEL: &str = "nvidia-nccl-cu13==2.29.7";

/// Errors of the NCCL backend. Converted into core's
/// [`Error::Backend`](compiler_collectives_core::Error::Backend) keeping the
/// text and this value as the source.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NcclError {
    /// No NCCL library was found.
    #[error("NCCL library not found: install it with `pip install {NCCL_WHEEL}` (found in site-packages automatically) or set {NCCL_LIB_ENV} to libnccl.so.2 or its directory; tried: {}", tried.join("; "))]
    LibraryNotFound {
        /// Every place tried, with why it did not do.
        tried: Vec<String>,
    },
    /// A library file was found but does not open or lacks an entry point.
    #[error("cannot load NCCL from {path}: {message}")]
    LibraryLoad {
        /// The file or name.
        path: String,
        /// The loader's message.
        message: String,
    },
    /// The library is older than this crate's `ncclConfig_t` layout.
    #[error(
        "NCCL at {path} is version code {found}; need 2.28 or newer (pip install {NCCL_WHEEL})"
    )]
    Version {
        /// The file.
        path: String,
        /// `ncclGetVersion`'s code (0 when it failed).
        found: i32,
    },
    /// The CUDA driver library is missing.
    #[error("CUDA driver not found (libcuda.so.1): install the NVIDIA driver, or run on a machine with NVIDIA GPUs")]
    DriverNotFound,
    /// The driver is there but no device can be used.
    #[error("no usable CUDA device: {detail}; check `nvidia-smi` and CUDA_VISIBLE_DEVICES")]
    NoDevice {
        /// The driver's complaint.
        detail: String,
    },
    /// The wanted device ordinal (`LOCAL_RANK`) is not below the device count.
    #[error("device {device} requested (LOCAL_RANK) but only {count} visible: NCCL needs one GPU per rank on a node")]
    DeviceOutOfRange {
        /// The ordinal asked for.
        device: usize,
        /// Devices visible.
        count: usize,
    },
    /// NCCL returned an error.
    #[error("{operation} failed: {name} ({code}): {text}{}", if last_error.is_empty() { String::new() } else { format!("; NCCL: {last_error}") })]
    Nccl {
        /// The NCCL call.
        operation: String,
        /// NCCL's result code.
        code: i32,
        /// Its name in nccl.h.
        name: &'static str,
        /// `ncclGetErrorString`.
        text: String,
        /// `ncclGetLastError`.
        last_error: String,
    },
    /// A CUDA driver call failed.
    #[error("{operation} failed: {message}")]
    Cuda {
        /// The driver call.
        operation: String,
        /// The driver's error name and text.
        message: String,
    },
    /// Bytes that should be a unique id are not.
    #[error("invalid NCCL unique id: {0}")]
    InvalidId(String),
    /// The environment does not describe a process group.
    #[error("{0}")]
    Env(String),
}

impl NcclError {
    /// NCCL's result code, for errors NCCL returned.
    pub fn nccl_code(&self) -> Option<i32> {
        match self {
            NcclError::Nccl { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub(crate) fn cuda(operation: &str, e: &cudarc::driver::DriverError) -> Self {
        NcclError::Cuda {
            operation: operation.to_owned(),
            message: driver_text(e),
        }
    }
}

impl From<NcclError> for compiler_collectives_core::Error {
    fn from(e: NcclError) -> Self {
        match e {
            NcclError::Env(m) => compiler_collectives_core::Error::InvalidArgument(m),
            other => compiler_collectives_core::Error::backend("nccl", other),
        }
    }
}

/// The driver's name and text of an error (`CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected`).
pub(crate) fn driver_text(e: &cudarc::driver::DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name}: {text}")
}
