//! Decisions: the values ranks exchange and how two of them merge. Each kind
//! implements [`Join`](crate::Join) (owned by [`crate::protocol`]) and is
//! exchanged by [`Channel::exchange`](crate::Channel::exchange); the table of
//! kinds is in [`votes`].
//!
//! | module | what |
//! |---|---|
//! | [`lattice`] | the size-entry lattice (PyTorch's `FrameStateSizeEntry`) and stride canonicalisation |
//! | [`shapes`] | observations, per-frame state, per-dimension decisions, overrides |
//! | `frame_wire` | a frame state's storage: its entries in their canonical wire form (postcard's bytes exactly), read strictly, joined by merging bytes |
//! | [`votes`] | the simple vote kinds (any, all, max, min) and the table of every kind |
//! | [`agree`] | must-agree values (compiler version, config hash, code fingerprint) |
//! | [`autotune`] | best-choice and sharded autotuning: the same winner per op on every rank |
//!
//! Depends on: [`crate::protocol`] (the trait and the channel a kind is
//! exchanged on) and the error type; nothing here does I/O but through a
//! [`Channel`](crate::Channel).

pub mod agree;
pub mod autotune;
mod frame_wire;
pub mod lattice;
pub mod shapes;
pub mod votes;
