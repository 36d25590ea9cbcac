//! Argument checks with one message on every engine (the traits' provided
//! methods use them too, so they depend on nothing but the error type).

use crate::error::{Error, Result};

/// `Err(InvalidArgument)` unless `peer` is another rank of a group of
/// `world` (point-to-point to oneself is refused on every engine).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the peer, the group size and this rank.
pub fn check_peer(peer: u32, rank: u32, world: u32) -> Result<()> {
    if peer >= world || peer == rank {
        return Err(Error::InvalidArgument(format!(
            "peer {peer} is not another rank of a group of {world} (this is rank {rank})"
        )));
    }
    Ok(())
}

/// The error of every operation on a transport this rank shut down or
/// aborted: [`Error::ChannelUnusable`] naming the rank, the same on every
/// backend (nothing is sent).
pub fn shut_down(rank: u32) -> Error {
    Error::unusable(
        crate::FirstFailure::Shutdown,
        format!("rank {rank} shut its transport down"),
    )
}

/// `Err(InvalidArgument)` unless `max_bytes` allows this rank's own `len`
/// bytes in `what` (`"all_gather"`, `"broadcast"`, …).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the operation, the length and the limit.
pub fn check_size(what: &str, len: usize, max_bytes: usize) -> Result<()> {
    if len > max_bytes {
        return Err(Error::InvalidArgument(format!(
            "{what} of {len} bytes exceeds max_bytes {max_bytes}"
        )));
    }
    Ok(())
}

/// `Err(InvalidArgument)` unless `lens` holds one length per rank of a
/// group of `world` and `data` has this `rank`'s (the arguments of
/// [`Transport::all_gather_sized`](crate::Transport::all_gather_sized)).
///
/// # Errors
/// [`Error::InvalidArgument`] saying which does not hold.
pub fn check_sized(rank: u32, world: u32, data: &[u8], lens: &[usize]) -> Result<()> {
    if lens.len() != world as usize {
        return Err(Error::InvalidArgument(format!(
            "all_gather_sized: {} lengths for a group of {world}",
            lens.len()
        )));
    }
    match lens.get(rank as usize) {
        Some(&own) if own == data.len() => Ok(()),
        _ => Err(Error::InvalidArgument(format!(
            "all_gather_sized: rank {rank} passes {} bytes where its length says {}",
            data.len(),
            lens.get(rank as usize).copied().unwrap_or(0)
        ))),
    }
}

/// `Err(InvalidArgument)` unless `root` is a rank of a group of `world`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the root and the group size.
pub fn check_root(root: u32, world: u32) -> Result<()> {
    if root >= world {
        return Err(Error::InvalidArgument(format!(
            "broadcast root {root} is not a rank of a group of {world}"
        )));
    }
    Ok(())
}
