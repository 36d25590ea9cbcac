//! The wire format: a versioned envelope with a fixed header, and the
//! fixed-size digest message of the fast path. Decoding is strict and
//! bounded by [`Limits`].
//!
//! ```text
//! envelope (message type 1), little-endian:
//!   0  magic        4 bytes  "CCOL"
//!   4  version      u16      WIRE_VERSION
//!   6  msg type     u16      1
//!   8  seq          u64      exchange sequence number
//!  16  kind len     u32      decision kind, UTF-8
//!  20  key len      u32      compile key, UTF-8
//!  24  config len   u32      configuration that must agree, UTF-8
//!  28  payload len  u32      postcard encoding of the decision value
//!  32  kind, key, config, payload — exactly the announced lengths, nothing after
//!
//! digest (message type 2), 32 bytes (the tree exchange's first round):
//!   0  magic 4, version u16, msg type u16 = 2, seq u64,
//!  16  XXH3-128 of the whole envelope, little-endian
//!
//! slot (message type 3), exactly the channel's slot size (the flat
//! exchange's first round; default DEFAULT_SLOT_BYTES = 4096):
//!   0  magic 4, version u16, msg type u16 = 3, seq u64,
//!  16  XXH3-128 of the whole envelope, little-endian
//!  32  envelope length u32
//!  36  flags u32: 1 = the envelope follows here, 0 = it goes in the second
//!      round (no other value)
//!  40  limit u64: the longest message this rank accepts
//!      (Limits::max_message_bytes); the second round applies every rank's
//!      smallest, so every rank takes the same branch
//!  48  the envelope (when it follows here), then zeros to the slot size
//! ```
//!
//! Magic and version keep their place in every version, so two versions can
//! always tell each other apart and report the mismatch. Version 1's flat
//! exchange began with a 32-byte digest round; version 2 added the slot
//! message, with a second round of variable length; version 3
//! puts every rank's envelope length and limit in its slot, so the second
//! round is one gather of contributions whose lengths every rank knows
//! ([`crate::Transport::all_gather_sized`]: one round on every engine, where
//! a variable-length all_gather is two on NCCL and c10d). A version-1 rank
//! meets a later one with first rounds of different sizes, which the
//! engine's fixed-size gather refuses (a decode error naming the rank on
//! Gloo and in-process; the engine's error or the deadline on c10d and
//! NCCL); versions 2 and 3 meet in a slot of the same size, and every rank
//! reports the version mismatch. Version 4 (this one) keeps version 3's
//! messages and widens what a frame state's scalar atom may hold (floats,
//! bools and big ints besides ints: [`crate::decisions::lattice::Scalar`]),
//! which a version-3 rank could not decode; it meets version 3 in a slot of
//! the same size, and every rank reports the version mismatch.

use crate::error::DecodeError;

/// The four magic bytes that start every message.
pub const MAGIC: [u8; 4] = *b"CCOL";
/// The wire version this build speaks.
pub const WIRE_VERSION: u16 = 4;
/// Length of the fixed envelope header, in bytes.
pub const HEADER_LEN: usize = 32;
/// Length of a digest message, in bytes.
pub const DIGEST_MSG_LEN: usize = 32;

const MSG_ENVELOPE: u16 = 1;
const MSG_DIGEST: u16 = 2;
pub(crate) const MSG_SLOT: u16 = 3;

/// Bytes of a slot message before the inline envelope.
pub const SLOT_HEADER_LEN: usize = 48;
/// The slot size of a channel unless its options say otherwise, in bytes:
/// an envelope of up to 4048 bytes (about 250 tensor sources of a frame
/// state) goes in the first round.
pub const DEFAULT_SLOT_BYTES: usize = 4096;
/// Smallest slot size (a header and a little room), in bytes.
pub const MIN_SLOT_BYTES: usize = 64;
/// Largest slot size, in bytes (1 MiB).
pub const MAX_SLOT_BYTES: usize = 1 << 20;

