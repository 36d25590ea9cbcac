//! [`Join`]: what the exchange needs of a value — a deterministic,
//! order-independent merge. The protocol owns the trait; every decision kind
//! (module [`crate::decisions`]) implements it. Its payload form (the
//! canonical postcard bytes) is [`encode_payload`] / [`decode_payload`].

use crate::error::{DecodeError, Error, Result};
use crate::protocol::envelope;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// A decision kind: a value with a deterministic, order-independent merge.
///
/// # Laws (checked by property tests for the kinds in this crate)
/// - commutative: `a ⊔ b = b ⊔ a`
/// - associative: `(a ⊔ b) ⊔ c = a ⊔ (b ⊔ c)`
/// - idempotent: `a ⊔ a = a` (the fast path relies on it)
///
/// The wire form is the value's canonical [`postcard`] encoding, so the type
/// must serialise deterministically (use `BTreeMap`, not `HashMap`).
pub trait Join: Clone + Debug + Send + Serialize + DeserializeOwned {
    /// Stable name of the kind, carried in every envelope and checked to be
    /// the same on every rank, e.g. `"shape.frame_state"`.
    const KIND: &'static str;

    /// `self ← self ⊔ other`.
    fn join(&mut self, other: &Self);
}

/// Encodes a value as the payload bytes an exchange would send (for tests,
/// benchmarks and tools).
///
/// # Errors
/// [`Error::InvalidArgument`] if the value cannot be encoded.
pub fn encode_payload<J: Join>(value: &J) -> Result<Vec<u8>> {
    postcard::to_allocvec(value)
        .map_err(|e| Error::InvalidArgument(format!("cannot encode {}: {e}", J::KIND)))
}

/// Decodes payload bytes strictly (all bytes consumed).
///
/// # Errors
/// [`Error::Decode`] with no rank.
pub fn decode_payload<J: Join>(bytes: &[u8]) -> Result<J> {
    envelope::decode_payload(J::KIND, bytes)
        .map_err(|reason: DecodeError| Error::Decode { rank: None, reason })
}
