//! # compiler-collectives-harness
//!
//! What the `ccol` CLI, the demo, the benchmarks, the examples and the tests
//! run on top of `compiler-collectives-core`, kept out of the core so that
//! the core holds only the semantics, the protocol and the transport traits:
//!
//! | module | what |
//! |---|---|
//! | [`scenario`] | scenario files (one multi-rank job each, docs/scenarios.md), the program they stand for, and their in-process runner with the oracle's output format |
//! | [`corpus`] | the demo's text corpus: loading a directory, tokenisers, per-rank batches as scenario steps |
//! | [`benchmark`] | the measurement loops of `ccol bench` (any transport) and the scale simulation |
//! | [`heap`] | the counting allocator behind `ccol bench`'s allocations per exchange |
//! | [`logging`] | the `tracing` subscriber every program installs: `RUST_LOG`, `CCOL_LOG_FORMAT=json`, stderr |
//! | [`args`] | clap value parsers with the same messages everywhere (`at_least_one`) |
//!
//! The crate is not published: a JIT front-end depends on the core (or the
//! facade crate `compiler-collectives`) and never on this one. Its only
//! unsafe code is the allocator of [`heap`].
#![deny(unsafe_code)]

pub mod args;
pub mod benchmark;
pub mod corpus;
#[allow(unsafe_code)]
pub mod heap;
pub mod logging;
pub mod scenario;