/// Upper bounds on what a peer's message may make this rank accept or
/// allocate. All in bytes. Built with `Limits::default().with_…`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct Limits {
    /// Largest whole message accepted from a peer, in bytes (default 64 MiB). The
    /// transport refuses longer ones before allocating them.
    pub max_message_bytes: usize,
    /// Largest compile key, in bytes (default 4 KiB).
    pub max_key_bytes: usize,
    /// Largest decision-kind name, in bytes (default 128).
    pub max_kind_bytes: usize,
    /// Largest configuration string, in bytes (default 1 MiB).
    pub max_config_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 64 << 20,
            max_key_bytes: 4 << 10,
            max_kind_bytes: 128,
            max_config_bytes: 1 << 20,
        }
    }
}

/// One rank's contribution to one exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// Wire version ([`WIRE_VERSION`] for envelopes this build makes).
    pub version: u16,
    /// Exchange sequence number on the channel.
    pub seq: u64,
    /// Decision kind ([`crate::Join::KIND`]).
    pub kind: String,
    /// Compile key, e.g. `"train_step@model.rs:88"`.
    pub key: String,
    /// Canonical text of the configuration every rank must share
    /// (per-source overrides, options that shape decisions).
    pub config: String,
    /// Canonical encoding of the decision value.
    pub payload: Vec<u8>,
}

fn u32_len(len: usize, field: &'static str) -> Result<u32, DecodeError> {
    u32::try_from(len).map_err(|_| DecodeError::TooLarge {
        field,
        len: len as u64,
        limit: u64::from(u32::MAX),
    })
}

impl Envelope {
    /// Encodes the envelope (header, then the four fields).
    ///
    /// # Errors
    /// [`DecodeError::TooLarge`] if a field exceeds `limits` (so a rank never
    /// sends what its peers would refuse).
    pub fn encode(&self, limits: &Limits) -> Result<Vec<u8>, DecodeError> {
        check_len("kind", self.kind.len(), limits.max_kind_bytes)?;
        check_len("key", self.key.len(), limits.max_key_bytes)?;
        check_len("config", self.config.len(), limits.max_config_bytes)?;
        let total =
            HEADER_LEN + self.kind.len() + self.key.len() + self.config.len() + self.payload.len();
        check_len("message", total, limits.max_message_bytes)?;
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&MSG_ENVELOPE.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        for (len, field) in [
            (self.kind.len(), "kind"),
            (self.key.len(), "key"),
            (self.config.len(), "config"),
            (self.payload.len(), "payload"),
        ] {
            out.extend_from_slice(&u32_len(len, field)?.to_le_bytes());
        }
        out.extend_from_slice(self.kind.as_bytes());
        out.extend_from_slice(self.key.as_bytes());
        out.extend_from_slice(self.config.as_bytes());
        out.extend_from_slice(&self.payload);
        Ok(out)
    }

    /// Decodes an envelope of this build's wire version.
    ///
    /// Allocates at most `bytes.len()` bytes, which the caller has already
    /// bounded by [`Limits::max_message_bytes`].
    ///
    /// # Errors
    /// Every malformation is a [`DecodeError`]: truncation, trailing bytes,
    /// bad magic, another version or message type, a field over `limits`,
    /// text that is not UTF-8.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Self, DecodeError> {
        let r = EnvelopeRef::decode(bytes, limits)?;
        Ok(Envelope {
            version: r.version,
            seq: r.seq,
            kind: r.kind.to_owned(),
            key: r.key.to_owned(),
            config: r.config.to_owned(),
            payload: r.payload.to_vec(),
        })
    }
}

/// An envelope decoded in place: its fields borrow the received bytes
/// (what the flat exchange reads, allocating nothing per rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvelopeRef<'a> {
    /// Wire version.
    pub version: u16,
    /// Exchange sequence number.
    pub seq: u64,
    /// Decision kind.
    pub kind: &'a str,
    /// Compile key.
    pub key: &'a str,
    /// Configuration text.
    pub config: &'a str,
    /// Payload bytes.
    pub payload: &'a [u8],
}

