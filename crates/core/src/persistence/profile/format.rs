//! The profile file format (drawn in the [module documentation](super)): a
//! 32-byte header then a canonical postcard body, written by
//! [`Profile::encode`] and read strictly, within [`ProfileLimits`], by
//! [`Profile::decode`] (the fuzzing entry point).

use super::{Profile, ProfileKey, ProfileValue};
use crate::error::{DecodeError, Error};
use crate::protocol::join::Join;
use std::collections::BTreeMap;

/// The eight bytes that start every profile file.
pub const PROFILE_MAGIC: [u8; 8] = *b"CCOLPGO\0";
/// The profile file version this build reads and writes.
pub const PROFILE_VERSION: u16 = 1;
/// Length of the fixed file header, in bytes.
pub const PROFILE_HEADER_LEN: usize = 32;

/// Bounds on what a profile file may make a reader accept. Built with
/// `ProfileLimits::default().with_…`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct ProfileLimits {
    /// Largest body, in bytes (default 64 MiB).
    pub max_body_bytes: usize,
    /// Most entries, a count (default 1 048 576).
    pub max_entries: usize,
}

impl Default for ProfileLimits {
    fn default() -> Self {
        ProfileLimits {
            max_body_bytes: 64 << 20,
            max_entries: 1 << 20,
        }
    }
}
impl Profile {
    /// The file bytes: header then canonical postcard body (see the [module docs](super)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the body is over 4 GiB.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let body = postcard::to_allocvec(&self.entries)
            .map_err(|e| Error::InvalidArgument(format!("cannot encode the profile: {e}")))?;
        let len = u32::try_from(body.len()).map_err(|_| {
            Error::InvalidArgument(format!(
                "profile body of {} bytes is over 4 GiB",
                body.len()
            ))
        })?;
        let mut out = Vec::with_capacity(PROFILE_HEADER_LEN + body.len());
        out.extend_from_slice(&PROFILE_MAGIC);
        out.extend_from_slice(&PROFILE_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(&body).to_le_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Decodes profile file bytes strictly: magic, version, flags, exact
    /// length, checksum, a body that decodes completely, at most
    /// `limits.max_entries` entries, each kind matching its value, and a
    /// canonical body. Allocation is bounded by the input length; a body
    /// declaring more than `limits.max_entries` entries is refused before they
    /// are decoded.
    ///
    /// # Errors
    /// [`DecodeError`] saying which check failed.
    pub fn decode(bytes: &[u8], limits: &ProfileLimits) -> Result<Profile, DecodeError> {
        if bytes.len() < PROFILE_HEADER_LEN {
            return Err(DecodeError::Truncated {
                needed: PROFILE_HEADER_LEN,
                got: bytes.len(),
            });
        }
        if bytes[..8] != PROFILE_MAGIC {
            return Err(DecodeError::Invalid {
                field: "magic",
                detail: format!("{:02x?} is not a compiler-collectives profile", &bytes[..8]),
            });
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != PROFILE_VERSION {
            return Err(DecodeError::Invalid {
                field: "version",
                detail: format!(
                    "profile version {version}; this build reads version {PROFILE_VERSION}"
                ),
            });
        }
        let flags = u16::from_le_bytes([bytes[10], bytes[11]]);
        if flags != 0 {
            return Err(DecodeError::Invalid {
                field: "flags",
                detail: format!("{flags:#06x}, expected 0"),
            });
        }
        let len = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
        if len > limits.max_body_bytes {
            return Err(DecodeError::TooLarge {
                field: "profile body",
                len: len as u64,
                limit: limits.max_body_bytes as u64,
            });
        }
        let body = &bytes[PROFILE_HEADER_LEN..];
        if body.len() < len {
            return Err(DecodeError::Truncated {
                needed: PROFILE_HEADER_LEN + len,
                got: bytes.len(),
            });
        }
        if body.len() > len {
            return Err(DecodeError::Trailing {
                extra: body.len() - len,
            });
        }
        if xxhash_rust::xxh3::xxh3_128(body).to_le_bytes()[..] != bytes[16..32] {
            return Err(DecodeError::Invalid {
                field: "checksum",
                detail: "the body does not match its checksum (corrupt file)".into(),
            });
        }
        // The body starts with the entry count (a postcard varint): refuse
        // too many before decoding them, which takes ~16 times the body's size.
        let (count, _) =
            postcard::take_from_bytes::<u64>(body).map_err(|e| DecodeError::Payload {
                kind: Profile::KIND.to_owned(),
                detail: e.to_string(),
            })?;
        if count > limits.max_entries as u64 {
            return Err(DecodeError::Invalid {
                field: "profile entries",
                detail: format!("{count} entries, over the limit of {}", limits.max_entries),
            });
        }
        let entries: BTreeMap<ProfileKey, ProfileValue> =
            crate::protocol::envelope::decode_postcard(Profile::KIND, body)?;
        if let Some((k, v)) = entries.iter().find(|(k, v)| k.kind != v.kind()) {
            return Err(DecodeError::Invalid {
                field: "entry kind",
                detail: format!(
                    "entry '{}' says kind '{}' but holds '{}'",
                    k.key,
                    k.kind,
                    v.kind()
                ),
            });
        }
        let canonical = postcard::to_allocvec(&entries).map_err(|e| DecodeError::Invalid {
            field: "body",
            detail: e.to_string(),
        })?;
        if canonical != body {
            return Err(DecodeError::Invalid {
                field: "body",
                detail: "not in canonical form (entries unsorted or repeated)".into(),
            });
        }
        Ok(Profile { entries })
    }
}
