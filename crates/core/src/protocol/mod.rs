//! The exchange protocol: what travels ([`envelope`], [`compact`]), the
//! contract a value meets ([`join::Join`]), and the [`Channel`] that runs one
//! exchange per decision point, flat ([`channel`]) or as a tree ([`tree`]),
//! with one set of checks and messages for both (`checks`), recording each
//! exchange in a trace file ([`trace`]).
//!
//! | module | what |
//! |---|---|
//! | [`channel`] | [`Channel`], its options, deadlines, the flat exchange and its fast path |
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
pub mod join;
pub mod trace;
pub mod tree;

pub use channel::{
    parse_timeout_secs, timeout_from_env, Channel, ChannelOptions, ExchangeOptions, FlatReason,
    Gathered, Topology, DEFAULT_TIMEOUT, SLOT_ROUND_BYTES, TIMEOUT_ENV,
};
pub use join::{decode_payload, encode_payload, encode_payload_into, Join};
