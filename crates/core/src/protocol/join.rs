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

    /// `self ← self ⊔ decode(payload)`, where `payload` is another rank's
    /// canonical postcard encoding, strictly decoded (every byte consumed).
    /// The flat exchange joins every rank's payload with it, so a kind can
    /// join straight from the wire without building each rank's value.
    ///
    /// The provided version decodes, then joins. An override must accept
    /// exactly the payloads [`decode_payload`] accepts and give the same
    /// result (`compiler_collectives_core`'s frame state does: its property
    /// tests check both). On an error `self` may be partly joined; the
    /// exchange then discards it.
    ///
    /// # Errors
    /// [`DecodeError::Payload`] naming the kind.
    fn join_encoded(&mut self, payload: &[u8]) -> std::result::Result<(), DecodeError> {
        let other = Self::read_payload(payload)?;
        self.join(&other);
        Ok(())
    }

    /// `self ← self ⊔ every payload`: `payloads` holds every rank's
    /// canonical payload, index = rank, and `payloads[own]` is the encoding
    /// of `self` ([`Channel::exchange_in_place`](crate::Channel::exchange_in_place)
    /// calls it only after checking that the gathered copy of this rank's
    /// envelope is the one it sent). Every payload is read strictly, in rank order,
    /// before `self` changes: on an error `self` is unchanged and the error
    /// carries the index of the first payload that does not read.
    ///
    /// The provided version reads every payload (`self`'s own too, so that a
    /// rank whose bytes do not read fails like its peers), then joins the
    /// others. An override must accept exactly the payloads
    /// [`Join::read_payload`] accepts and give the same result; it may skip
    /// reading `payloads[own]` only where the kind's writer cannot write
    /// bytes its reader refuses (the frame state's override relies on
    /// that, and its property tests check both).
    ///
    /// # Errors
    /// `(index, DecodeError::Payload)` for the first payload that does not read.
    fn join_payloads(
        &mut self,
        own: usize,
        payloads: &[&[u8]],
    ) -> std::result::Result<(), (usize, DecodeError)> {
        let mut others = Vec::with_capacity(payloads.len().saturating_sub(1));
        for (i, p) in payloads.iter().enumerate() {
            let value = Self::read_payload(p).map_err(|e| (i, e))?;
            if i != own {
                others.push(value);
            }
        }
        for other in &others {
            self.join(other);
        }
        Ok(())
    }

    /// Reads a payload: the value whose canonical postcard encoding it is,
    /// every byte consumed. The provided version is postcard's; an override
    /// must accept exactly the same payloads with the same values.
    ///
    /// # Errors
    /// [`DecodeError::Payload`] naming the kind.
    fn read_payload(payload: &[u8]) -> std::result::Result<Self, DecodeError> {
        envelope::decode_postcard(Self::KIND, payload)
    }

    /// Appends the canonical postcard encoding to `out`. The provided
    /// version is postcard's; an override must write exactly its bytes.
    ///
    /// # Errors
    /// The encoder's message, naming the kind.
    fn write_payload(&self, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        postcard::serialize_with_flavor(self, Append(out))
            .map_err(|e| format!("cannot encode the value of kind {}: {e}", Self::KIND))
    }
}

/// Appends `value`'s canonical postcard encoding to `out` (the payload the
/// exchange sends, written in place; [`encode_payload`] into a new buffer).
///
/// # Errors
/// The encoder's message, naming the kind.
pub fn encode_payload_into<J: Join>(
    value: &J,
    out: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    value.write_payload(out)
}

/// postcard's output into the end of an existing buffer.
struct Append<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for Append<'_> {
    type Output = ();

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}
/// Encodes a value as the payload bytes an exchange would send
/// ([`Join::write_payload`]; for tests, benchmarks and tools).
///
/// # Errors
/// [`Error::InvalidArgument`] if the value cannot be encoded.
pub fn encode_payload<J: Join>(value: &J) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    value
        .write_payload(&mut out)
        .map_err(Error::InvalidArgument)?;
    Ok(out)
}

/// Decodes payload bytes strictly (all bytes consumed) as an exchange
/// would ([`Join::read_payload`]).
///
/// # Errors
/// [`Error::Decode`] with no rank.
pub fn decode_payload<J: Join>(bytes: &[u8]) -> Result<J> {
    J::read_payload(bytes).map_err(|reason: DecodeError| Error::Decode { rank: None, reason })
}
