//! The exchange protocol: what travels ([`envelope`], [`compact`]), the
//! contract a value meets ([`join::Join`]), and the [`Channel`] that runs one
//! exchange per decision point, flat ([`channel`]) or as a tree ([`tree`]),
//! with one set of checks and messages for both (`checks`), recording each
//! exchange in a trace file ([`trace`]).
//!
//! | module | what |
//! |---|---|
//! | [`channel`] | [`Channel`]: one exchange per call, its checks and its failure policy |
//! | [`options`] | [`ChannelOptions`], [`ExchangeOptions`], deadlines and topology |
//! | [`flat`] | the flat exchange: the slot round and its fast path, the second round, the join |
//! | [`gathered`] | [`Gathered`], what an exchange returns |
//! | [`tree`] | the hierarchical (binomial tree) exchange for large worlds |
//! | [`envelope`] | the versioned wire format with strict, bounded decoding |
//! | [`compact`] | the one-varint wire form of lattice atoms |
//! | [`join`] | the [`Join`] trait every decision kind implements |
//! | [`trace`] | one `tracing` span per exchange and JSON-lines trace files per rank |
//!
//! Depends on: [`crate::transport`] (the bytes) and the error type; never on
//! a decision kind (docs/protocol.md).

pub mod channel;
pub(crate) mod checks;
pub mod compact;
pub mod envelope;
pub mod flat;
pub mod gathered;
pub mod join;
pub mod options;
pub mod trace;
pub mod tree;

/// What one exchange's rounds work with, whichever the topology (the flat
/// rounds of [`flat`], the tree's of [`tree`]): the transport, the limits,
/// whether the digest fast path is on, the one deadline of every round, and
/// the bytes moved so far (for the trace).
pub(crate) struct Rounds<'a> {
    pub(crate) transport: &'a dyn crate::transport::Transport,
    pub(crate) limits: &'a envelope::Limits,
    pub(crate) fast_path: bool,
    pub(crate) deadline: crate::transport::Deadline,
    pub(crate) traffic: trace::Traffic,
}

pub use channel::Channel;
pub use gathered::{Gathered, PerRank};
pub use join::{decode_payload, encode_payload, encode_payload_into, Join};
pub use options::{
    hierarchical_from_env, parse_timeout_secs, timeout_from_env, ChannelOptions, ExchangeOptions,
    FlatReason, Topology, DEFAULT_TIMEOUT, HIERARCHICAL_FROM_ENV, SLOT_ROUND_BYTES, TIMEOUT_ENV,
};
