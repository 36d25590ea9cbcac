//! # compiler-collectives-tch
//!
//! libtorch's c10d process groups for tch-rs programs, and a compiler-collectives
//! [`Transport`] over them, so that compiler collectives run over the same
//! process-group machinery a training program uses.
//!
//! | item | what |
//! |---|---|
//! | [`C10dStore`], [`TcpStoreOptions`] | c10d's `TCPStore` (server or client) and `PrefixStore`; a core [`Store`] whose calls end at their deadlines ([`C10dStore`](C10dStore#deadlines-what-bounds-each-call) says what bounds each) |
//! | [`C10dProcessGroup`] | c10d's `ProcessGroupGloo`: all_gather, all_reduce, broadcast, barrier, send, recv on [`tch::Tensor`], each with a timeout |
//! | [`C10dTransport`] | core's [`Transport`] over a process group: variable-length all_gather as a lengths round then a padded round; a store post-mortem names the missing or lost ranks |
//! | [`from_env`] | a transport from torchrun's environment |
//! | [`observe`] | a tensor's sizes and strides as an [`Observation`] |
//! | [`C10dError`] | the backend's errors, with libtorch's text; converts into core's `Error` |
//!
//! `ProcessGroupNCCL` is not built into this crate's shim (it needs CUDA and
//! NCCL headers at build time and a GPU at run time); GPU jobs use the
//! `compiler-collectives-nccl` crate.
//!
//! Layout: `sys` holds the C ABI of the shim (`shim/ccol_c10d.h`, whose
//! status codes the build script turns into Rust) and every FFI call of the
//! crate, behind safe handles; `store`, `group`, `transport`, `env` and
//! `error` are safe code over it.
//!
//! Build requirement: libtorch 2.13.0 (`eval "$(scripts/setup-torch.sh)"`
//! exports `LIBTORCH`).
//!
//! ```no_run
//! use compiler_collectives_core::{Channel, Transport};
//! // Under `ccol run --nproc-per-node 2 -- prog` or `torchrun --no-python prog`:
//! let transport = compiler_collectives_tch::from_env()?;
//! let mut channel = Channel::new(std::sync::Arc::new(transport))?;
//! # Ok::<(), compiler_collectives_core::Error>(())
//! ```

#![deny(unsafe_code)]

mod env;
mod error;
mod group;
mod store;
#[allow(unsafe_code)]
mod sys;
mod transport;

pub use env::{from_env, C10dJob};
pub use error::C10dError;
pub use group::{C10dProcessGroup, ReduceOp};
pub use store::{C10dStore, TcpStoreOptions, DEFAULT_STORE_TIMEOUT};
pub use transport::C10dTransport;

use compiler_collectives_core::decisions::shapes::Observation;
#[cfg(doc)]
use compiler_collectives_core::{Store, Transport};
use tch::Tensor;

/// A tensor's sizes and strides (in elements) as an [`Observation`].
pub fn observe(t: &Tensor) -> Observation {
    let to_u64 = |v: Vec<i64>| {
        v.into_iter()
            .map(|x| u64::try_from(x).unwrap_or(0))
            .collect::<Vec<u64>>()
    };
    Observation::strided(to_u64(t.size()), to_u64(t.stride()))
}
