//! The transport's wire format: the header every message starts with, and
//! the slots that tell Gloo which receive a send belongs to.
//!
//! A header is 16 bytes, little-endian; a collective's header message also
//! carries the bytes when they fit [`inline_capacity`]:
//!
//! ```text
//!  0        4        8                  16
//!  +--------+--------+------------------+----------------------------+
//!  | magic  | flags  | length (u64)     | inline bytes (collectives) |
//!  | "CCGH" |        | of the payload   | 0..=inline_capacity(world) |
//!  +--------+--------+------------------+----------------------------+
//! ```
//!
//! Gloo matches a receive to a send by peer and slot (a `u64`):
//!
//! | slot | carries | sent by |
//! |---|---|---|
//! | [`header_slot`]`(k)` = `2k` | the header of collective `k` (any flag) | a collective; a leaving rank's notice ([`FLAG_SHUTDOWN`], [`FLAG_ABORT`]); a failed rank's [`FLAG_FAILED`] |
//! | [`data_slot`]`(k)` = `2k + 1` | collective `k`'s bytes that did not fit inline | a collective |
//! | [`p2p_slot`]`(tag, n)` (bit 63 set) | the header of the `n`-th message of `tag` to a peer (always [`FLAG_DATA`]); `+ 1`, its bytes | `send` only |
//! | [`SENTINEL_SLOT`] (`1 << 61`) | nothing: the inbox's standing receive | nobody |
//! | [`probe_slot`]`(k)` (`1 << 62 \| k`) | nothing: a probe for broken pairs | nobody |
//!
//! The sets do not meet for any `k` below `2^60`, so a point-to-point
//! receive only ever matches a point-to-point send.

/// The first four bytes of every header ("CCGH"); zero bytes in a receive
/// place mean its message has not arrived.
const MAGIC: u32 = 0x4847_4343; // "CCGH"
pub(super) const FLAG_DATA: u32 = 0;
pub(super) const FLAG_SHUTDOWN: u32 = 1;
pub(super) const FLAG_ABORT: u32 = 2;
/// "This rank failed in an earlier operation": posted as the header of its
/// next operation, so that a peer that went on to it counts this rank as
/// held up by the same cause, not as missing.
pub(super) const FLAG_FAILED: u32 = 3;
pub(super) const HEADER: usize = 16;
/// The least a collective carries inside its header message (see
/// [`inline_capacity`]): 4 KiB, core's default slot of the one-round
/// exchange, plus room for a small transport-level envelope.
const INLINE_BYTES: usize = 4096 + 64;
/// The most a collective carries inside its header message: 64 KiB, so that
/// the envelopes of core's second round (a frame state of 2000 sources is
/// about 32 KB) also come in one message, into a receive posted ahead.
const INLINE_MAX_BYTES: usize = 64 * 1024;
/// What the inbox may take for inline bytes, all peers together, before a
/// world's inline capacity shrinks below [`INLINE_MAX_BYTES`]: 1 MiB (64 KiB
/// up to 16 ranks, 16 KiB at 64).
const INBOX_BUDGET: usize = 1 << 20;
/// Largest world whose inbox reserves [`INLINE_BYTES`] per peer (the inbox is
/// `world × (16 + inline)` bytes; beyond this, headers only).
const INLINE_MAX_WORLD: u32 = 1024;

/// Bytes of data a collective on a world of `world` ranks sends inside its
/// header message: [`INBOX_BUDGET`] shared by the ranks, within
/// [`INLINE_BYTES`]..=[`INLINE_MAX_BYTES`], up to [`INLINE_MAX_WORLD`]
/// ranks, else none. Every rank computes the same from the world size, so
/// sender and receiver agree without a flag (ranks of one job run one
/// build: the wire version check of the channel's first exchange, whose
/// messages are small, refuses a mix).
pub(super) fn inline_capacity(world: u32) -> usize {
    if world > INLINE_MAX_WORLD {
        return 0;
    }
    let share = INBOX_BUDGET / (world.max(1) as usize);
    share.clamp(INLINE_BYTES, INLINE_MAX_BYTES)
}
const P2P_BIT: u64 = 1 << 63;
/// A slot nobody sends to: the inbox keeps a receive posted on it on every
/// pair, so that a broken pair always has a pending operation to fail.
pub(super) const SENTINEL_SLOT: u64 = 1 << 61;

/// The slot of collective `k`'s header messages.
pub(super) fn header_slot(k: u64) -> u64 {
    2 * k
}

/// The slot of collective `k`'s bytes that did not fit inline.
pub(super) fn data_slot(k: u64) -> u64 {
    2 * k + 1
}

/// The slot of the probes for broken pairs during collective `k`.
pub(super) fn probe_slot(k: u64) -> u64 {
    (1 << 62) | k
}

/// The header slot of the `count`-th point-to-point message of `tag` to
/// one peer (its bytes follow on the next slot).
pub(super) fn p2p_slot(tag: u32, count: u64) -> u64 {
    P2P_BIT | (u64::from(tag) << 31) | ((count & 0x3fff_ffff) << 1)
}

/// A header announcing `len` bytes, with `flags`.
pub(super) fn header(flags: u32, len: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER);
    h.extend_from_slice(&MAGIC.to_le_bytes());
    h.extend_from_slice(&flags.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h
}

/// A parsed header: `None` when its bytes have not arrived (magic still zero).
pub(super) fn parse_header(b: &[u8]) -> Option<(u32, u64)> {
    let mut m = [0u8; 4];
    m.copy_from_slice(&b[0..4]);
    if u32::from_le_bytes(m) != MAGIC {
        return None;
    }
    let mut f = [0u8; 4];
    f.copy_from_slice(&b[4..8]);
    let mut l = [0u8; 8];
    l.copy_from_slice(&b[8..16]);
    Some((u32::from_le_bytes(f), u64::from_le_bytes(l)))
}

#[cfg(test)]
mod tests {
    use super::inline_capacity;

    #[test]
    fn inline_capacity_shares_the_inbox_budget_within_its_bounds() {
        let got: Vec<(u32, usize)> = [1, 2, 16, 17, 32, 64, 252, 253, 1024, 1025]
            .into_iter()
            .map(|w| (w, inline_capacity(w)))
            .collect();
        assert_eq!(
            got,
            [
                (1, 65_536),
                (2, 65_536),
                (16, 65_536),
                (17, 61_680),
                (32, 32_768),
                (64, 16_384),
                (252, 4_161),
                (253, 4_160),
                (1024, 4_160),
                (1025, 0),
            ]
        );
    }
}
