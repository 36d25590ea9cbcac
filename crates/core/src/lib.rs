//! # compiler-collectives-core
//!
//! Make the JIT compilers of every rank in a distributed job take the *same*
//! compile-time decisions — static or dynamic dimensions, autotuning winners,
//! recompile or not — by exchanging what each rank saw over a collective and
//! merging it with a deterministic, order-independent join.
//!
//! This crate holds the semantics and the protocol, and no engine:
//!
//! | module | what |
//! |---|---|
//! | [`lattice`] | the size-entry lattice (PyTorch's `FrameStateSizeEntry`) and stride canonicalisation |
//! | [`shapes`] | observations, per-frame state, per-dimension decisions, overrides |
//! | [`join`] | the [`Join`] trait every decision kind implements; vote kinds |
//! | [`envelope`] | the versioned wire format with strict, bounded decoding |
//! | [`protocol`] | [`Channel`]: one exchange per decision point, checks, deadlines, fast path |
//! | [`transport`] | the [`Transport`] and [`Store`] traits backends implement |
//! | [`hier`] | the hierarchical (tree) exchange for large worlds |
//! | [`compact`] | the one-varint wire form of lattice atoms |
//! | [`counting`] | a transport wrapper that counts bytes received (benchmarks, tests) |
//! | [`inprocess`] | an engine whose ranks are threads (tests, simulations, the template for backends) |
//! //! | [`cache`] | the reference compile cache a JIT front-end can use as is |
//! //! | [`profile`] | profiles: decisions persisted per job across runs (PGO), crash-safe store |
//! | [`trace`] | one `tracing` span per exchange and JSON-lines trace files per rank |
//! | [`agree`] | must-agree values (compiler version, config hash, code fingerprint) |
//! | [`autotune`] | best-choice and sharded autotuning: the same winner per op on every rank |
//! | [`artifacts`] | a persistent artifact cache and cache-hit agreement |
//! | [`runenv`] | torchrun's environment ([`RunEnv`]), parsed once for every backend |
//!
//! Every decision kind — votes, shapes, must-agree values, autotuning timings —
//! is a [`Join`] exchanged by the same protocol; [`join`] lists them, and each
//! module above opens with a runnable example over in-process ranks.
//!
//! Backends live in their own crates (Gloo, NCCL, libtorch c10d); the facade
//! crate `compiler-collectives` re-exports this one and the backends behind
//! features.
//!
//! ## Example: two ranks agree that dimension 0 is dynamic
//!
//! ```
//! use compiler_collectives_core::{Channel, InProcessGroup, Transport, shapes::{FrameState, Observation}};
//!
//! let ranks = InProcessGroup::create(2)?;
//! let handles: Vec<_> = ranks.into_iter().map(|t| std::thread::spawn(move || {
//!     let batch = if t.rank() == 0 { 5 } else { 6 };
//!     let mut channel = Channel::new(std::sync::Arc::new(t))?;
//!     let mut seen = FrameState::new();
//!     seen.record("x", &Observation::tensor([batch, 10]));
//!     let merged = channel.exchange("train_step", &seen)?.into_merged();
//!     Ok::<_, compiler_collectives_core::Error>(merged.get("x").size.to_string())
//! })).collect();
//! for h in handles {
//!     assert_eq!(h.join().unwrap()?, "(Dyn,10)");
//! }
//! # Ok::<(), compiler_collectives_core::Error>(())
//! ```
#![forbid(unsafe_code)]

pub mod agree;
pub mod artifacts;
pub mod autotune;
pub mod cache;
pub mod compact;
pub mod counting;
pub mod envelope;
mod error;
pub mod filestore;
pub mod hier;
pub mod inprocess;
pub mod join;
pub mod lattice;
pub mod paths;
pub mod profile;
pub mod protocol;
pub mod runenv;
pub mod shapes;
pub mod toolkit;
pub mod torchelastic;
pub mod trace;
pub mod transport;

pub use error::{
    counted, group_ranks, DecodeError, Error, ExchangeInfo, PeerLoss, RankGroup, RankList, Result,
};
pub use filestore::FileStore;
pub use inprocess::{InProcessGroup, InProcessStore, InProcessTransport};
pub use join::Join;
pub use protocol::{Channel, ChannelOptions, ExchangeOptions, FlatReason, Gathered, Topology};
pub use runenv::RunEnv;
pub use transport::{Capabilities, Deadline, Store, Transport};
