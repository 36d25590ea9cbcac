//! What every backend needs beyond moving bytes, written once: argument
//! checks with the same messages on every engine, and the variable-length
//! all_gather for engines that only gather equal-sized contributions
//! (NCCL, c10d) — docs/protocol.md: gather lengths, pad, gather — and the store
//! post-mortem ([`PostMortem`]) that names the ranks missing from a failed
//! operation on engines that cannot tell (one key scheme, one set of
//! limits).
//!
//! A backend calls these from its [`Transport`](crate::Transport) methods,
//! so that the same misuse or the same oversized peer gives the same
//! [`Error`] on every engine.

use crate::{Deadline, Error, Result};

mod checks;
mod postmortem;
pub use checks::{check_peer, check_root, check_size, check_sized, shut_down};
pub use postmortem::{
    departure_key, departure_record, parse_departure, Absent, PostMortem, DRAIN_LIMIT,
    LATE_CHECK_IN, POST_MORTEM, STORE_CALL_LIMIT,
};

/// Bytes of one rank's entry in the lengths round: its length and its
/// limit, both `u64` little-endian.
pub const LENGTHS_ENTRY_BYTES: usize = 16;

/// A variable-length all_gather over a fixed-size one: a lengths round in
/// which every rank sends its length **and its limit** (16 bytes), then one
/// round of contributions padded to the longest.
///
/// `gather_fixed(bytes, deadline)` must all_gather equal-sized `bytes` from
/// every rank and return their concatenation, rank 0 first (what
/// [`Transport::all_gather_fixed`](crate::Transport::all_gather_fixed) does).
///
/// Every rank applies the **smallest** limit of all ranks to every length,
/// so every rank takes the same branch: either all gather, or all fail with
/// the same [`Error::message_too_large`] naming the first rank over it —
/// never one rank gathering while another refuses. The padded round is
/// allocated only after that check. Costs two fixed-size gathers (one when
/// every rank sends nothing).
///
/// # Errors
/// [`Error::InvalidArgument`] when `data` is over `max_bytes`;
/// [`Error::Decode`] naming the first rank over the smallest limit, or
/// naming no rank when `gather_fixed` returns a buffer of the wrong size;
/// `gather_fixed`'s errors.
pub fn all_gather_varlen(
    data: &[u8],
    max_bytes: usize,
    deadline: Deadline,
    mut gather_fixed: impl FnMut(&[u8], Deadline) -> Result<Vec<u8>>,
) -> Result<Vec<Vec<u8>>> {
    check_size("all_gather", data.len(), max_bytes)?;
    let mut entry = [0u8; LENGTHS_ENTRY_BYTES];
    entry[..8].copy_from_slice(&(data.len() as u64).to_le_bytes());
    entry[8..].copy_from_slice(&(max_bytes as u64).to_le_bytes());
    let all = gather_fixed(&entry, deadline)?;
    if all.is_empty() || all.len() % LENGTHS_ENTRY_BYTES != 0 {
        return Err(engine_fault(format!(
            "the lengths round returned {} bytes, not a multiple of {LENGTHS_ENTRY_BYTES}",
            all.len()
        )));
    }
    let rows: Vec<(u64, u64)> = all
        .chunks_exact(LENGTHS_ENTRY_BYTES)
        .map(|c| (le_u64(&c[..8]), le_u64(&c[8..])))
        .collect();
    let min_limit = rows.iter().map(|r| r.1).min().unwrap_or(0);
    if let Some((rank, &(len, _))) = rows.iter().enumerate().find(|(_, r)| r.0 > min_limit) {
        return Err(Error::message_too_large(
            u32::try_from(rank).unwrap_or(u32::MAX),
            usize::try_from(len).unwrap_or(usize::MAX),
            usize::try_from(min_limit).unwrap_or(usize::MAX),
        ));
    }
    // Bounded: every length is within every rank's limit, this one's too.
    let lens: Vec<usize> = rows
        .iter()
        .map(|r| usize::try_from(r.0).unwrap_or(max_bytes))
        .collect();
    padded_gather(data, &lens, "padded", |b| gather_fixed(b, deadline))
}

/// The round of a gather whose lengths every rank knows (`lens[r]` is rank
/// `r`'s, `data` this rank's): every contribution padded with zeros to the
/// longest, one `gather_fixed` of the padded buffers (their concatenation,
/// rank 0 first), each rank's part cut back to its length. Nothing is
/// gathered when every length is 0. `round` names the round in the error.
/// Allocates the longest length times the world size: the caller bounds
/// the lengths first.
///
/// # Errors
/// [`Error::Decode`] naming no rank when `gather_fixed` returns a buffer
/// of another size; `gather_fixed`'s errors.
pub(crate) fn padded_gather(
    data: &[u8],
    lens: &[usize],
    round: &str,
    gather_fixed: impl FnOnce(&[u8]) -> Result<Vec<u8>>,
) -> Result<Vec<Vec<u8>>> {
    let longest = lens.iter().copied().max().unwrap_or(0);
    if longest == 0 {
        return Ok(vec![Vec::new(); lens.len()]);
    }
    let mut padded = data.to_vec();
    padded.resize(longest, 0);
    let all = gather_fixed(&padded)?;
    if all.len() != longest * lens.len() {
        return Err(engine_fault(format!(
            "the {round} round returned {} bytes, want {} × {longest}",
            all.len(),
            lens.len()
        )));
    }
    Ok(all
        .chunks_exact(longest)
        .zip(lens)
        .map(|(c, &len)| c[..len].to_vec())
        .collect())
}

/// The engine gathered a buffer of the wrong size: a decode error (no rank
/// to blame).
fn engine_fault(detail: String) -> Error {
    Error::Decode {
        rank: None,
        reason: crate::DecodeError::Invalid {
            field: "gathered buffer",
            detail,
        },
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}
