//! All-gathers: lengths that differ per rank, sizes around the limits
//! engines treat specially, empty and fixed-size contributions, lengths
//! every rank knows, and what a transport refuses before sending.

use crate::{ensure, Behaviour, Ctx};
use compiler_collectives_core::Error;

/// This area's behaviours, in [`crate::BEHAVIOURS`]' order.
pub(super) const BEHAVIOURS: &[Behaviour] = &[
    ALL_GATHER_VARLEN,
    ALL_GATHER_SIZES_MIXED,
    ALL_GATHER_EMPTY,
    ALL_GATHER_FIXED,
    ALL_GATHER_SIZED,
];

fn payload_of(rank: u32) -> Vec<u8> {
    // Rank 0 sends nothing; rank r sends 7r bytes of value r.
    vec![u8::try_from(rank % 251).unwrap_or(0); (rank as usize) * 7]
}

behaviour!(ALL_GATHER_VARLEN = all_gather_varlen, min_world: 1, timed: false, needs: []);
fn all_gather_varlen(ctx: &Ctx) -> Result<(), String> {
    let got = ctx
        .transport
        .all_gather(&payload_of(ctx.rank()), 1 << 20, ctx.deadline())
        .map_err(|e| e.to_string())?;
    ensure(got.len() == ctx.world() as usize, || {
        format!("{} buffers for world {}", got.len(), ctx.world())
    })?;
    for (r, buf) in (0u32..).zip(&got) {
        ensure(*buf == payload_of(r), || {
            format!("buffer of rank {r}: {buf:?}")
        })?;
    }
    // This rank's own buffer over its limit: refused before anything is
    // sent, and the transport goes on.
    let own = ctx.transport.all_gather(&[0u8; 9], 8, ctx.deadline());
    ensure(matches!(own, Err(Error::InvalidArgument(_))), || {
        format!("9 bytes with max_bytes 8: {own:?}")
    })?;
    ctx.transport
        .barrier(ctx.deadline())
        .map_err(|e| format!("barrier after a refused all_gather: {e}"))
}

behaviour!(ALL_GATHER_SIZES_MIXED = all_gather_sizes_mixed, min_world: 1, timed: false, needs: []);
/// Buffer sizes on both sides of the limits engines treat specially (Gloo
/// sends up to 64 KiB inside its header message up to 16 ranks, less in
/// larger worlds, down to 4160 bytes; the exchange's slot is 4096), ranks of
/// one collective mixing them: each size in turn, every rank a different one
/// of them in each round.
fn all_gather_sizes_mixed(ctx: &Ctx) -> Result<(), String> {
    const SIZES: [usize; 9] = [0, 1, 4095, 4096, 4160, 4161, 65_536, 65_537, 70_000];
    let fill = |rank: u32, round: usize, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| {
                i.to_le_bytes()[0] ^ rank.to_le_bytes()[0].wrapping_mul(31) ^ round.to_le_bytes()[0]
            })
            .collect()
    };
    let size_of = |rank: u32, round: usize| SIZES[(round + rank as usize) % SIZES.len()];
    for (round, &n) in SIZES.iter().enumerate() {
        let mine = fill(ctx.rank(), round, size_of(ctx.rank(), round));
        let got = ctx
            .transport
            .all_gather(&mine, 1 << 20, ctx.deadline())
            .map_err(|e| format!("round {round}: {e}"))?;
        for (r, buf) in (0u32..).zip(&got) {
            let want = fill(r, round, size_of(r, round));
            ensure(*buf == want, || {
                format!(
                    "round {round}: rank {r}'s {} bytes, want {}",
                    buf.len(),
                    want.len()
                )
            })?;
        }
        let fixed = fill(ctx.rank(), round, n);
        let all = ctx
            .transport
            .all_gather_fixed(&fixed, ctx.deadline())
            .map_err(|e| format!("round {round} (fixed): {e}"))?;
        ensure(all.len() == n * ctx.world() as usize, || {
            format!("round {round} (fixed): {} bytes", all.len())
        })?;
        for r in 0..ctx.world() {
            let at = r as usize * n;
            ensure(all[at..at + n] == fill(r, round, n)[..], || {
                format!("round {round} (fixed): rank {r}'s bytes differ")
            })?;
        }
    }
    Ok(())
}