impl<'a> EnvelopeRef<'a> {
    /// Decodes an envelope of this build's wire version without copying:
    /// the same checks and errors as [`Envelope::decode`].
    ///
    /// # Errors
    /// As [`Envelope::decode`].
    pub fn decode(bytes: &'a [u8], limits: &Limits) -> Result<Self, DecodeError> {
        check_len("message", bytes.len(), limits.max_message_bytes)?;
        let (version, msg_type) = peek_header(bytes)?;
        if version != WIRE_VERSION {
            return Err(DecodeError::Invalid {
                field: "version",
                detail: format!("wire version {version}, this build speaks {WIRE_VERSION}"),
            });
        }
        expect_type(msg_type, MSG_ENVELOPE, "envelope")?;
        at_least(bytes, HEADER_LEN)?;
        let seq = read_u64(bytes, 8);
        let lens = [
            read_u32(bytes, 16) as usize,
            read_u32(bytes, 20) as usize,
            read_u32(bytes, 24) as usize,
            read_u32(bytes, 28) as usize,
        ];
        check_len("kind", lens[0], limits.max_kind_bytes)?;
        check_len("key", lens[1], limits.max_key_bytes)?;
        check_len("config", lens[2], limits.max_config_bytes)?;
        check_len("payload", lens[3], limits.max_message_bytes)?;
        // Each length is at most 4 GiB, so the sum cannot overflow u64/usize on 64-bit;
        // use checked arithmetic anyway for 32-bit targets.
        let needed = lens
            .iter()
            .try_fold(HEADER_LEN, |acc, &l| acc.checked_add(l))
            .ok_or(DecodeError::TooLarge {
                field: "message",
                len: u64::MAX,
                limit: limits.max_message_bytes as u64,
            })?;
        if bytes.len() < needed {
            return Err(DecodeError::Truncated {
                needed,
                got: bytes.len(),
            });
        }
        if bytes.len() > needed {
            return Err(DecodeError::Trailing {
                extra: bytes.len() - needed,
            });
        }
        let mut at = HEADER_LEN;
        let mut take = |len: usize| {
            let s = &bytes[at..at + len];
            at += len;
            s
        };
        let kind = utf8(take(lens[0]), "kind")?;
        let key = utf8(take(lens[1]), "key")?;
        let config = utf8(take(lens[2]), "config")?;
        let payload = take(lens[3]);
        Ok(EnvelopeRef {
            version,
            seq,
            kind,
            key,
            config,
            payload,
        })
    }
}

fn utf8<'a>(b: &'a [u8], field: &'static str) -> Result<&'a str, DecodeError> {
    std::str::from_utf8(b).map_err(|e| DecodeError::Invalid {
        field,
        detail: format!("not UTF-8 ({e})"),
    })
}

/// A message of type `want` (named `name` in the error), else the error.
fn expect_type(msg_type: u16, want: u16, name: &str) -> Result<(), DecodeError> {
    if msg_type == want {
        Ok(())
    } else {
        Err(DecodeError::Invalid {
            field: "message type",
            detail: format!("{msg_type}, expected {want} ({name})"),
        })
    }
}

/// At least `needed` bytes, else [`DecodeError::Truncated`].
fn at_least(bytes: &[u8], needed: usize) -> Result<(), DecodeError> {
    if bytes.len() < needed {
        Err(DecodeError::Truncated {
            needed,
            got: bytes.len(),
        })
    } else {
        Ok(())
    }
}

fn check_len(field: &'static str, len: usize, limit: usize) -> Result<(), DecodeError> {
    if len > limit {
        Err(DecodeError::TooLarge {
            field,
            len: len as u64,
            limit: limit as u64,
        })
    } else {
        Ok(())
    }
}

fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn read_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Reads magic, wire version and message type: the part of the header that
/// every version keeps. Returns `(version, message type)`.
///
/// # Errors
/// [`DecodeError::Truncated`] under 8 bytes, [`DecodeError::BadMagic`].
pub fn peek_header(bytes: &[u8]) -> Result<(u16, u16), DecodeError> {
    if bytes.len() < 8 {
        return Err(DecodeError::Truncated {
            needed: 8,
            got: bytes.len(),
        });
    }
    let mut magic = [0u8; 4];
    magic.copy_from_slice(&bytes[..4]);
    if magic != MAGIC {
        return Err(DecodeError::BadMagic { found: magic });
    }
    Ok((read_u16(bytes, 4), read_u16(bytes, 6)))
}

/// Why this rank's own envelope could not be encoded ([`encode_into`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The payload's encoder failed: its text.
    #[error("invalid payload: {0}")]
    Payload(String),
    /// A field or the whole envelope is over the limits
    /// ([`DecodeError::TooLarge`]).
    #[error(transparent)]
    Field(#[from] DecodeError),
}

