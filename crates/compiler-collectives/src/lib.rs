//! # compiler-collectives
//!
//! The facade crate: everything of [`compiler_collectives_core`] at the top
//! level, and the backends behind additive features.
//!
//! | feature | backend | status |
//! |---|---|---|
//! | *(none)* | in-process (threads), for tests and simulations | available |
//! | *(none)* | c10d's TCPStore, client and server in pure Rust (module `tcpstore`): torchrun's agent store | available |
//! | `gloo` | Gloo over TCP, CPU (module `gloo`; needs `libgloo-dev`) | available |
//! | `nccl` | NCCL via cudarc, GPU (module `nccl`; CUDA and NCCL loaded at run time) | available |
//! | `tch` | libtorch c10d process groups for tch-rs programs (module `tch`; needs `LIBTORCH`, torch 2.13.0, at build time, and `$LIBTORCH/lib` on the library path at run time, as tch-rs does) | available |
//!
//! ```
//! use compiler_collectives::{Channel, InProcessGroup, decisions::votes::AnyVote};
//! let t = InProcessGroup::create(1)?.pop().unwrap();
//! let mut ch = Channel::new(std::sync::Arc::new(t))?;
//! assert!(ch.exchange("f", &AnyVote(true))?.any());
//! # Ok::<(), compiler_collectives::Error>(())
//! ```
#![forbid(unsafe_code)]

pub use compiler_collectives_core::*;

/// c10d's TCPStore in pure Rust: client and server (always built: no native code).
pub use compiler_collectives_tcpstore as tcpstore;

/// The Gloo transport (feature `gloo`).
#[cfg(feature = "gloo")]
pub use compiler_collectives_gloo as gloo;

/// The NCCL transport (feature `nccl`).
#[cfg(feature = "nccl")]
pub use compiler_collectives_nccl as nccl;

/// libtorch's c10d process groups and a transport over them (feature `tch`).
#[cfg(feature = "tch")]
pub use compiler_collectives_tch as tch;
