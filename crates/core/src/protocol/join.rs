//! [`Join`]: what the exchange needs of a value — a deterministic,
//! order-independent merge. The protocol owns the trait; every decision kind
//! (module [`crate::decisions`]) implements it. Its payload form (the
//! canonical postcard bytes) is [`encode_payload`] / [`decode_payload`].

use crate::error::{DecodeError, Error};
use crate::protocol::envelope;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// A decision kind: a value with a deterministic, order-independent merge.
///
/// A kind gives its name ([`Join::KIND`]) and its merge ([`Join::join`]);
/// that is all an implementation outside this crate writes. The exchange
/// sends the value's canonical [`postcard`] encoding and joins the values it
/// reads back, so the type must serialise deterministically (use
/// `BTreeMap`, not `HashMap`).
///
/// # Laws (checked by property tests for the kinds in this crate)
/// - commutative: `a ⊔ b = b ⊔ a`
/// - associative: `(a ⊔ b) ⊔ c = a ⊔ (b ⊔ c)`
/// - idempotent: `a ⊔ a = a` (the fast path relies on it)
///
/// # The wire hooks (sealed)
/// How a kind's payload is read, written and joined from its bytes is a set
/// of hidden methods whose last argument is a `Sealed` token that only this
/// crate can name, so only this crate can call or override them. Every kind
/// gets postcard's (decode, then [`Join::join`]); the frame state overrides
/// them to join straight from the bytes
/// ([`FrameState::join_encoded`](crate::decisions::shapes::FrameState::join_encoded),
/// [`FrameState::join_payloads`](crate::decisions::shapes::FrameState::join_payloads)),
/// under a byte-exactness contract its property tests check and no other
/// kind could be held to.
///
/// A kind is its name and its merge:
/// ```
/// use compiler_collectives_core::Join;
/// #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
/// struct Widest(u32);
/// impl Join for Widest {
///     const KIND: &'static str = "example.widest";
///     fn join(&mut self, other: &Self) {
///         self.0 = self.0.max(other.0);
///     }
/// }
/// let bytes = compiler_collectives_core::protocol::encode_payload(&Widest(7))?;
/// assert_eq!(bytes, [7]); // postcard's varint
/// # Ok::<(), compiler_collectives_core::Error>(())
/// ```
/// and a kind outside this crate cannot take over a wire hook:
/// ```compile_fail
/// # use compiler_collectives_core::{DecodeError, Join};
/// # #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
/// # struct Widest(u32);
/// impl Join for Widest {
///     const KIND: &'static str = "example.widest";
///     fn join(&mut self, other: &Self) {}
///     fn read_payload(
///         payload: &[u8],
///         _: compiler_collectives_core::protocol::join::Sealed,
///     ) -> Result<Self, DecodeError> {
///         Ok(Widest(0))
///     }
/// }
/// ```
pub trait Join: Clone + Debug + Send + Serialize + DeserializeOwned {
    /// Stable name of the kind, carried in every envelope and checked to be
    /// the same on every rank, e.g. `"shape.frame_state"`.
    const KIND: &'static str;

    /// `self ← self ⊔ other`.
    fn join(&mut self, other: &Self);

    /// `self ← self ⊔ decode(payload)`, where `payload` is another rank's
    /// canonical payload, strictly decoded (every byte consumed). On an
    /// error `self` may be partly joined; the exchange then discards it.
    /// An override accepts exactly the payloads [`Join::read_payload`]
    /// accepts and gives the same result.
    #[doc(hidden)]
    fn join_encoded(&mut self, payload: &[u8], _: Sealed) -> Result<(), DecodeError> {
        let other = Self::read_payload(payload, Sealed(()))?;
        self.join(&other);
        Ok(())
    }

    /// `self ← self ⊔ every payload`: `payloads` holds every rank's
    /// canonical payload, index = rank, and `payloads[own]` is the encoding
    /// of `self`. Every payload is read in rank order (`self`'s own too, so
    /// that a rank whose bytes do not read fails like its peers) before
    /// `self` changes: on an error `self` is unchanged and the error carries
    /// the index of the first payload that does not read. An override
    /// accepts exactly what [`Join::read_payload`] accepts and gives the
    /// same result; it may skip reading `payloads[own]` only where the
    /// kind's writer cannot write bytes its reader refuses.
    #[doc(hidden)]
    fn join_payloads(
        &mut self,
        own: usize,
        payloads: &[&[u8]],
        _: Sealed,
    ) -> Result<(), (usize, DecodeError)> {
        let mut others = Vec::with_capacity(payloads.len().saturating_sub(1));
        for (i, p) in payloads.iter().enumerate() {
            let value = Self::read_payload(p, Sealed(())).map_err(|e| (i, e))?;
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
    /// every byte consumed ([`DecodeError::Payload`] naming the kind). An
    /// override accepts exactly the same payloads with the same values.
    #[doc(hidden)]
    fn read_payload(payload: &[u8], _: Sealed) -> Result<Self, DecodeError> {
        envelope::decode_postcard(Self::KIND, payload)
    }

    /// Appends the canonical postcard encoding to `out` (an error is the
    /// encoder's message, naming the kind). An override writes exactly
    /// postcard's bytes.
    #[doc(hidden)]
    fn write_payload(&self, out: &mut Vec<u8>, _: Sealed) -> Result<(), String> {
        postcard::serialize_with_flavor(self, Append(out))
            .map_err(|e| format!("cannot encode the value of kind {}: {e}", Self::KIND))
    }
}

pub(crate) use sealed::Sealed;

mod sealed {
    /// The token that seals [`Join`](super::Join)'s wire hooks: a type other
    /// crates cannot name, so they can neither call nor override a method
    /// that takes it. Made only inside this crate, as `Sealed(())`.
    #[derive(Clone, Copy, Debug)]
    pub struct Sealed(pub(crate) ());
}

/// Appends `value`'s canonical postcard encoding to `out` (the payload the
/// exchange sends, written in place; [`encode_payload`] into a new buffer).
///
/// # Errors
/// The encoder's message, naming the kind.
pub fn encode_payload_into<J: Join>(value: &J, out: &mut Vec<u8>) -> Result<(), String> {
    value.write_payload(out, Sealed(()))
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
pub fn encode_payload<J: Join>(value: &J) -> crate::error::Result<Vec<u8>> {
    let mut out = Vec::new();
    value
        .write_payload(&mut out, Sealed(()))
        .map_err(Error::InvalidArgument)?;
    Ok(out)
}

/// Decodes payload bytes strictly (all bytes consumed) as an exchange
/// would ([`Join::read_payload`]).
///
/// # Errors
/// [`Error::Decode`] with no rank.
pub fn decode_payload<J: Join>(bytes: &[u8]) -> crate::error::Result<J> {
    J::read_payload(bytes, Sealed(()))
        .map_err(|reason: DecodeError| Error::Decode { rank: None, reason })
}