/// Appends an envelope to `out` with the payload written by `payload`
/// straight into the same buffer (no intermediate copy): header, kind, key,
/// config, payload. Returns the envelope's length. On an error `out` may
/// hold part of it.
///
/// # Errors
/// [`EncodeError::Field`] when a field or the whole exceeds `limits`;
/// [`EncodeError::Payload`] with `payload`'s error text.
pub fn encode_into(
    out: &mut Vec<u8>,
    seq: u64,
    kind: &str,
    key: &str,
    config: &str,
    limits: &Limits,
    payload: impl FnOnce(&mut Vec<u8>) -> Result<(), String>,
) -> Result<usize, EncodeError> {
    check_len("kind", kind.len(), limits.max_kind_bytes)?;
    check_len("key", key.len(), limits.max_key_bytes)?;
    check_len("config", config.len(), limits.max_config_bytes)?;
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&WIRE_VERSION.to_le_bytes());
    out.extend_from_slice(&MSG_ENVELOPE.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    for (len, field) in [
        (kind.len(), "kind"),
        (key.len(), "key"),
        (config.len(), "config"),
        (0, "payload"),
    ] {
        out.extend_from_slice(&u32_len(len, field)?.to_le_bytes());
    }
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(config.as_bytes());
    let at = out.len();
    payload(out).map_err(EncodeError::Payload)?;
    let total = out.len() - start;
    check_len("message", total, limits.max_message_bytes)?;
    let len = u32_len(out.len() - at, "payload")?;
    out[start + 28..start + 32].copy_from_slice(&len.to_le_bytes());
    Ok(total)
}

/// Writes the 48-byte header of a slot message (see the module docs) into
/// `out[..SLOT_HEADER_LEN]`: the envelope's digest and length, whether it
/// follows inline, and this rank's message limit in bytes.
///
/// # Panics
/// When `out` is shorter than [`SLOT_HEADER_LEN`].
pub fn write_slot_header(
    out: &mut [u8],
    seq: u64,
    digest: &[u8; 16],
    envelope_len: u32,
    inline: bool,
    limit: u64,
) {
    out[..4].copy_from_slice(&MAGIC);
    out[4..6].copy_from_slice(&WIRE_VERSION.to_le_bytes());
    out[6..8].copy_from_slice(&MSG_SLOT.to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    out[16..32].copy_from_slice(digest);
    out[32..36].copy_from_slice(&envelope_len.to_le_bytes());
    out[36..40].copy_from_slice(&u32::from(inline).to_le_bytes());
    out[40..48].copy_from_slice(&limit.to_le_bytes());
}

/// A decoded slot message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotMsg<'a> {
    /// The sender's wire version.
    pub version: u16,
    /// The sender's sequence number.
    pub seq: u64,
    /// The sender's envelope digest.
    pub digest: [u8; 16],
    /// The sender's envelope length, in bytes.
    pub len: u32,
    /// The longest message the sender accepts, in bytes.
    pub limit: u64,
    /// The envelope when it came inline; `None` when it follows in the
    /// second round (or the sender speaks another version).
    pub inline: Option<&'a [u8]>,
}