behaviour!(ALL_GATHER_EMPTY = all_gather_empty, min_world: 1, timed: false, needs: []);
fn all_gather_empty(ctx: &Ctx) -> Result<(), String> {
    let got = ctx
        .transport
        .all_gather(&[], 16, ctx.deadline())
        .map_err(|e| e.to_string())?;
    ensure(
        got.len() == ctx.world() as usize && got.iter().all(Vec::is_empty),
        || format!("{got:?}"),
    )
}

behaviour!(ALL_GATHER_FIXED = all_gather_fixed, min_world: 1, timed: false, needs: []);
fn all_gather_fixed(ctx: &Ctx) -> Result<(), String> {
    let mine = u64::from(ctx.rank())
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .to_le_bytes();
    let got = ctx
        .transport
        .all_gather_fixed(&mine, ctx.deadline())
        .map_err(|e| e.to_string())?;
    ensure(got.len() == 8 * ctx.world() as usize, || {
        format!("{} bytes", got.len())
    })?;
    for (r, chunk) in (0u32..).zip(got.chunks(8)) {
        let want = u64::from(r)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .to_le_bytes();
        ensure(chunk == want, || format!("chunk of rank {r}: {chunk:?}"))?;
    }
    Ok(())
}

behaviour!(ALL_GATHER_SIZED = all_gather_sized, min_world: 1, timed: false, needs: []);
/// Contributions whose lengths every rank knows (the exchange's second
/// round): the sizes of [`all_gather_sizes_mixed`], ranks mixing them, some
/// rounds with every rank empty but one; then lengths that do not fit the
/// call are refused before anything is sent, and the transport goes on.
fn all_gather_sized(ctx: &Ctx) -> Result<(), String> {
    const SIZES: [usize; 7] = [0, 1, 4095, 4096, 4160, 4161, 70_000];
    let world = ctx.world() as usize;
    let fill = |rank: usize, round: usize, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| {
                i.to_le_bytes()[0] ^ rank.to_le_bytes()[0].wrapping_mul(29) ^ round.to_le_bytes()[0]
            })
            .collect()
    };
    for round in 0..2 * SIZES.len() {
        // Odd rounds: only the last rank contributes.
        let lens: Vec<usize> = (0..world)
            .map(|r| {
                let n = SIZES[(round + r) % SIZES.len()];
                if round % 2 == 1 && r + 1 != world {
                    0
                } else {
                    n
                }
            })
            .collect();
        let me = ctx.rank() as usize;
        let got = ctx
            .transport
            .all_gather_sized(&fill(me, round, lens[me]), &lens, ctx.deadline())
            .map_err(|e| format!("round {round} ({lens:?}): {e}"))?;
        ensure(got.len() == world, || {
            format!("round {round}: {} buffers", got.len())
        })?;
        for (r, buf) in got.iter().enumerate() {
            ensure(*buf == fill(r, round, lens[r]), || {
                format!(
                    "round {round}: rank {r}'s {} bytes, want {}",
                    buf.len(),
                    lens[r]
                )
            })?;
        }
    }
    let wrong_count = ctx
        .transport
        .all_gather_sized(&[], &vec![0; world + 1], ctx.deadline());
    let mut lens = vec![3; world];
    let wrong_len = ctx
        .transport
        .all_gather_sized(&[1, 2], &lens, ctx.deadline());
    for (what, r) in [
        ("lengths of another world", wrong_count),
        ("data of another length", wrong_len),
    ] {
        ensure(matches!(r, Err(Error::InvalidArgument(_))), || {
            format!("{what}: {r:?}")
        })?;
    }
    lens[0] = 0;
    let me = ctx.rank() as usize;
    let got = ctx
        .transport
        .all_gather_sized(&fill(me, 99, lens[me]), &lens, ctx.deadline())
        .map_err(|e| format!("after refused calls: {e}"))?;
    ensure(
        got.iter()
            .enumerate()
            .all(|(r, b)| *b == fill(r, 99, lens[r])),
        || format!("after refused calls: {got:?}"),
    )
}
