//! The communicator's bootstrap: rank 0 creates NCCL's 128-byte unique id
//! and publishes it through a core [`Store`]; every other rank fetches it,
//! bounded by a deadline.

use crate::{NcclError, NcclLib};
use compiler_collectives_core::{Deadline, Error, Store};

/// Size of NCCL's unique id in bytes (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// NCCL's unique id: 128 opaque bytes naming one communicator's bootstrap
/// (rank 0's address and a magic). Made by [`NcclLib::unique_id`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId([u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

impl UniqueId {
    pub(crate) fn from_raw(id: &cudarc::nccl::sys::ncclUniqueId) -> Self {
        let mut out = [0u8; UNIQUE_ID_BYTES];
        for (o, c) in out.iter_mut().zip(id.internal.iter()) {
            *o = c.to_ne_bytes()[0];
        }
        UniqueId(out)
    }

    pub(crate) fn to_raw(self) -> cudarc::nccl::sys::ncclUniqueId {
        let mut raw = cudarc::nccl::sys::ncclUniqueId { internal: [0; 128] };
        for (c, b) in raw.internal.iter_mut().zip(self.0.iter()) {
            *c = std::ffi::c_char::from_ne_bytes([*b]);
        }
        raw
    }

    /// The 128 bytes (what goes into the store).
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }

    /// Parses bytes read from a store.
    ///
    /// # Errors
    /// [`NcclError::InvalidId`] unless exactly 128 bytes, not all zero
    /// (an all-zero id is never made by NCCL and means an unset value).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, NcclError> {
        let arr: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            NcclError::InvalidId(format!("{} bytes, expected {UNIQUE_ID_BYTES}", bytes.len()))
        })?;
        if arr.iter().all(|b| *b == 0) {
            return Err(NcclError::InvalidId("all zero".into()));
        }
        Ok(UniqueId(arr))
    }
}

/// Rank 0's half: creates a unique id and sets `key` to it.
///
/// Cost: one `ncclGetUniqueId` (opens NCCL's bootstrap socket; needs no
/// GPU) and one store `set`.
///
/// # Errors
/// NCCL's error as [`Error::Backend`]; the store's errors.
pub fn publish_unique_id(
    lib: &NcclLib,
    store: &dyn Store,
    key: &str,
    deadline: Deadline,
) -> Result<UniqueId, Error> {
    let id = lib.unique_id()?;
    store.set(key, id.as_bytes(), deadline)?;
    Ok(id)
}

/// Every other rank's half: waits for `key` and parses it.
///
/// Cost: one store `get` (waiting until rank 0 has set it).
///
/// # Errors
/// [`Error::Timeout`] naming rank 0 when it has not published by `deadline`;
/// [`Error::Decode`] (from rank 0) when the value is not a unique id.
pub fn fetch_unique_id(
    store: &dyn Store,
    key: &str,
    deadline: Deadline,
) -> Result<UniqueId, Error> {
    let bytes = store.get(key, deadline).map_err(|e| match e {
        Error::Timeout { waited, .. } => Error::timeout(vec![0], Vec::new(), waited),
        other => other,
    })?;
    UniqueId::from_bytes(&bytes).map_err(|e| Error::Decode {
        rank: Some(0),
        reason: compiler_collectives_core::DecodeError::Invalid {
            field: "NCCL unique id",
            detail: e.to_string(),
        },
    })
}
