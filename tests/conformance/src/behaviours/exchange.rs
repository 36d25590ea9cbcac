//! The flat exchange on agreeing ranks: the fast path for identical
//! states, merging differences, sequence numbers that advance.

use super::state;
use crate::{ensure, Behaviour, Ctx};
use compiler_collectives_core::decisions::shapes::FrameState;
use compiler_collectives_core::{decisions::votes::AnyVote, Channel};

/// This area's behaviours, in [`crate::BEHAVIOURS`]' order.
pub(super) const BEHAVIOURS: &[Behaviour] = &[
    EXCHANGE_IDENTICAL_FAST_PATH,
    EXCHANGE_MERGES_DIFFERENCES,
    EXCHANGE_SEQUENCE_ADVANCES,
];

behaviour!(
    EXCHANGE_IDENTICAL_FAST_PATH = exchange_identical_fast_path,
    min_world: 1, timed: false, needs: []
);
fn exchange_identical_fast_path(ctx: &Ctx) -> Result<(), String> {
    let mut ch = ctx.channel(ctx.timeout)?;
    let local = state(16);
    let g = exchange_with_cfg(&mut ch, &local)?;
    ensure(g.fast_path(), || {
        "identical states did not take the fast path".into()
    })?;
    ensure(*g.merged() == local, || format!("merged {:?}", g.merged()))?;
    ensure(g.seq() == 0, || format!("seq {}", g.seq()))
}

/// One exchange of `local` under key `step` with configuration `cfg`.
fn exchange_with_cfg<'a>(
    ch: &mut Channel,
    local: &'a FrameState,
) -> Result<compiler_collectives_core::Gathered<'a, FrameState>, String> {
    ch.exchange_with(
        "step",
        local,
        &compiler_collectives_core::ExchangeOptions::default().with_config("cfg"),
    )
    .map_err(|e| e.to_string())
}

behaviour!(
    EXCHANGE_MERGES_DIFFERENCES = exchange_merges_differences,
    min_world: 2, timed: false, needs: []
);
fn exchange_merges_differences(ctx: &Ctx) -> Result<(), String> {
    let mut ch = ctx.channel(ctx.timeout)?;
    let local = state(5 + u64::from(ctx.rank()));
    let g = exchange_with_cfg(&mut ch, &local)?;
    ensure(!g.fast_path(), || {
        "different states took the fast path".into()
    })?;
    let merged = g.merged();
    ensure(merged.get("x").size.to_string() == "(Dyn,10)", || {
        format!("x = {}", merged.get("x"))
    })?;
    ensure(merged.get("n").scalar.to_string() == "3", || {
        format!("n = {}", merged.get("n"))
    })?;
    let per_rank = g.per_rank().values().ok_or("no per-rank values")?;
    for (r, v) in (0u32..).zip(per_rank) {
        ensure(*v == state(5 + u64::from(r)), || {
            format!("value of rank {r}: {v:?}")
        })?;
    }
    Ok(())
}

behaviour!(
    EXCHANGE_SEQUENCE_ADVANCES = exchange_sequence_advances,
    min_world: 1, timed: false, needs: []
);
fn exchange_sequence_advances(ctx: &Ctx) -> Result<(), String> {
    let mut ch = ctx.channel(ctx.timeout)?;
    for i in 0..4u64 {
        let vote = AnyVote(ctx.rank() == 0 && i == 2);
        let g = ch.exchange("vote", &vote).map_err(|e| e.to_string())?;
        ensure(g.seq() == i, || format!("seq {} at exchange {i}", g.seq()))?;
        ensure(g.any() == (i == 2), || {
            format!("vote {i}: {:?}", g.merged())
        })?;
        ensure(ch.last_completed() == Some(i), || {
            format!("last completed {:?}", ch.last_completed())
        })?;
    }
    Ok(())
}
