//! # compiler-collectives-core
//!
//! Make the JIT compilers of every rank in a distributed job take the *same*
//! compile-time decisions — static or dynamic dimensions, autotuning winners,
//! recompile or not — by exchanging what each rank saw over a collective and
//! merging it with a deterministic, order-independent join.
//!
//! This crate holds the semantics and the protocol, and no engine. Its
//! modules are grouped by concept, each group depending only on the groups
//! above it in this table (a test, `tests/module_graph.rs`, fails on a
//! `crate::` path from a group to one below it):
//!
//! | group | what |
//! |---|---|
//! | `error` | [`Error`]: one type for every failure, with the ranks it names |
//! | [`transport`] | the [`Transport`] and [`Store`] traits backends implement; the toolkit they share; in-process ranks |
//! | [`launch`] | torchrun's environment ([`RunEnv`]) and TorchElastic error files |
//! | [`protocol`] | [`Channel`]: one exchange per decision point; the wire format; the [`Join`] trait; traces |
//! | [`decisions`] | the decision kinds: the size-entry lattice, shapes, votes, must-agree values, autotuning |
//! | [`cache`] | the reference compile cache a JIT front-end can use as is |
//! | [`persistence`] | profiles (PGO), artifacts and cache-hit agreement, the cache directory |
//!
//! Every decision kind — votes, shapes, must-agree values, autotuning timings —
//! is a [`Join`] exchanged by the same protocol;
//! [`decisions::votes`] lists them, and each module opens with a runnable
//! example over in-process ranks.
//!
//! Backends live in their own crates (Gloo, NCCL, libtorch c10d); the facade
//! crate `compiler-collectives` re-exports this one and the backends behind
//! features.
//!
//! Options and limits, here and in every crate of the workspace, are built one
//! way: `X::default().with_…(…)` ([`ChannelOptions`],
//! [`CacheOptions`](cache::CacheOptions), [`Limits`](protocol::envelope::Limits),
//! …): one `with_<field>` setter per documented public field, and the struct is
//! `#[non_exhaustive]`, so a new knob is never a breaking change.
//!
//! ## Example: two ranks agree that dimension 0 is dynamic
//!
//! ```
//! use compiler_collectives_core::{Channel, InProcessGroup, Transport, decisions::shapes::{FrameState, Observation}};
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

pub mod cache;
pub mod decisions;
mod error;
pub mod launch;
pub mod persistence;
pub mod protocol;
pub mod transport;

pub use error::{
    counted, group_ranks, with_sources, DecodeError, Error, ErrorKind, ExchangeInfo, FirstFailure,
    PeerLoss, Poison, RankGroup, RankList, RankMap, Result,
};
pub use launch::runenv::RunEnv;
pub use protocol::channel::{
    Channel, ChannelOptions, ExchangeOptions, FlatReason, Gathered, PerRank, Topology,
};
pub use protocol::join::Join;
pub use transport::filestore::FileStore;
pub use transport::inprocess::{InProcessGroup, InProcessStore, InProcessTransport};
pub use transport::{Capabilities, Deadline, Store, Transport};