/// Decodes one rank's slot. A slot of another version decodes as far as its
/// version (the caller reports the mismatch); its other fields are then
/// zero.
///
/// # Errors
/// Shorter than the header, bad magic, wrong message type, flags other than
/// 0 or 1, an inline envelope past the slot's end, or padding that is not
/// zeros.
pub fn decode_slot(bytes: &[u8]) -> Result<SlotMsg<'_>, DecodeError> {
    let (version, msg_type) = peek_header(bytes)?;
    if version != WIRE_VERSION {
        return Ok(SlotMsg {
            version,
            seq: 0,
            digest: [0; 16],
            len: 0,
            limit: 0,
            inline: None,
        });
    }
    expect_type(msg_type, MSG_SLOT, "slot")?;
    at_least(bytes, SLOT_HEADER_LEN)?;
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&bytes[16..32]);
    let len = read_u32(bytes, 32);
    let inline = match read_u32(bytes, 36) {
        0 => None,
        1 => {
            let end = SLOT_HEADER_LEN.checked_add(len as usize);
            match end {
                Some(end) if end <= bytes.len() => Some(&bytes[SLOT_HEADER_LEN..end]),
                _ => {
                    return Err(DecodeError::Invalid {
                        field: "slot",
                        detail: format!(
                            "inline length {len} past the end of a {}-byte slot",
                            bytes.len()
                        ),
                    })
                }
            }
        }
        other => {
            return Err(DecodeError::Invalid {
                field: "slot",
                detail: format!("flags {other:#x}: must be 0 or 1"),
            })
        }
    };
    let used = SLOT_HEADER_LEN + inline.map_or(0, <[u8]>::len);
    // Folded, not short-circuited: one vectorised pass over the padding.
    if bytes[used..].iter().fold(0u8, |acc, &b| acc | b) != 0 {
        return Err(DecodeError::Invalid {
            field: "slot",
            detail: "padding is not zero".into(),
        });
    }
    Ok(SlotMsg {
        version,
        seq: read_u64(bytes, 8),
        digest,
        len,
        limit: read_u64(bytes, 40),
        inline,
    })
}

/// The 128-bit digest of an encoded envelope: XXH3-128, little-endian.
///
/// XXH3 is not cryptographic: it tells honest ranks' envelopes apart (a
/// chance collision is about 2^-64 per pair); it does not defend against a
/// peer that crafts a colliding envelope on purpose.
pub fn digest(encoded_envelope: &[u8]) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(encoded_envelope).to_le_bytes()
}

/// Builds the fixed-size digest message of the fast path.
pub fn encode_digest_msg(version: u16, seq: u64, digest: &[u8; 16]) -> [u8; DIGEST_MSG_LEN] {
    let mut out = [0u8; DIGEST_MSG_LEN];
    out[..4].copy_from_slice(&MAGIC);
    out[4..6].copy_from_slice(&version.to_le_bytes());
    out[6..8].copy_from_slice(&MSG_DIGEST.to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    out[16..].copy_from_slice(digest);
    out
}

/// A decoded digest message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DigestMsg {
    /// The sender's wire version.
    pub version: u16,
    /// The sender's sequence number.
    pub seq: u64,
    /// The sender's envelope digest.
    pub digest: [u8; 16],
}

/// Decodes a digest message. A message of another version decodes as far as
/// its version (the caller reports the mismatch); its other fields are then
/// zero.
///
/// # Errors
/// Wrong length, bad magic, wrong message type.
pub fn decode_digest_msg(bytes: &[u8]) -> Result<DigestMsg, DecodeError> {
    let (version, msg_type) = peek_header(bytes)?;
    if version != WIRE_VERSION {
        return Ok(DigestMsg {
            version,
            seq: 0,
            digest: [0; 16],
        });
    }
    if bytes.len() != DIGEST_MSG_LEN {
        return Err(DecodeError::Invalid {
            field: "digest message",
            detail: format!(
                "{}, expected {DIGEST_MSG_LEN}",
                crate::error::counted(bytes.len(), "byte", "bytes")
            ),
        });
    }
    expect_type(msg_type, MSG_DIGEST, "digest")?;
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&bytes[16..32]);
    Ok(DigestMsg {
        version,
        seq: read_u64(bytes, 8),
        digest,
    })
}

/// Decodes a payload with postcard, requiring every byte to be consumed.
///
/// postcard reads lengths from the input and each element consumes at least
/// one input byte, so allocation stays bounded by the payload's length.
///
/// # Errors
/// [`DecodeError::Payload`] for malformed or trailing bytes.
pub fn decode_postcard<T: serde::de::DeserializeOwned>(
    kind: &str,
    payload: &[u8],
) -> Result<T, DecodeError> {
    match postcard::take_from_bytes::<T>(payload) {
        Ok((v, [])) => Ok(v),
        Ok((_, rest)) => Err(DecodeError::Payload {
            kind: kind.to_owned(),
            detail: crate::error::counted(rest.len(), "trailing byte", "trailing bytes"),
        }),
        Err(e) => Err(DecodeError::Payload {
            kind: kind.to_owned(),
            detail: e.to_string(),
        }),
    }
}
