//! Deadlines and faults: a slow rank inside the deadline is no error, a
//! channel is unusable after an error, a rank that never arrives times out
//! by name within the deadline + margin.

use super::state;
use crate::{ensure, Behaviour, Ctx};
use compiler_collectives_core::{decisions::votes::AnyVote, Error};
use std::time::{Duration, Instant};

/// This area's behaviours, in [`crate::BEHAVIOURS`]' order.
pub(super) const BEHAVIOURS: &[Behaviour] = &[
    SLOW_RANK_WITHIN_DEADLINE,
    UNUSABLE_AFTER_ERROR,
    MISSING_RANK_TIMES_OUT,
];

behaviour!(
    SLOW_RANK_WITHIN_DEADLINE = slow_rank_within_deadline,
    min_world: 2, timed: true, needs: []
);
/// The last rank arrives at exchange #1 two thirds of the way into the
/// short deadline: a slow rank inside the deadline is no error, and the
/// others really waited for it.
fn slow_rank_within_deadline(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.short_timeout)?;
    ch.exchange("f", &state(4)).map_err(|e| e.to_string())?;
    let delay = ctx.short_timeout * 2 / 3;
    if ctx.rank() == odd {
        std::thread::sleep(delay);
    }
    let start = Instant::now();
    let mine = state(4 + u64::from(ctx.rank()));
    let g = ch.exchange("f", &mine).map_err(|e| {
        format!(
            "a rank {delay:?} late inside a {:?} deadline: {e}",
            ctx.short_timeout
        )
    })?;
    let took = start.elapsed();
    ensure(g.merged().get("x").size.to_string() == "(Dyn,10)", || {
        format!("x = {}", g.merged().get("x"))
    })?;
    ensure(
        ctx.rank() == odd || took + Duration::from_millis(100) >= delay,
        || {
            format!(
                "rank {} returned after {took:?}, before the slow rank arrived",
                ctx.rank()
            )
        },
    )
}

behaviour!(UNUSABLE_AFTER_ERROR = unusable_after_error, min_world: 2, timed: false, needs: []);
fn unusable_after_error(ctx: &Ctx) -> Result<(), String> {
    let key = if ctx.rank() == 0 { "a" } else { "b" };
    let mut ch = ctx.channel(ctx.timeout)?;
    let first = ch.exchange(key, &AnyVote(false));
    ensure(matches!(first, Err(Error::Desync { .. })), || {
        format!("{first:?}")
    })?;
    let second = ch.exchange("a", &AnyVote(false));
    ensure(matches!(second, Err(Error::ChannelUnusable { .. })), || {
        format!("{second:?}")
    })
}

behaviour!(
    MISSING_RANK_TIMES_OUT = missing_rank_times_out,
    min_world: 2, timed: true, needs: [NamesMissingRanks]
);
/// The last rank never arrives at exchange #1 (it stays alive, silent, past
/// the deadline): the others get a timeout naming it, within deadline + margin.
fn missing_rank_times_out(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.short_timeout)?;
    ch.exchange("f", &AnyVote(false))
        .map_err(|e| e.to_string())?;
    if ctx.rank() == odd {
        std::thread::sleep(ctx.short_timeout + ctx.margin + Duration::from_millis(500));
        ch.abort();
        return Ok(());
    }
    let start = Instant::now();
    let res = ch.exchange("f", &AnyVote(false));
    let took = start.elapsed();
    match res {
        Err(Error::Timeout {
            missing_ranks,
            during: Some(info),
            ..
        }) => {
            ensure(missing_ranks == vec![odd], || {
                format!("missing {missing_ranks:?}, want [{odd}]")
            })?;
            ensure(info.seq == 1 && info.last_completed == Some(0), || {
                format!("{info}")
            })?;
            ensure(
                took >= ctx.short_timeout && took <= ctx.short_timeout + ctx.margin,
                || format!("failed after {took:?}, deadline {:?}", ctx.short_timeout),
            )
        }
        other => Err(format!(
            "expected a timeout naming rank {odd}, got {other:?}"
        )),
    }
}
